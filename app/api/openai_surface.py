"""The rest of the OpenAI surface: ``/v1/completions`` (legacy, through the same cache layers as
chat), ``/v1/embeddings`` (exact-cached) and every other ``/v1/`` path, passed through untouched."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Controller, Request, Response, post, route
from litestar.response import Stream

from app.api.chat import chat_call
from app.api.protocol import check_tool_fields, completion_as_chat, parse_view, read_body
from app.lifespan import Resources
from app.wire import CompletionRequest, EmbeddingRequest, chat_as_legacy, completion_decoder, json_encoder

logger = logging.getLogger("strata.api")


async def passthrough(request: Request[Any, Any, Any], resources: Resources, path: str, body: bytes) -> Response[bytes] | Stream:
    """Send a request to the upstream as it came, and its answer back as it comes (no cache)."""
    status, headers, chunks = await resources.upstream.forward(
        request.method, path, request.url.query or "", dict(request.headers), body)
    resources.metrics.passthrough_requests.labels(f"{status // 100}xx").inc()
    headers = {**headers, "X-Cache": "bypass"}
    media_type = headers.pop("content-type", "application/json")
    return Stream(chunks, status_code=status, media_type=media_type, headers=headers)


class OpenAISurfaceController(Controller):
    path = "/v1"

    @post("/completions", status_code=200)
    async def completions(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes] | Stream:
        """Create a text completion (legacy, OpenAI-compatible). One text prompt without echo,
        logprobs, suffix or several choices goes through the cache layers like a chat question
        (exact and semantic on the prompt); anything else, streaming included, is passed through."""
        caller = resources.tenants.caller(request.headers.get("authorization"))
        resources.rate_limiter.admit(caller.tenant)
        limits = resources.settings.limits
        body = await read_body(request, limits.body_timeout_s)
        legacy, raw = parse_view(body, CompletionRequest, limits.max_json_depth)
        check_tool_fields(raw)
        if not legacy.cacheable:
            resources.metrics.endpoint_requests.labels("completions", "bypass").inc()
            return await passthrough(request, resources, "completions", body)
        chat, chat_raw = completion_as_chat(legacy, raw)
        call = chat_call(request, resources, caller, chat, chat_raw)
        result = await resources.pipeline.handle(call)
        resources.metrics.endpoint_requests.labels("completions", result.outcome.value).inc()
        assert result.body is not None  # not streamed
        answer = json_encoder.encode(chat_as_legacy(completion_decoder.decode(result.body)))
        return Response(content=answer, media_type="application/json", headers=result.headers)

    @post("/embeddings", status_code=200)
    async def embeddings(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes]:
        """Create embeddings (OpenAI-compatible), exact-cached: the same input by the same model
        with the same options gets the stored vectors."""
        tenant = resources.tenants.tenant(request.headers.get("authorization"))
        resources.rate_limiter.admit(tenant)
        limits = resources.settings.limits
        embedding, raw = parse_view(await read_body(request, limits.body_timeout_s), EmbeddingRequest, limits.max_json_depth)
        use_cache = request.headers.get("cache-control", "").lower() != "no-store"
        answer, outcome = await resources.cache.embeddings.create(tenant, embedding.model, raw, resources.upstream.embeddings,
                                                                  use_cache=use_cache)
        return Response(content=answer, media_type="application/json", headers={"X-Cache": outcome})

    @route("/{path:path}", http_method=["GET", "POST", "PUT", "PATCH", "DELETE"], status_code=200)
    async def other(self, request: Request[Any, Any, Any], resources: Resources, path: str) -> Response[bytes] | Stream:
        """Any other path under ``/v1/``: passed through to the upstream untouched, never cached."""
        resources.tenants.tenant(request.headers.get("authorization"))
        body = await read_body(request, resources.settings.limits.body_timeout_s)
        return await passthrough(request, resources, path.lstrip("/"), body)
