"""Anthropic's Messages API (``POST /v1/messages``) as a chat call, and chat answers as messages.

Translated as the model server translates it (vLLM's ``entrypoints/anthropic``), so a cached
answer is the one the model would give this request: ``system`` (a text or text blocks; their
``cache_control`` markers ask for prompt caching, which L3 gives every stable prefix, and do not
change the key) joined into the system message; text and image blocks as chat content parts;
``tool_use`` blocks as the assistant's tool calls; ``tool_result`` blocks as tool messages;
``max_tokens`` (required), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``tools`` and
``tool_choice`` as their chat fields; ``metadata.user_id`` as the chat ``user``. Extended
thinking, documents, server tools and any field Strata does not know go through uncached.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from app.protocols.events import named_event, response_hex
from app.wire import ChatCompletionChunkView

_CACHED_FIELDS = frozenset({
    "model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k", "tools",
    "tool_choice", "metadata", "service_tier",
})


class AnthropicMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "assistant"]
    content: Annotated[str, Meta(min_length=1)] | list[dict[str, Any]]


class MessagesRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The validated view of ``POST /v1/messages``: what Strata reads."""

    model: Annotated[str, Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class Uncacheable(Exception):
    """The request says something the chat layers cannot serve: it is passed through."""


def uncached_reason(request: MessagesRequest, raw: dict[str, Any]) -> str | None:
    """Why the request goes to the model server uncached, or ``None`` when it is cached."""
    unknown = sorted(set(raw) - _CACHED_FIELDS)
    if unknown:
        return f"fields {unknown}"
    if any(tool.get("type") not in (None, "custom") for tool in request.tools or []):
        return "server tools"
    return None


def _image_url(source: Any) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise Uncacheable("an image source other than base64 or a URL")


def _system(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for block in system:
        if block.get("type") != "text":
            raise Uncacheable("a system block other than text")
        texts.append(str(block.get("text") or ""))
    return "".join(texts)


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    texts = []
    for item in content:
        if not isinstance(item, dict) or item.get("type") != "text":
            raise Uncacheable("a tool result other than text")
        texts.append(str(item.get("text") or ""))
    return "\n".join(texts)


def _convert(message: AnthropicMessage, out: list[dict[str, Any]]) -> None:
    if isinstance(message.content, str):
        out.append({"role": message.role, "content": message.content})
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": str(block.get("name") or ""), "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and message.role == "user":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": _tool_result_text(block.get("content"))})
        else:
            raise Uncacheable(f"a content block of type {kind!r}")
    converted: dict[str, Any] = {"role": message.role}
    if calls:
        converted["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        converted["content"] = parts[0]["text"]
    elif parts:
        converted["content"] = parts
    elif not calls:
        return  # only tool results: they are the tool messages above
    else:
        converted["content"] = None
    out.append(converted)


def _tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    named = {"auto": "auto", "any": "required", "none": "none"}
    if kind in named:
        return named[kind]
    raise Uncacheable(f"a tool_choice of type {kind!r}")


def as_chat(request: MessagesRequest, raw: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body that asks what the request asks.

    Raises:
        Uncacheable: A block or option chat cannot carry.
    """
    messages: list[dict[str, Any]] = []
    system = _system(request.system)
    if system:
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        _convert(message, messages)
    chat: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    if request.stop_sequences:
        chat["stop"] = request.stop_sequences
    for name in ("temperature", "top_p", "top_k", "service_tier"):
        if raw.get(name) is not None:
            chat[name] = raw[name]
    if request.tools:
        chat["tools"] = [{"type": "function", "function": {
            k: v for k, v in (("name", tool.get("name")), ("description", tool.get("description")),
                              ("parameters", tool.get("input_schema"))) if v is not None}} for tool in request.tools]
        chat["tool_choice"] = "auto"
    if request.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(request.tool_choice)
        if request.tool_choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    user = (request.metadata or {}).get("user_id")
    if isinstance(user, str):
        chat["user"] = user
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # message_delta carries the usage
    return chat


def marked_prefix(request: MessagesRequest) -> str | None:
    """The text a client marked as its stable prefix: everything up to the last block carrying
    ``cache_control`` (system blocks, then the messages' blocks), for L3's hygiene to check; ``None``
    without a marker (the system prompt is then the prefix, as for chat)."""
    texts: list[str] = []
    marked: str | None = None
    system = request.system if isinstance(request.system, list) else [{"type": "text", "text": request.system or ""}]
    blocks = [*system, *(b for m in request.messages if isinstance(m.content, list) for b in m.content)]
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            texts.append(block["text"])
        if isinstance(block, dict) and block.get("cache_control") is not None:
            marked = "".join(texts)
    return marked


def stop_reason(choice: dict[str, Any]) -> tuple[str | None, str | None]:
    """Chat's finish reason as Anthropic's ``(stop_reason, stop_sequence)``: a matched stop string
    (vLLM names it in ``stop_reason``) is a stop sequence; a call of tools is ``tool_use``."""
    finish, matched = choice.get("finish_reason"), choice.get("stop_reason")
    if finish == "length":
        return "max_tokens", None
    if (choice.get("message") or {}).get("tool_calls") or finish == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    found: dict[str, Any] = {"input_tokens": int(usage.get("prompt_tokens") or 0),
                             "output_tokens": int(usage.get("completion_tokens") or 0)}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        found["input_tokens"] = max(0, found["input_tokens"] - int(cached))
        found["cache_read_input_tokens"] = int(cached)
    return found


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


class MessageRenderer:
    """Chat answers in the Messages shape, for one request: the JSON body and the stream's events.

    Args:
        request: The request answered.
    """

    def __init__(self, request: MessagesRequest) -> None:
        self._model = request.model
        self._hex = "0"
        self._block = -1
        self._open = False
        self._kind = ""

    def body(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The message a chat completion makes (its id reused, so feedback can name it)."""
        self._hex = response_hex(str(completion.get("id") or ""))
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                            "input": _arguments(function.get("arguments") or "")})
        reason, sequence = stop_reason(choice)
        return {"id": f"msg_{self._hex}", "type": "message", "role": "assistant",
                "model": completion.get("model") or self._model, "content": content, "stop_reason": reason,
                "stop_sequence": sequence, "usage": _usage(completion.get("usage"))}

    def opened(self, chunk: ChatCompletionChunkView) -> Iterable[bytes]:
        self._hex = response_hex(chunk.id)
        self._model = chunk.model or self._model
        start: dict[str, Any] = {"id": f"msg_{self._hex}", "type": "message", "role": "assistant", "model": self._model, "content": [],
                 "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        yield named_event("message_start", {"type": "message_start", "message": start})

    def _stop_block(self) -> Iterable[bytes]:
        if self._open:
            self._open = False
            yield named_event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _start_block(self, block: dict[str, Any]) -> Iterable[bytes]:
        yield from self._stop_block()
        self._block += 1
        self._open = True
        yield named_event("content_block_start", {"type": "content_block_start", "index": self._block,
                                                  "content_block": block})

    def text(self, delta: str) -> Iterable[bytes]:
        if not self._open or self._kind != "text":
            self._kind = "text"
            yield from self._start_block({"type": "text", "text": ""})
        yield named_event("content_block_delta", {"type": "content_block_delta", "index": self._block,
                                                  "delta": {"type": "text_delta", "text": delta}})

    def tool_call(self, index: int, call_id: str, name: str) -> Iterable[bytes]:
        self._kind = "tool_use"
        yield from self._start_block({"type": "tool_use", "id": call_id, "name": name, "input": {}})

    def arguments(self, index: int, delta: str) -> Iterable[bytes]:
        yield named_event("content_block_delta", {"type": "content_block_delta", "index": self._block,
                                                  "delta": {"type": "input_json_delta", "partial_json": delta}})

    def finished(self, completion: dict[str, Any]) -> Iterable[bytes]:
        yield from self._stop_block()
        whole = self.body(completion)
        yield named_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]},
                                            "usage": whole["usage"]})
        yield named_event("message_stop", {"type": "message_stop"})

    def failed(self, error: dict[str, Any]) -> Iterable[bytes]:
        # The relay's error names its type, not its status: an overloaded model server stays one.
        kind = "overloaded_error" if error.get("type") == "overloaded_error" else "api_error"
        yield named_event("error", {"type": "error", "error": {"type": kind, "message": str(error.get("message", ""))}})
