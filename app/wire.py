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


def _check_inputs(name: str, value: str | list[Any]) -> None:
    """A prompt or input list holds texts, token ids, or lists of token ids, not a mix."""
    if isinstance(value, str):
        return
    kinds = {str if isinstance(v, str) and v else int if type(v) is int else
             list if isinstance(v, list) and v and all(type(t) is int for t in v) else None for v in value}
    if len(kinds) != 1 or None in kinds:
        raise ValueError(f"`{name}` must be a non-empty text, a list of non-empty texts, token ids or lists of token ids")


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The validated view of ``POST /v1/completions`` (legacy text completions)."""

    model: Annotated[str, Meta(min_length=1)]
    prompt: Annotated[str, Meta(min_length=1)] | Annotated[list[Any], Meta(min_length=1)]
    stream: bool = False
    max_tokens: PositiveInt | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    suffix: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        _check_inputs("prompt", self.prompt)

    @property
    def cacheable(self) -> bool:
        """One text prompt, one plain answer: what the chat layers can store and replay."""
        return (isinstance(self.prompt, str) and not self.stream and (self.n or 1) == 1 and (self.best_of or 1) == 1
                and not self.echo and self.logprobs is None and self.suffix is None)


class EmbeddingRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The validated view of ``POST /v1/embeddings``."""

    model: Annotated[str, Meta(min_length=1)]
    input: Annotated[str, Meta(min_length=1)] | Annotated[list[Any], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        _check_inputs("input", self.input)


# A legacy completion travels through the chat pipeline as a one-message chat call marked with
# this field (so its keys never meet a chat request's); the upstream sends it to /v1/completions.
LEGACY_COMPLETION_FIELD = "strata_legacy_completion"


def legacy_as_chat(legacy: dict[str, Any]) -> dict[str, Any]:
    """A text completion in the chat shape the cache stores (``choices[].message.content``)."""
    return {
        "id": legacy.get("id", ""), "object": "chat.completion", "created": legacy.get("created", 0),
        "model": legacy.get("model", ""),
        "choices": [{"index": c.get("index", i), "message": {"role": "assistant", "content": c.get("text", "")},
                     "logprobs": None, "finish_reason": c.get("finish_reason")}
                    for i, c in enumerate(legacy.get("choices") or [])],
        "usage": legacy.get("usage"),
    }


def chat_as_legacy(chat: dict[str, Any]) -> dict[str, Any]:
    """The text completion a legacy client expects, from the chat shape."""
    identity = str(chat.get("id", ""))
    return {
        "id": "cmpl-" + identity.removeprefix("chatcmpl-"), "object": "text_completion",
        "created": chat.get("created", 0), "model": chat.get("model", ""),
        "choices": [{"index": c.get("index", i), "text": (c.get("message") or {}).get("content") or "",
                     "logprobs": None, "finish_reason": c.get("finish_reason")}
                    for i, c in enumerate(chat.get("choices") or [])],
        "usage": chat.get("usage"),
    }


# --- responses -------------------------------------------------------------------------------


# Decoding views of upstream chunks: what assembling a completion needs, lenient defaults.
class ChunkDeltaView(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoiceView(msgspec.Struct):
    index: int = 0
    delta: ChunkDeltaView = msgspec.field(default_factory=ChunkDeltaView)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: Any = None


class ChatCompletionChunkView(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""
    system_fingerprint: str | None = None
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
