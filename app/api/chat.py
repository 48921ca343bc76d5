"""``/v1/chat/completions`` and ``/v1/models``."""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post
from litestar.response import Stream

from app.api.protocol import cache_mode, parse_chat_request
from app.chat import ChatCall
from app.errors import InvalidRequest
from app.lifespan import Resources

CATEGORY_HEADER = "x-cache-category"


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
