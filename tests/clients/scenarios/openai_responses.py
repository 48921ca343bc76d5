"""The openai SDK's Responses API (2.x or 3.x) against Strata: every call twice, a miss then a hit,
through the SDK's own helpers (``responses.stream()`` checks the event sequence it accumulates)."""

from __future__ import annotations

import openai
from common import MODEL, STRATA, cases, done, twice
from pydantic import BaseModel

client = openai.OpenAI(base_url=STRATA + "/v1", api_key="sk-test", max_retries=0)
INSTRUCTIONS = "You are a support bot. Answer briefly."
TRACK = [{"type": "function", "name": "track", "description": "Track a parcel", "strict": False,
          "parameters": {"type": "object", "properties": {"parcel": {"type": "string"}}, "required": ["parcel"]}}]


class Capital(BaseModel):
    city: str
    country: str


def shown(response: object) -> dict:
    """What a client reads of a response: its text, items, status and usage (ids aside)."""
    return {"output_text": response.output_text, "status": response.status,
            "output": [item.model_dump(exclude={"id"}) for item in response.output],
            "usage": response.usage.model_dump() if response.usage else None}


def created(text: str, **extra: object) -> tuple[dict, str | None]:
    raw = client.responses.with_raw_response.create(model=MODEL, instructions=INSTRUCTIONS, input=text, **extra)
    return shown(raw.parse()), raw.headers.get("x-cache")


def streamed(text: str, **extra: object) -> tuple[dict, str | None]:
    with client.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input=text, **extra) as stream:
        kinds: list[str] = []
        for event in stream:
            if event.type not in kinds:  # in order of first appearance: a hit replays in fewer deltas
                kinds.append(event.type)
        final = stream.get_final_response()
    return {**shown(final), "events": kinds}, None


def parsed(text: str) -> tuple[dict, str | None]:
    raw = client.responses.with_raw_response.parse(model=MODEL, input=text, text_format=Capital)
    response = raw.parse()
    return {"parsed": response.output_parsed.model_dump(), **shown(response)}, raw.headers.get("x-cache")


def items(text: str) -> tuple[dict, str | None]:
    conversation = [{"role": "user", "content": [{"type": "input_text", "text": text}]},
                    {"type": "function_call", "call_id": "call_7", "name": "track", "arguments": '{"parcel": "7"}'},
                    {"type": "function_call_output", "call_id": "call_7", "output": "in Oslo"}]
    raw = client.responses.with_raw_response.create(model=MODEL, input=conversation, tools=TRACK)
    return shown(raw.parse()), raw.headers.get("x-cache")


twice("responses_create", lambda: created("What is the capital of France?"))
twice("responses_stream_helper", lambda: streamed("Tell me about Lyon."))
twice("responses_parse", lambda: parsed("Which is the capital of Spain?"))
twice("responses_named_tool", lambda: created("Where is parcel 12?", tools=TRACK,
                                              tool_choice={"type": "function", "name": "track"}))
twice("responses_stream_named_tool", lambda: streamed("Where is parcel 13?", tools=TRACK,
                                                      tool_choice={"type": "function", "name": "track"}))
twice("responses_tool_result_items", lambda: items("Where is parcel 7?"))


def error_of(model: str) -> dict:
    try:
        client.responses.create(model=model, input="hello")
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return {"class": type(exc).__name__, "status": exc.status_code, "body": body.get("error", body)}
    return {"class": None}


for model in ("missing-model", "limited-model"):
    cases[f"value_error_{model}"] = {"value": error_of(model)}
done()
