"""Serving answers: cached hits and coalesced answers as JSON or replayed as server-sent events,
and the assembler that turns a relayed upstream stream back into one completion."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from app.cache.base import CacheHit
from app.chat import ChatResult, Outcome
from app.metrics import Metrics
from app.wire import (
    SSE_DONE,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    ChunkDelta,
    chunk_view_decoder,
    completion_decoder,
    json_encoder,
)

_HIT_OUTCOMES = {"exact": Outcome.EXACT_HIT, "semantic": Outcome.SEMANTIC_HIT}


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def refresh_identity(completion: dict[str, Any]) -> dict[str, Any]:
    """A cached completion with a fresh ``id`` and ``created``, as a new response must have."""
    completion["id"] = new_completion_id()
    completion["created"] = int(time.time())
    return completion


def replay_chunks(completion: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """Replay a complete answer as the SSE events a streaming upstream would have sent.

    Args:
        completion: The completion (with its fresh identity).
        include_usage: Whether the client asked for a final usage chunk.

    Yields:
        SSE events, ending with ``data: [DONE]``.
    """
    identity = {"id": completion["id"], "created": completion["created"], "model": completion.get("model", "")}
    for choice in completion.get("choices", []):
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        role = message.get("role", "assistant")
        first = ChunkChoice(index=index, delta=ChunkDelta(role=role, content=""))
        yield sse_event(json_encoder.encode(ChatCompletionChunk(**identity, choices=[first])))
        content = message.get("content")
        if content:
            body = ChunkChoice(index=index, delta=ChunkDelta(content=content))
            yield sse_event(json_encoder.encode(ChatCompletionChunk(**identity, choices=[body])))
        last = ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=choice.get("finish_reason", "stop"))
        yield sse_event(json_encoder.encode(ChatCompletionChunk(**identity, choices=[last])))
    if include_usage and completion.get("usage") is not None:
        yield sse_event(json_encoder.encode(ChatCompletionChunk(**identity, choices=[], usage=completion["usage"])))
    yield sse_event(SSE_DONE)


def serve_hit(hit: CacheHit, request: ChatCompletionRequest, started: float, metrics: Metrics,
              coalesced: bool = False, category: str | None = None) -> ChatResult:
    """A cached (or coalesced) answer as the response the request asked for: JSON or SSE.

    Args:
        hit: The hit; lookups hand it over decoded, a coalesced answer is decoded here.
        request: The request it answers.
        started: When the request arrived (``perf_counter``), for the latency metric.
        metrics: Where the outcome is counted.
        coalesced: Whether the answer is another request's (single flight).
        category: The request's cache category, for the per-category counts.
    """
    outcome = _HIT_OUTCOMES[hit.layer]
    decoded = hit.decoded if hit.decoded is not None else completion_decoder.decode(hit.completion)
    completion = refresh_identity(decoded)
    if hit.source == "faq":
        completion["model"] = request.model  # an operator's answer, in the shape the request expects
    headers = {"X-Cache": outcome.value, "X-Cache-Source": hit.source}
    if hit.similarity is not None:
        headers["X-Cache-Similarity"] = f"{hit.similarity:.3f}"
    if hit.reason is not None:
        headers["X-Cache-Verdict"] = hit.reason
    if coalesced:
        headers["X-Cache-Coalesced"] = "true"
    metrics.finish(outcome, started, category)
    if request.stream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = replay_chunks(completion, include_usage=include_usage)
        return ChatResult(outcome=outcome, headers=headers, stream=_iterate(events))
    return ChatResult(outcome=outcome, headers=headers, body=json_encoder.encode(completion))


async def _iterate(events: Iterable[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


class StreamAssembler:
    """Collects upstream chunks into the completion they add up to."""

    def __init__(self) -> None:
        self._id = ""
        self._created = 0
        self._model = ""
        self._roles: dict[int, str] = {}
        self._parts: dict[int, list[str]] = {}
        self._finish: dict[int, str | None] = {}
        self._tool_calls = False
        self.usage: dict[str, Any] | None = None

    def add(self, payload: bytes) -> None:
        chunk = chunk_view_decoder.decode(payload)
        self._id = self._id or chunk.id
        self._created = self._created or chunk.created
        self._model = self._model or chunk.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                self._roles[choice.index] = choice.delta.role
            if choice.delta.content:
                self._parts.setdefault(choice.index, []).append(choice.delta.content)
            if choice.delta.tool_calls:
                self._tool_calls = True
            if choice.finish_reason is not None or choice.index not in self._finish:
                self._finish[choice.index] = choice.finish_reason

    @property
    def complete(self) -> bool:
        """Every choice finished with ``stop`` and carried plain content: safe to cache."""
        return bool(self._finish) and not self._tool_calls and all(r == "stop" for r in self._finish.values())

    def completion(self) -> dict[str, Any]:
        choices = [
            {
                "index": index,
                "message": {"role": self._roles.get(index, "assistant"), "content": "".join(self._parts.get(index, []))},
                "logprobs": None,
                "finish_reason": self._finish[index],
            }
            for index in sorted(self._finish)
        ]
        completion: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if self.usage is not None:
            completion["usage"] = self.usage
        return completion
