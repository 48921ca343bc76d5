"""Parsing and validating what clients send; the only place request bodies are decoded."""

from __future__ import annotations

import asyncio
import re
from typing import Any, TypeVar

import msgspec
from litestar import Request

from app.auth import Caller, valid_user
from app.cache.layered import CacheMode
from app.cache.storage.keys import text_of
from app.errors import InvalidRequest, RequestTimeout
from app.wire import LEGACY_COMPLETION_FIELD, ChatCompletionRequest, CompletionRequest, json_decoder

T = TypeVar("T")
_CHAT_FIELDS = frozenset(ChatCompletionRequest.__struct_fields__)

_PATH = re.compile(r"at `\$\.?(?P<path>[^`]*)`")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
# Roles whose messages must carry content; of those, the roles whose content must not be empty
# (an assistant turn that called tools may say nothing, and a tool may return an empty result).
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool", "function"})
_TEXT_REQUIRED = frozenset({"system", "developer", "user"})


def _param(error: msgspec.ValidationError) -> str | None:
    """The field a msgspec validation error points at, as OpenAI names it (``messages[0].role``)."""
    text = str(error)
    path_match = _PATH.search(text)
    path = path_match.group("path") if path_match else ""
    missing = _MISSING.search(text)
    if missing:
        path = f"{path}.{missing.group('field')}" if path else missing.group("field")
    return path or None


# How deep a request body may nest (objects and arrays); deeper is a 400, never a RecursionError.
MAX_JSON_DEPTH = 64
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
_RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema", "structural_tag"})


async def read_body(request: Request[Any, Any, Any], timeout_s: float) -> bytes:
    """The request body, which must arrive within ``timeout_s``.

    Raises:
        RequestTimeout: It did not (a body declared and never sent holds no connection long).
    """
    try:
        async with asyncio.timeout(timeout_s):
            return await request.body()
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s", code="body_timeout") from exc


