"""Parsing and validating what clients send; the only place request bodies are decoded."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from app.auth import Caller, valid_user
from app.cache.keys import text_of
from app.cache.layered import CacheMode
from app.errors import InvalidRequest
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


def parse_chat_request(
    body: bytes, *, max_messages: int = 256, max_content_chars: int = 65_536
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
    raw = _decode_object(body)
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
    return request, raw


def _decode_object(body: bytes) -> dict[str, Any]:
    try:
        raw = json_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    return raw


def parse_view(body: bytes, view: type[T]) -> tuple[T, dict[str, Any]]:
    """Decode a request body and validate it against ``view`` (``CompletionRequest``,
    ``EmbeddingRequest``); returns the view and the decoded body with every field.

    Raises:
        InvalidRequest: Not a JSON object, or a field is missing or wrong.
    """
    raw = _decode_object(body)
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
