"""``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.response import Stream

from app.api.protocol import USER_HEADER, cache_mode, cache_user, parse_chat_request, read_body, system_prompt
from app.auth import Caller
from app.cache.layered import CacheMode
from app.chat import ChatCall
from app.errors import InvalidRequest
from app.hygiene import prefix_salt
from app.lifespan import Resources
from app.policy import CategoryPolicy, UnknownCategory
from app.wire import ChatCompletionRequest

CATEGORY_HEADER = "x-cache-category"
# An operator's own request (the admin token) may rewrite a shared entry with Cache-Control: no-cache.
ADMIN_TOKEN_HEADER = "x-strata-admin-token"


def request_category(request: Request[Any, Any, Any], resources: Resources) -> CategoryPolicy:
    """The category ``X-Cache-Category`` names, or the default one.

    Raises:
        InvalidRequest: No such category.
    """
    try:
        return resources.policy.category(request.headers.get(CATEGORY_HEADER))
    except UnknownCategory as exc:
        raise InvalidRequest(str(exc), param="X-Cache-Category", code="unknown_category") from exc


def _operator(request: Request[Any, Any, Any], resources: Resources) -> bool:
    token, presented = resources.admin.current(), request.headers.get(ADMIN_TOKEN_HEADER)
    return bool(token and presented) and hmac.compare_digest(str(presented).encode(), str(token).encode())


def chat_call(request: Request[Any, Any, Any], resources: Resources, caller: Caller, chat_request: ChatCompletionRequest,
              raw: dict[str, Any]) -> ChatCall:
    """The pipeline's call for a validated request: its category, whose answer it is, and what it
    may do with the cache.

    ``no-cache`` rewrites an entry only where nobody else is served it (a per-user category), or
    for a key allowed to (``may_refresh``) or an operator (``X-Strata-Admin-Token``); otherwise it
    only skips the lookup. A per-user category without an identity is not cached at all.

    Raises:
        InvalidRequest: Unknown category, or a malformed user identity.
    """
    category = request_category(request, resources)
    user = cache_user(caller, request.headers.get(USER_HEADER), chat_request.user, per_user=category.per_user)
    may_refresh = category.per_user or caller.may_refresh or _operator(request, resources)
    mode = cache_mode(request.headers.get("cache-control"), may_refresh=may_refresh)
    if category.per_user and user is None and mode in (CacheMode.USE, CacheMode.REFRESH):
        mode = CacheMode.NO_USER
    salt = prefix_salt(caller.tenant, user if category.per_user else None) if resources.settings.cache_salt else None
    return ChatCall(request=chat_request, raw=raw, tenant=caller.tenant, category=category, mode=mode, user=user,
                    cache_salt=salt)


def check_system_prompt(resources: Resources, request: ChatCompletionRequest, tenant: str) -> None:
    """L3 hygiene on a chat request's shared prefix, its system prompt (``check_prefix``).

    Raises:
        InvalidRequest: ``STRATA_PROMPT_HYGIENE=reject`` and the system prompt has dynamic content.
    """
    check_prefix(resources, system_prompt(request), tenant)


def check_prefix(resources: Resources, prompt: str, tenant: str, *, param: str = "messages") -> None:
    """L3 hygiene: count dynamic content in the prefix a bot's requests share (its system prompt, or
    what an Anthropic client marked with ``cache_control``); refuse it in reject mode.

    Raises:
        InvalidRequest: ``STRATA_PROMPT_HYGIENE=reject`` and the prefix has dynamic content.
    """
    assert resources.hygiene is not None
    if not prompt:
        return
    findings, _ = resources.hygiene.check(prompt)
    for finding in findings:
        resources.metrics.prompt_dynamic.labels(finding.kind, resources.metrics.tenant(tenant)).inc()
    if findings and resources.settings.prompt_hygiene == "reject":
        first = findings[0]
        raise InvalidRequest(
            f"the system prompt has dynamic content ({first.kind} {first.text!r} at characters {first.start}-{first.end}),"
            " which defeats the model server's prefix cache; move it to the last user message",
            param=param, code="dynamic_system_prompt",
        )


class ChatController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200)
    async def chat_completions(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes] | Stream:
        """Create a chat completion (OpenAI-compatible), served from the cache when possible."""
        caller = resources.tenants.caller(request.headers.get("authorization"))
        resources.rate_limiter.admit(caller.tenant)
        limits = resources.settings.limits
        chat_request, raw = parse_chat_request(
            await read_body(request, limits.body_timeout_s), max_messages=limits.max_messages,
            max_content_chars=limits.max_content_chars, max_depth=limits.max_json_depth,
        )
        call = chat_call(request, resources, caller, chat_request, raw)
        if resources.hygiene is not None:
            check_system_prompt(resources, chat_request, caller.tenant)
        result = await resources.pipeline.handle(call)
        resources.metrics.endpoint_requests.labels("chat", result.outcome.value).inc()
        if result.stream is not None:
            headers = {**result.headers, "Cache-Control": "no-cache"}
            return Stream(result.stream, media_type="text/event-stream", headers=headers)
        return Response(content=result.body or b"", media_type="application/json", headers=result.headers)

    @get("/models")
    async def models(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes]:
        """The upstream's model list, passed through."""
        resources.tenants.tenant(request.headers.get("authorization"))
        return Response(content=await resources.upstream.models(), media_type="application/json")
