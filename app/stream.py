"""Server-sent events: replaying a cached answer as chunks, and relaying an upstream stream
while assembling the complete answer for write-back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec

from app.wire import ChatCompletionChunk, ChunkChoice, ChunkDelta, completion_decoder, json_encoder

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def decode_completion(stored: bytes) -> dict[str, Any] | None:
    """A stored answer as a completion, or ``None`` when it is not one (a hand-edited entry)."""
    try:
        completion = completion_decoder.decode(stored)
        message = completion["choices"][0]["message"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return None
    return completion if isinstance(message, dict) else None


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
    yield SSE_DONE


class _Delta(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta = msgspec.field(default_factory=_Delta)
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: dict[str, Any] | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)


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
        chunk = _chunk_decoder.decode(payload)
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
