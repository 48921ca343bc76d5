"""OpenAI's Responses API (``POST /v1/responses``) as a chat call, and chat answers as responses.

A request is cached when it is stateless and says nothing chat cannot: ``instructions`` become the
system message, ``input`` (a text, or message, ``function_call`` and ``function_call_output``
items) the conversation, ``max_output_tokens``, ``temperature``, ``top_p``, function ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``text.format`` and ``reasoning.effort`` their chat
fields. Everything else is passed through uncached, deliberately:

- ``previous_response_id``, ``conversation``, ``store: true``, ``background`` and stored
  ``prompt``\\ s continue or keep state on the model server: the answer depends on what Strata
  cannot see, and the server must keep what it answered. A cached response is never stored
  upstream, so a chain that continues with ``previous_response_id`` starts with ``store: true``.
- Hosted tools (web search, file search, ...), ``include``, ``top_logprobs`` and any field Strata
  does not know: a field it would drop could change the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from app.protocols.events import named_event, response_hex
from app.wire import ChatCompletionChunkView

PositiveInt = Annotated[int, Meta(ge=1)]

# Fields a cached request may carry; any other one sends it through uncached.
_CACHED_FIELDS = frozenset({
    "model", "input", "instructions", "stream", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "text", "reasoning", "store", "user", "metadata", "safety_identifier", "prompt_cache_key",
    "service_tier", "truncation", "stream_options",
})
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The validated view of ``POST /v1/responses``: what Strata reads."""

    model: Annotated[str, Meta(min_length=1)]
    input: Annotated[str, Meta(min_length=1)] | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    instructions: str | None = None
    stream: bool = False
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


class Uncacheable(Exception):
    """The request says something the chat layers cannot serve: it is passed through."""


def uncached_reason(request: ResponsesRequest, raw: dict[str, Any]) -> str | None:
    """Why the request goes to the model server uncached, or ``None`` when it is cached."""
    unknown = sorted(set(raw) - _CACHED_FIELDS)
    if unknown:
        return f"fields {unknown}"
    if request.previous_response_id is not None or request.store:
        return "state kept by the model server"
    if any(tool.get("type") != "function" for tool in request.tools or []):
        return "hosted tools"
    if request.text and set(request.text) - {"format"}:
        return "text options"
    if request.reasoning and set(request.reasoning) - {"effort"}:
        return "reasoning options"
    return None


