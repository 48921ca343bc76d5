"""The OpenAI wire format: the request fields Strata validates, and what it sends back.

Validation happens here, at the boundary, once. Fields that Strata does not use are not
declared: they stay in the raw request mapping and are passed through to the upstream.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a multi-part message content (text, image_url, ...)."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


PositiveInt = Annotated[int, Meta(ge=1)]


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The validated view of ``POST /v1/chat/completions``."""

    model: Annotated[str, Meta(min_length=1)]
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None


# --- responses -------------------------------------------------------------------------------


class ChunkDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChunkDelta
    logprobs: Any = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: str = "chat.completion.chunk"
    usage: dict[str, Any] | None = None


# Decoding views of upstream chunks: only what assembling a completion needs, lenient defaults.
class ChunkDeltaView(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    tool_calls: list[Any] | None = None


class ChunkChoiceView(msgspec.Struct):
    index: int = 0
    delta: ChunkDeltaView = msgspec.field(default_factory=ChunkDeltaView)
    finish_reason: str | None = None


class ChatCompletionChunkView(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""
    choices: list[ChunkChoiceView] = msgspec.field(default_factory=list)
    usage: dict[str, Any] | None = None


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail


# The payload that ends an SSE stream (``data: [DONE]``), without the ``data: `` framing.
SSE_DONE = b"[DONE]"

# One reused encoder and decoders: building them per request costs more than using them.
json_encoder = msgspec.json.Encoder()
json_decoder = msgspec.json.Decoder()
completion_decoder = msgspec.json.Decoder(dict[str, Any])
chunk_view_decoder = msgspec.json.Decoder(ChatCompletionChunkView)


def decode_completion(stored: bytes) -> dict[str, Any] | None:
    """A stored answer as a completion, or ``None`` when it is not one (a hand-edited entry)."""
    try:
        completion = completion_decoder.decode(stored)
        message = completion["choices"][0]["message"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return None
    return completion if isinstance(message, dict) else None
