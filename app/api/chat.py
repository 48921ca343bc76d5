"""``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post
from litestar.response import Stream

from app.api.protocol import cache_mode, parse_chat_request, system_prompt
from app.chat import ChatCall
from app.errors import InvalidRequest
from app.lifespan import Resources
from app.wire import ChatCompletionRequest

CATEGORY_HEADER = "x-cache-category"


def check_system_prompt(resources: Resources, request: ChatCompletionRequest, tenant: str) -> None:
    """L3 hygiene: count dynamic content in the shared system prompt; refuse it in reject mode.

    Raises:
        InvalidRequest: ``STRATA_PROMPT_HYGIENE=reject`` and the system prompt has dynamic content.
    """
    assert resources.hygiene is not None
    prompt = system_prompt(request)
    if not prompt:
        return
    findings, _ = resources.hygiene.check(prompt)
    for finding in findings:
        resources.metrics.prompt_dynamic.labels(finding.kind, tenant).inc()
    if findings and resources.settings.prompt_hygiene == "reject":
        first = findings[0]
        raise InvalidRequest(
            f"the system prompt has dynamic content ({first.kind} {first.text!r} at characters {first.start}-{first.end}),"
            " which defeats the model server's prefix cache; move it to the last user message",
            param="messages", code="dynamic_system_prompt",
        )


class ChatController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200)
    async def chat_completions(self, request: Request, resources: Resources) -> Response[bytes] | Stream:
        """Create a chat completion (OpenAI-compatible), served from the cache when possible."""
        tenant = resources.tenants.tenant(request.headers.get("authorization"))
        resources.rate_limiter.admit(tenant)
        limits = resources.settings.limits
        chat_request, raw = parse_chat_request(
            await request.body(), max_messages=limits.max_messages, max_content_chars=limits.max_content_chars
        )
        category_name = request.headers.get(CATEGORY_HEADER)
        category = resources.policy.get(category_name)
        if category is None:
            known = ", ".join(sorted(resources.policy.categories))
            raise InvalidRequest(
                f"unknown cache category {category_name!r}; known: {known}", param="X-Cache-Category", code="unknown_category"
            )
        if resources.hygiene is not None:
            check_system_prompt(resources, chat_request, tenant)
        call = ChatCall(request=chat_request, raw=raw, tenant=tenant, category=category,
                        mode=cache_mode(request.headers.get("cache-control")))
        result = await resources.pipeline.handle(call)
        if result.stream is not None:
            headers = {**result.headers, "Cache-Control": "no-cache"}
            return Stream(result.stream, media_type="text/event-stream", headers=headers)
        return Response(content=result.body or b"", media_type="application/json", headers=result.headers)

    @get("/models")
    async def models(self, request: Request, resources: Resources) -> Response[bytes]:
        """The upstream's model list, passed through."""
        resources.tenants.tenant(request.headers.get("authorization"))
        return Response(content=await resources.upstream.models(), media_type="application/json")