def parse_chat_request(
    body: bytes, *, max_messages: int = 256, max_content_chars: int = 65_536, max_depth: int = MAX_JSON_DEPTH
) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    """Decode and validate a chat completion request body.

    Args:
        body: The raw request body.
        max_messages: Most messages a request may carry.
        max_content_chars: Most characters one message's text may have.

    Returns:
        The validated request, and the decoded body with every field (for pass-through).

    Raises:
        InvalidRequest: The body is not JSON, not an object, or a field is missing or wrong.
    """
    raw = _decode_object(body, max_depth)
    if LEGACY_COMPLETION_FIELD in raw:
        raise InvalidRequest(f"`{LEGACY_COMPLETION_FIELD}` is Strata's own field", param=LEGACY_COMPLETION_FIELD,
                             code="invalid_value")
    try:
        request = msgspec.convert(raw, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        param = _param(exc)
        raise InvalidRequest(f"invalid request: {exc}", param=param, code="invalid_value") from exc
    if len(request.messages) > max_messages:
        raise InvalidRequest(f"`messages` has {len(request.messages)} items; at most {max_messages} are allowed",
                             param="messages", code="too_many_messages")
    for index, message in enumerate(request.messages):
        content = message.content
        field = f"messages[{index}].content"
        length = len(content) if isinstance(content, str) else sum(len(p.text or "") for p in content or [])
        if length > max_content_chars:
            raise InvalidRequest(f"`{field}` has {length} characters; at most {max_content_chars} are allowed",
                                 param=field, code="content_too_long")
        if message.role not in _TEXT_REQUIRED and content is not None:
            continue  # assistant, tool and function turns carry what the model or the tool said, even nothing
        if isinstance(content, str) and not content.strip():
            raise InvalidRequest(f"`{field}` must not be empty", param=field, code="empty_content")
        if isinstance(content, list) and (
            not content or all(part.type == "text" and not (part.text or "").strip() for part in content)
        ):
            raise InvalidRequest(f"`{field}` must not be empty", param=field, code="empty_content")
        if content is None and (message.role in _CONTENT_REQUIRED or not message.tool_calls):
            raise InvalidRequest(f"`{field}` is required for role `{message.role}`", param=field, code="empty_content")
    check_tool_fields(raw)
    return request, raw


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def check_tool_fields(raw: dict[str, Any]) -> None:
    """The shapes of ``tools``, ``tool_choice``, ``response_format`` and ``logit_bias``, which Strata
    passes on: checked here, so a malformed one is a 400 naming it, not the model server's problem.

    Raises:
        InvalidRequest: One of them is malformed.
    """
    tools = raw.get("tools")
    names: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > 128:
            raise _invalid("`tools` must be a list of at most 128 tools", "tools")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
                raise _invalid("each tool must be an object with a `type`", f"tools[{i}]")
            if tool["type"] != "function":
                continue
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not _TOOL_NAME.match(function["name"]):
                raise _invalid("a function tool needs `function.name`: 1 to 64 letters, digits, `_`, `-` or `.`",
                               f"tools[{i}].function.name")
            if "parameters" in function and not isinstance(function["parameters"], dict):
                raise _invalid("`parameters` must be a JSON schema object", f"tools[{i}].function.parameters")
            if "description" in function and not isinstance(function["description"], str | None):
                raise _invalid("`description` must be a string", f"tools[{i}].function.description")
            names.add(function["name"])
    choice = raw.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in _TOOL_CHOICES:
                raise _invalid("`tool_choice` is `none`, `auto`, `required` or a named function", "tool_choice")
        elif not isinstance(choice, dict) or not isinstance((choice.get("function") or {}).get("name"), str):
            raise _invalid("a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        elif tools is not None and choice["function"]["name"] not in names:
            raise _invalid(f"`tool_choice` names {choice['function']['name']!r}, which is not among `tools`", "tool_choice")
    response_format = raw.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict) or response_format.get("type") not in _RESPONSE_FORMATS:
            raise _invalid("`response_format.type` is `text`, `json_object` or `json_schema`", "response_format")
        if response_format["type"] == "json_schema":
            schema = response_format.get("json_schema")
            if not isinstance(schema, dict) or not isinstance(schema.get("name"), str) or not _TOOL_NAME.match(schema["name"]):
                raise _invalid("`json_schema` needs a `name` of 1 to 64 letters, digits, `_` or `-`", "response_format.json_schema")
            if "schema" in schema and not isinstance(schema["schema"], dict):
                raise _invalid("`json_schema.schema` must be an object", "response_format.json_schema.schema")
    bias = raw.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or len(bias) > 1024:
            raise _invalid("`logit_bias` maps token ids to numbers (at most 1024)", "logit_bias")
        for token, value in bias.items():
            if not token.isdigit() or isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
                raise _invalid("`logit_bias` maps token ids (digits) to numbers from -100 to 100", f"logit_bias.{token}")


def _decode_object(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    try:
        raw = json_decoder.decode(body)
    except RecursionError as exc:
        raise _too_deep(max_depth) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    # Fewer opening brackets than the limit cannot nest deeper: most bodies skip the walk.
    if body.count(b"{") + body.count(b"[") > max_depth and _deeper_than(raw, max_depth):
        raise _too_deep(max_depth)
    return raw


def _too_deep(limit: int) -> InvalidRequest:
    return InvalidRequest(f"the request body nests deeper than {limit} levels", code="too_deep")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest deeper than ``limit``: iterative, so no depth breaks it."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_view(body: bytes, view: type[T], max_depth: int = MAX_JSON_DEPTH) -> tuple[T, dict[str, Any]]:
    """Decode a request body and validate it against ``view`` (``CompletionRequest``,
    ``EmbeddingRequest``); returns the view and the decoded body with every field.

    Raises:
        InvalidRequest: Not a JSON object, or a field is missing or wrong.
    """
    raw = _decode_object(body, max_depth)
    try:
        return msgspec.convert(raw, view), raw
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param=_param(exc), code="invalid_value") from exc


def completion_as_chat(request: CompletionRequest, raw: dict[str, Any]) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    """A cacheable legacy completion as the one-message chat call the pipeline serves: the prompt
    is the user message (and the semantic layer's question), the other fields pass through."""
    assert isinstance(request.prompt, str)
    messages = [{"role": "user", "content": request.prompt}]
    chat_raw = {k: v for k, v in raw.items() if k != "prompt"}
    chat_raw.update(messages=messages, **{LEGACY_COMPLETION_FIELD: True})
    try:
        chat = msgspec.convert({k: v for k, v in chat_raw.items() if k in _CHAT_FIELDS}, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param=_param(exc), code="invalid_value") from exc
    return chat, chat_raw


def system_prompt(request: ChatCompletionRequest) -> str:
    """The text of the leading system and developer messages: the prefix shared by a bot's requests."""
    parts = []
    for message in request.messages[:-1]:
        if message.role not in ("system", "developer"):
            break
        text = text_of(message.content)
        if text:
            parts.append(text)
    return "\n".join(parts)


def cache_mode(header: str | None, *, may_refresh: bool = True) -> CacheMode:
    """Read ``Cache-Control``: ``no-store`` skips the cache; ``no-cache`` refreshes the entry when
    the caller may rewrite it, and otherwise only skips the lookup (the entry stays as it is)."""
    if not header:
        return CacheMode.USE
    tokens = {token.strip().lower() for token in header.split(",")}
    if "no-store" in tokens:
        return CacheMode.SKIP
    if "no-cache" in tokens:
        return CacheMode.REFRESH if may_refresh else CacheMode.REFRESH_DENIED
    return CacheMode.USE


# Who the answers of a per-user category (``scope: user``) belong to, when the API key does not say.
USER_HEADER = "x-cache-user"


def cache_user(caller: Caller, header: str | None, body_user: str | None, *, per_user: bool) -> str | None:
    """The user a request's answer belongs to: the key's own user; else ``X-Cache-User``; else the
    body's OpenAI ``user`` field. ``None`` in a shared category, where answers belong to no user.

    Raises:
        InvalidRequest: ``X-Cache-User`` is malformed (in any category), or in a per-user category
            the ``user`` field the identity would come from is.
    """
    if header is not None and not valid_user(header):
        raise InvalidRequest("`X-Cache-User` must have 1 to 256 printable characters", param="X-Cache-User",
                             code="invalid_user")
    if not per_user:
        return None
    if caller.user is not None:
        return caller.user  # a user's own key: no header or field can speak for another user
    if header is not None:
        return header
    if body_user is not None and not valid_user(body_user):
        raise InvalidRequest("`user` must have 1 to 256 printable characters to identify the user of a per-user "
                             "category", param="user", code="invalid_user")
    return body_user