def _text_of(content: Any, item: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or []:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise Uncacheable(f"{item}: a content part other than text")
        texts.append(str(part.get("text") or ""))
    return "".join(texts)


def _user_content(content: Any, item: str) -> str | list[dict[str, Any]]:
    """A user, system or developer message's content as chat's: a text, or text and image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Uncacheable(f"{item}: content is neither a text nor a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") not in (None, "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:  # files, file ids and audio are the model server's to resolve
            raise Uncacheable(f"{item}: a content part of type {kind!r}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # as a plain text, the same question as chat's
    return parts


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        return messages
    for index, item in enumerate(request.input):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in _MESSAGE_ROLES:
            role = item["role"]
            if role == "assistant":
                messages.append({"role": "assistant", "content": _text_of(item.get("content"), where)})
            else:
                messages.append({"role": role, "content": _user_content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id") or ""), "type": "function",
                    "function": {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last.get("content")):
                last.setdefault("tool_calls", []).append(call)  # one assistant turn that called several tools
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                             "content": output if isinstance(output, str) else _text_of(output, where)})
        else:
            raise Uncacheable(f"{where}: an item of type {kind!r}")
    return messages


def _chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    converted = []
    for tool in tools:
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        converted.append({"type": "function", "function": function})
    return converted


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Uncacheable("a tool_choice other than a function's")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    shape = (text or {}).get("format")
    if not isinstance(shape, dict) or shape.get("type") in (None, "text"):
        return None
    if shape["type"] == "json_object":
        return {"type": "json_object"}
    if shape["type"] == "json_schema":
        schema = {k: shape[k] for k in ("name", "schema", "strict", "description") if k in shape}
        return {"type": "json_schema", "json_schema": schema}
    raise Uncacheable(f"text.format of type {shape['type']!r}")


def as_chat(request: ResponsesRequest, raw: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body that asks what the request asks.

    Raises:
        Uncacheable: An input item or option chat cannot carry.
    """
    chat: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
    if request.max_output_tokens is not None:
        chat["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls", "user", "metadata", "safety_identifier",
                 "prompt_cache_key", "service_tier"):
        if raw.get(name) is not None:
            chat[name] = raw[name]
    if request.tools:
        chat["tools"] = _chat_tools(request.tools)
    if request.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(request.tool_choice)
    response_format = _response_format(request.text)
    if response_format is not None:
        chat["response_format"] = response_format
    if request.reasoning and request.reasoning.get("effort") is not None:
        chat["reasoning_effort"] = request.reasoning["effort"]
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the closing event carries the usage
    return chat


def response_id(completion_id: str) -> str:
    return "resp_" + response_hex(completion_id)


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, output = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": int(usage.get("total_tokens") or prompt + output)}


class ResponseRenderer:
    """Chat answers in the Responses shape, for one request: the JSON body and the stream's events.

    Args:
        request: The request answered; its options are echoed as the Responses API echoes them.
    """

    def __init__(self, request: ResponsesRequest) -> None:
        self._request = request
        self._sequence = 0
        self._hex = "0"
        self._created = 0
        self._model = request.model
        self._message_open = False
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._output_count = 0
        self._message_index = 0

    # --- the body -----------------------------------------------------------------------------

    def _message_id(self) -> str:
        return f"msg_{self._hex}"

    def _call_item_id(self, index: int) -> str:
        return f"fc_{self._hex}_{index}"

    def _envelope(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                  incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        request = self._request
        return {
            "id": f"resp_{self._hex}", "object": "response", "created_at": self._created, "status": status,
            "background": False, "error": None, "incomplete_details": incomplete,
            "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
            "model": self._model, "output": output,
            "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
            "previous_response_id": None, "reasoning": request.reasoning, "store": False,
            "temperature": request.temperature, "text": request.text or {"format": {"type": "text"}},
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "tools": request.tools or [], "top_p": request.top_p, "truncation": "disabled", "usage": usage,
            "user": request.user, "metadata": request.metadata or {},
        }

    def body(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The response a chat completion makes (its id reused, so feedback can name it)."""
        self._hex = response_hex(str(completion.get("id") or ""))
        self._created = int(completion.get("created") or 0)
        self._model = str(completion.get("model") or self._request.model)
        choice = (completion.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        output: list[dict[str, Any]] = []
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []})
        if message.get("refusal"):
            content.append({"type": "refusal", "refusal": message["refusal"]})
        if content:
            output.append({"id": self._message_id(), "type": "message", "status": "completed", "role": "assistant",
                           "content": content})
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            output.append({"id": self._call_item_id(index), "type": "function_call", "status": "completed",
                           "call_id": call.get("id"), "name": function.get("name"),
                           "arguments": function.get("arguments") or ""})
        truncated = choice.get("finish_reason") == "length"
        return self._envelope("incomplete" if truncated else "completed", output, _usage(completion.get("usage")),
                              {"reason": "max_output_tokens"} if truncated else None)

    # --- the stream (app/protocols/events.py's EventSink) --------------------------------------

    def _event(self, name: str, **fields: Any) -> bytes:
        event = named_event(name, {"type": name, **fields, "sequence_number": self._sequence})
        self._sequence += 1
        return event

    def opened(self, chunk: ChatCompletionChunkView) -> Iterable[bytes]:
        self._hex, self._created, self._model = response_hex(chunk.id), chunk.created, chunk.model or self._model
        head = self._envelope("in_progress", [], None)
        yield self._event("response.created", response=head)
        yield self._event("response.in_progress", response=head)

    def _message_item(self, status: str, text: str | None = None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self._message_id(), "type": "message", "status": status, "role": "assistant", "content": content}

    def _close_message(self) -> Iterable[bytes]:
        if not self._message_open:
            return
        self._message_open = False
        text, where = "".join(self._text), {"item_id": self._message_id(), "output_index": self._message_index}
        yield self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
        yield self._event("response.content_part.done", **where, content_index=0,
                          part={"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        yield self._event("response.output_item.done", output_index=self._message_index,
                          item=self._message_item("completed", text))

    def text(self, delta: str) -> Iterable[bytes]:
        if not self._message_open:
            self._message_open, self._message_index = True, self._output_count
            self._output_count += 1
            yield self._event("response.output_item.added", output_index=self._message_index,
                              item=self._message_item("in_progress"))
            yield self._event("response.content_part.added", item_id=self._message_id(), output_index=self._message_index,
                              content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self._text.append(delta)
        yield self._event("response.output_text.delta", item_id=self._message_id(), output_index=self._message_index,
                          content_index=0, delta=delta, logprobs=[])

    def tool_call(self, index: int, call_id: str, name: str) -> Iterable[bytes]:
        yield from self._close_message()
        yield from self._close_calls()
        item = {"id": self._call_item_id(index), "type": "function_call", "status": "in_progress", "call_id": call_id,
                "name": name, "arguments": ""}
        self._calls[index] = {"item": item, "output_index": self._output_count, "arguments": [], "open": True}
        self._output_count += 1
        yield self._event("response.output_item.added", output_index=self._calls[index]["output_index"], item=item)

    def arguments(self, index: int, delta: str) -> Iterable[bytes]:
        call = self._calls[index]
        call["arguments"].append(delta)
        yield self._event("response.function_call_arguments.delta", item_id=call["item"]["id"],
                          output_index=call["output_index"], delta=delta)

    def _close_calls(self) -> Iterable[bytes]:
        for call in self._calls.values():
            if not call["open"]:
                continue
            call["open"] = False
            arguments = "".join(call["arguments"])
            yield self._event("response.function_call_arguments.done", item_id=call["item"]["id"],
                              output_index=call["output_index"], arguments=arguments)
            yield self._event("response.output_item.done", output_index=call["output_index"],
                              item={**call["item"], "status": "completed", "arguments": arguments})

    def finished(self, completion: dict[str, Any]) -> Iterable[bytes]:
        yield from self._close_message()
        yield from self._close_calls()
        whole = self.body(completion)
        name = "response.completed" if whole["status"] == "completed" else "response.incomplete"
        yield self._event(name, response=whole)

    def failed(self, error: dict[str, Any]) -> Iterable[bytes]:
        yield self._event("error", code=error.get("code") or error.get("type"), message=error.get("message", ""),
                          param=error.get("param"))
        failed = self._envelope("failed", [], None)
        failed["error"] = {"code": "server_error", "message": str(error.get("message", ""))}
        yield self._event("response.failed", response=failed)
