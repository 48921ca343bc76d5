"""``/v1/responses`` (OpenAI's Responses API) and ``/v1/messages`` (Anthropic's Messages API),
served through the chat layers (``app/protocols``): translated into a chat call, answered by the
pipeline (a hit or the model), rendered back in the asker's protocol; passed through uncached
when they carry what chat cannot (``uncached_reason``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from litestar import Controller, Request, Response, post
from litestar.response import Stream

from app.api.chat import chat_call, check_prefix, check_system_prompt
from app.api.protocol import parse_chat_request, parse_view, read_body
from app.auth import Caller
from app.chat import ChatResult
from app.errors import anthropic_error_body
from app.hygiene import prefix_salt
from app.lifespan import Resources
from app.protocols import anthropic, responses
from app.protocols.events import EventSink, translate
from app.stream import RESPONSE_ID_HEADER
from app.wire import completion_decoder, json_decoder, json_encoder

# The anthropic SDK's way of presenting a key; Strata reads it as ``Authorization: Bearer <key>``.
ANTHROPIC_KEY_HEADER = "x-api-key"


class Renderer(EventSink, Protocol):
    """A protocol's renderer: the stream's events (``EventSink``) and the JSON body."""

    def body(self, completion: dict[str, Any]) -> dict[str, Any]: ...


def _caller(request: Request[Any, Any, Any], resources: Resources, *, anthropic_key: bool = False) -> Caller:
    authorization = request.headers.get("authorization")
    if authorization is None and anthropic_key and request.headers.get(ANTHROPIC_KEY_HEADER):
        authorization = f"Bearer {request.headers[ANTHROPIC_KEY_HEADER]}"
    caller = resources.tenants.caller(authorization)
    resources.rate_limiter.admit(caller.tenant)
    return caller


async def _uncached(request: Request[Any, Any, Any], resources: Resources, caller: Caller, path: str,
                    raw: dict[str, Any], endpoint: str) -> Response[bytes] | Stream:
    """Pass a request through as it came but for the tenant's prefix-cache salt."""
    resources.metrics.endpoint_requests.labels(endpoint, "bypass").inc()
    if resources.settings.cache_salt:
        raw = {**raw, "cache_salt": prefix_salt(caller.tenant)}
    status, headers, chunks = await resources.upstream.forward(
        request.method, path, request.url.query or "", dict(request.headers), json_encoder.encode(raw))
    resources.metrics.passthrough_requests.labels(f"{status // 100}xx").inc()
    headers = {**headers, "X-Cache": "bypass"}
    media_type = headers.pop("content-type", "application/json")
    if status >= 400 and path == "messages":  # the model server's error, in the shape this client reads
        chunks = _anthropic_error(status, chunks)
    return Stream(chunks, status_code=status, media_type=media_type, headers=headers)


async def _anthropic_error(status: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    body = b"".join([chunk async for chunk in chunks])
    try:
        message = str(json_decoder.decode(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace")[:500]
    yield anthropic_error_body(status, message)


async def _served(request: Request[Any, Any, Any], resources: Resources, caller: Caller, chat_body: dict[str, Any],
                  renderer: Renderer, endpoint: str, marked: str | None = None) -> Response[bytes] | Stream:
    """Answer the chat call a request translates to, rendered by ``renderer``; ``marked`` is the
    prefix the client marked as stable, which L3's hygiene checks instead of the system prompt."""
    limits = resources.settings.limits
    chat_request, chat_raw = parse_chat_request(
        json_encoder.encode(chat_body), max_messages=limits.max_messages, max_content_chars=limits.max_content_chars,
        max_depth=limits.max_json_depth,
    )
    call = chat_call(request, resources, caller, chat_request, chat_raw)
    if resources.hygiene is not None:
        if marked is None:
            check_system_prompt(resources, chat_request, caller.tenant)
        else:
            check_prefix(resources, marked, caller.tenant, param="system")
    result = await resources.pipeline.handle(call)
    resources.metrics.endpoint_requests.labels(endpoint, result.outcome.value).inc()
    if result.stream is not None:
        return Stream(translate(result.stream, renderer), media_type="text/event-stream",
                      headers={**_headers(result, None), "Cache-Control": "no-cache"})
    body = renderer.body(completion_decoder.decode(result.body or b"{}"))
    return Response(content=json_encoder.encode(body), media_type="application/json",
                    headers=_headers(result, str(body["id"])))


def _headers(result: ChatResult, response_id: str | None) -> dict[str, str]:
    """The chat result's cache headers; a hit's response id in the protocol's spelling (the
    body's ``id``; ``POST /v1/feedback`` takes either)."""
    headers = dict(result.headers)
    if RESPONSE_ID_HEADER in headers:
        if response_id is None:
            headers.pop(RESPONSE_ID_HEADER)  # a stream's id is in its first event
        else:
            headers[RESPONSE_ID_HEADER] = response_id
    return headers


async def _translated(request: Request[Any, Any, Any], resources: Resources, caller: Caller, raw: dict[str, Any],
                      reason: str | None, to_chat: Callable[[], dict[str, Any]], uncacheable: type[Exception],
                      renderer: Renderer, path: str, marked: str | None = None) -> Response[bytes] | Stream:
    if reason is None:
        try:
            chat_body = to_chat()
        except uncacheable:
            reason = "uncacheable"
    if reason is not None:
        return await _uncached(request, resources, caller, path, raw, path)
    return await _served(request, resources, caller, chat_body, renderer, path, marked)


class ResponsesController(Controller):
    path = "/v1"

    @post("/responses", status_code=200)
    async def create_response(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes] | Stream:
        """Create a model response (OpenAI's Responses API), served from the cache when possible."""
        caller = _caller(request, resources)
        limits = resources.settings.limits
        view, raw = parse_view(await read_body(request, limits.body_timeout_s), responses.ResponsesRequest,
                               limits.max_json_depth)
        return await _translated(request, resources, caller, raw, responses.uncached_reason(view, raw),
                                 lambda: responses.as_chat(view, raw), responses.Uncacheable,
                                 responses.ResponseRenderer(view), "responses")


class MessagesController(Controller):
    path = "/v1"

    @post("/messages", status_code=200)
    async def create_message(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes] | Stream:
        """Create a message (Anthropic's Messages API), served from the cache when possible;
        errors in Anthropic's shape."""
        caller = _caller(request, resources, anthropic_key=True)
        limits = resources.settings.limits
        view, raw = parse_view(await read_body(request, limits.body_timeout_s), anthropic.MessagesRequest,
                               limits.max_json_depth)
        return await _translated(request, resources, caller, raw, anthropic.uncached_reason(view, raw),
                                 lambda: anthropic.as_chat(view, raw), anthropic.Uncacheable,
                                 anthropic.MessageRenderer(view), "messages", anthropic.marked_prefix(view))
