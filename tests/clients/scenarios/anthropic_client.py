"""The anthropic SDK against Strata's ``/v1/messages``: every call twice, a miss then a hit, through
the SDK's own helpers (``messages.stream()`` accumulates the event sequence and checks its order)."""

from __future__ import annotations

import anthropic
from common import MODEL, STRATA, cases, done, twice

client = anthropic.Anthropic(base_url=STRATA, api_key="sk-test", max_retries=0)
SYSTEM = [{"type": "text", "text": "You are a support bot. Answer briefly.", "cache_control": {"type": "ephemeral"}}]
TRACK = [{"name": "track", "description": "Track a parcel",
          "input_schema": {"type": "object", "properties": {"parcel": {"type": "string"}}, "required": ["parcel"]}}]


def shown(message: anthropic.types.Message) -> dict:
    return {"content": [block.model_dump() for block in message.content], "stop_reason": message.stop_reason,
            "stop_sequence": message.stop_sequence, "usage": message.usage.model_dump(), "model": message.model}


def created(text: str, **extra: object) -> tuple[dict, str | None]:
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64, system=SYSTEM,
                                                   messages=[{"role": "user", "content": text}], **extra)
    return shown(raw.parse()), raw.headers.get("x-cache")


def streamed(text: str, **extra: object) -> tuple[dict, str | None]:
    with client.messages.stream(model=MODEL, max_tokens=64, system=SYSTEM,
                                messages=[{"role": "user", "content": text}], **extra) as stream:
        kinds: list[str] = []
        for event in stream:
            if event.type not in kinds:  # in order of first appearance: a hit replays in fewer deltas
                kinds.append(event.type)
        final = stream.get_final_message()
    return {**shown(final), "events": kinds}, None


twice("messages", lambda: created("What is the capital of France?"))
twice("messages_stream_helper", lambda: streamed("Tell me about Lyon."))
twice("messages_named_tool", lambda: created("Where is parcel 12?", tools=TRACK, tool_choice={"type": "tool", "name": "track"}))
twice("messages_stream_named_tool", lambda: streamed("Where is parcel 13?", tools=TRACK,
                                                     tool_choice={"type": "tool", "name": "track"}))


def error_of(model: str) -> dict:
    try:
        client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "hello"}])
    except anthropic.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return {"class": type(exc).__name__, "status": exc.status_code, "body": body}
    return {"class": None}


for model in ("missing-model", "limited-model"):
    cases[f"value_error_{model}"] = {"value": error_of(model)}
done()
