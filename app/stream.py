"""Serving answers: cached hits and coalesced answers as JSON or replayed as server-sent events,
and the assembler that turns a relayed upstream stream back into one completion."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from app.cache.storage.contract import CacheHit
from app.chat import ChatResult, Outcome
from app.metrics import Metrics
from app.wire import (
    SSE_DONE,
    ChatCompletionChunkView,
    ChatCompletionRequest,
    chunk_view_decoder,
    completion_decoder,
    json_encoder,
)

CHUNK_OBJECT = "chat.completion.chunk"

_HIT_OUTCOMES = {"exact": Outcome.EXACT_HIT, "semantic": Outcome.SEMANTIC_HIT}


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


# The id of a hit's response, also in its body (``id``): what ``POST /v1/feedback`` names.
RESPONSE_ID_HEADER = "X-Cache-Response-Id"


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def refresh_identity(completion: dict[str, Any], response_id: str | None = None) -> dict[str, Any]:
    """A cached completion with a fresh ``id`` (``response_id``, or a new one) and ``created``,
    as a new response must have."""
    completion["id"] = response_id or new_completion_id()
    completion["created"] = int(time.time())
    return completion


def replay_chunks(completion: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """Replay a complete answer as the SSE events a streaming model server would have sent: per
    choice its role, its content with the content's logprobs, its refusal, each tool call (id, type
    and name, then its arguments, as vLLM sends them), its finish reason; the usage chunk when the
    client asked for one. Every chunk is a full ``chat.completion.chunk`` (the openai SDK's
    ``.stream()`` helper checks ``object``).

    Args:
        completion: The completion (with its fresh identity).
        include_usage: Whether the client asked for a final usage chunk.

    Yields:
        SSE events, ending with ``data: [DONE]``.
    """
    head: dict[str, Any] = {"id": completion["id"], "object": CHUNK_OBJECT, "created": completion["created"],
                            "model": completion.get("model", "")}
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]

    def chunk(index: int, delta: dict[str, Any], *, logprobs: Any = None, finish: str | None = None,
              extra: dict[str, Any] | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **(extra or {})}
        return sse_event(json_encoder.encode({**head, "choices": [choice]}))

    for position, choice in enumerate(completion.get("choices") or []):
        index = choice.get("index", position)
        message = choice.get("message") or {}
        logprobs = choice.get("logprobs") or {}
        yield chunk(index, {"role": message.get("role", "assistant"), "content": ""})
        if message.get("reasoning_content"):
            yield chunk(index, {"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            content_logprobs = {"content": logprobs["content"], "refusal": None} if logprobs.get("content") else None
            yield chunk(index, {"content": message["content"]}, logprobs=content_logprobs)
        if message.get("refusal"):
            refusal_logprobs = {"content": None, "refusal": logprobs["refusal"]} if logprobs.get("refusal") else None
            yield chunk(index, {"refusal": message["refusal"]}, logprobs=refusal_logprobs)
        for call_index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            opening = {"index": call_index, "id": call.get("id"), "type": call.get("type", "function"),
                       "function": {"name": function.get("name"), "arguments": ""}}
            yield chunk(index, {"tool_calls": [opening]})
            if function.get("arguments"):
                yield chunk(index, {"tool_calls": [{"index": call_index, "function": {"arguments": function["arguments"]}}]})
        extra = {"stop_reason": choice["stop_reason"]} if "stop_reason" in choice else None
        yield chunk(index, {}, finish=choice.get("finish_reason", "stop"), extra=extra)
    if include_usage and completion.get("usage") is not None:
        yield sse_event(json_encoder.encode({**head, "choices": [], "usage": completion["usage"]}))
    yield sse_event(SSE_DONE)


def serve_hit(hit: CacheHit, request: ChatCompletionRequest, started: float, metrics: Metrics,
              coalesced: bool = False, category: str | None = None, response_id: str | None = None,
              tenant: str | None = None) -> ChatResult:
    """A cached (or coalesced) answer as the response the request asked for: JSON or SSE.

    Args:
        hit: The hit; lookups hand it over decoded, a coalesced answer is decoded here.
        request: The request it answers.
        started: When the request arrived (``perf_counter``), for the latency metric.
        metrics: Where the outcome is counted.
        coalesced: Whether the answer is another request's (single flight).
        category: The request's cache category, for the per-category counts.
        response_id: The response's id (a hit's names its record for feedback); a new one if omitted.
        tenant: The request's tenant, for the per-tenant counts.
    """
    outcome = _HIT_OUTCOMES[hit.layer]
    decoded = hit.decoded if hit.decoded is not None else completion_decoder.decode(hit.completion)
    completion = refresh_identity(decoded, response_id)
    if hit.source == "faq":
        completion["model"] = request.model  # an operator's answer, in the shape the request expects
    headers = {"X-Cache": outcome.value, "X-Cache-Source": hit.source}
    if response_id is not None:
        headers[RESPONSE_ID_HEADER] = response_id
    if hit.similarity is not None:
        headers["X-Cache-Similarity"] = f"{hit.similarity:.3f}"
    if hit.reason is not None:
        headers["X-Cache-Verdict"] = hit.reason
    if coalesced:
        headers["X-Cache-Coalesced"] = "true"
    metrics.finish(outcome, started, category, tenant=tenant, curated=hit.source == "faq", coalesced=coalesced)
    if request.stream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = replay_chunks(completion, include_usage=include_usage)
        return ChatResult(outcome=outcome, headers=headers, stream=_iterate(events))
    return ChatResult(outcome=outcome, headers=headers, body=json_encoder.encode(completion))


async def _iterate(events: Iterable[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


class _ChoiceParts:
    """What the chunks of one choice said so far."""

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.arguments: dict[int, list[str]] = {}
        self.content_logprobs: list[Any] = []
        self.refusal_logprobs: list[Any] = []
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.has_stop_reason = False

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role,
                                   "content": "".join(self.content) if self.content or not self.calls else None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": "".join(self.arguments.get(i, []))}}
                for i, call in sorted(self.calls.items())
            ]
        return message


class StreamAssembler:
    """Collects upstream chunks into the completion they add up to: content, refusal, reasoning,
    tool calls (merged by index, arguments joined), logprobs, finish and stop reasons, the system
    fingerprint and usage; so that what a stream stored replays, as JSON or SSE, as it came."""

    def __init__(self) -> None:
        self._id = ""
        self._created = 0
        self._model = ""
        self._fingerprint: str | None = None
        self._choices: dict[int, _ChoiceParts] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, payload: bytes) -> ChatCompletionChunkView:
        """Add one chunk's payload; returns it decoded.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError: Not a chat completion chunk.
        """
        chunk = chunk_view_decoder.decode(payload)
        self._id = self._id or chunk.id
        self._created = self._created or chunk.created
        self._model = self._model or chunk.model
        self._fingerprint = self._fingerprint or chunk.system_fingerprint
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            parts = self._choices.setdefault(choice.index, _ChoiceParts())
            delta = choice.delta
            if delta.role:
                parts.role = delta.role
            if delta.content:
                parts.content.append(delta.content)
            if delta.refusal:
                parts.refusal.append(delta.refusal)
            if delta.reasoning_content:
                parts.reasoning.append(delta.reasoning_content)
            for position, call in enumerate(delta.tool_calls or []):
                self._add_call(parts, call, position)
            if choice.logprobs:
                parts.content_logprobs += choice.logprobs.get("content") or []
                parts.refusal_logprobs += choice.logprobs.get("refusal") or []
            if choice.finish_reason is not None:
                parts.finish = choice.finish_reason
            if choice.stop_reason is not None or choice.finish_reason is not None:
                parts.stop_reason, parts.has_stop_reason = choice.stop_reason, True
        return chunk

    @staticmethod
    def _add_call(parts: _ChoiceParts, call: dict[str, Any], position: int) -> None:
        index = call.get("index", position)
        known = parts.calls.setdefault(index, {"id": None, "type": "function", "function": {"name": None}})
        function = call.get("function") or {}
        if call.get("id"):
            known["id"] = call["id"]
        if call.get("type"):
            known["type"] = call["type"]
        if function.get("name"):
            known["function"]["name"] = function["name"]
        if function.get("arguments"):
            parts.arguments.setdefault(index, []).append(function["arguments"])

    @property
    def finished(self) -> bool:
        """Every choice reached a finish reason (whatever it was)."""
        return bool(self._choices) and all(p.finish is not None for p in self._choices.values())

    @property
    def complete(self) -> bool:
        """Every choice finished, with ``stop`` or a call of tools: a whole answer."""
        return bool(self._choices) and all(p.finish in ("stop", "tool_calls") for p in self._choices.values())

    def completion(self) -> dict[str, Any]:
        choices = []
        for index, parts in sorted(self._choices.items()):
            logprobs = ({"content": parts.content_logprobs or None, "refusal": parts.refusal_logprobs or None}
                        if parts.content_logprobs or parts.refusal_logprobs else None)
            choice: dict[str, Any] = {"index": index, "message": parts.message(), "logprobs": logprobs,
                                      "finish_reason": parts.finish}
            if parts.has_stop_reason:
                choice["stop_reason"] = parts.stop_reason
            choices.append(choice)
        completion: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if self._fingerprint is not None:
            completion["system_fingerprint"] = self._fingerprint
        if self.usage is not None:
            completion["usage"] = self.usage
        return completion
