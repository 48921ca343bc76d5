"""Strata's OpenAPI document, built from the same msgspec types that validate requests.

Litestar's generated schema cannot describe the chat request body (the handler reads the raw
body so that unknown fields pass through to the model server), so Strata serves this one.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get
from litestar.openapi.plugins import SwaggerRenderPlugin

from app import __version__
from app.cache.learning.feedback import FeedbackRequest
from app.cache.storage.invalidation import Invalidation
from app.lifespan import Resources
from app.wire import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ErrorResponse

_REF = "#/components/schemas/{name}"
# The page loads Swagger UI's script and style from its CDN in the reader's browser.
_DOCS_PAGE = SwaggerRenderPlugin(path="/docs")


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorResponse")}}}}


def build_openapi(category_names: list[str]) -> dict[str, Any]:
    (request_schema, _, invalidation_schema, completion_schema, embedding_schema, feedback_schema), components = (
        msgspec.json.schema_components(
            [ChatCompletionRequest, ErrorResponse, Invalidation, CompletionRequest, EmbeddingRequest, FeedbackRequest],
            ref_template=_REF,
        )
    )
    json_object = {"type": "object", "additionalProperties": True}
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Strata", "version": __version__,
                 "description": "A layered cache in front of an OpenAI-compatible model server."},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "security": bearer,
                    "parameters": [
                        {"name": "X-Cache-Category", "in": "header", "required": False,
                         "schema": {"type": "string", "enum": category_names}},
                        {"name": "Cache-Control", "in": "header", "required": False,
                         "schema": {"type": "string", "enum": ["no-cache", "no-store"]}},
                    ],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
                    "responses": {
                        "200": {"description": "A completion, or an SSE stream of chunks when `stream` is true",
                                "content": {"application/json": {"schema": json_object},
                                            "text/event-stream": {"schema": {"type": "string"}}}},
                        "400": _error("Invalid request"),
                        "401": _error("Missing or unknown API key"),
                        "413": _error("Request body too large"),
                        "429": _error("Request budget exceeded"),
                        "502": _error("The model server failed"),
                        "503": _error("The model server is at capacity"),
                        "504": _error("The model server timed out"),
                    },
                }
            },
            "/v1/completions": {"post": {
                "operationId": "createCompletion", "security": bearer,
                "description": "Legacy text completion. One text prompt (no echo, logprobs, suffix, n or best_of "
                               "above 1, no stream) goes through the cache layers like a chat question; anything "
                               "else is passed through.",
                "parameters": [{"name": "X-Cache-Category", "in": "header", "required": False,
                                "schema": {"type": "string", "enum": category_names}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": completion_schema}}},
                "responses": {
                    "200": {"description": "A text completion (or its SSE stream)",
                            "content": {"application/json": {"schema": json_object},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
                    "400": _error("Invalid request"), "401": _error("Missing or unknown API key"),
                    "429": _error("Tenant over its rate limit"), "502": _error("The model server failed")}}},
            "/v1/embeddings": {"post": {
                "operationId": "createEmbedding", "security": bearer,
                "description": "Embeddings, exact-cached per tenant, model, input and options (X-Cache: exact-hit or miss).",
                "requestBody": {"required": True, "content": {"application/json": {"schema": embedding_schema}}},
                "responses": {
                    "200": {"description": "The embeddings", "content": {"application/json": {"schema": json_object}}},
                    "400": _error("Invalid request"), "401": _error("Missing or unknown API key"),
                    "429": _error("Tenant over its rate limit"), "502": _error("The model server failed")}}},
            "/v1/feedback": {"post": {
                "operationId": "giveFeedback", "security": bearer,
                "description": "An end user's verdict on a hit, named by its response id (the body's id, also "
                               "X-Cache-Response-Id): wrong vetoes that entry or alias at that similarity at once "
                               "(an exact entry is deleted); right is a right observation. One per response.",
                "requestBody": {"required": True, "content": {"application/json": {"schema": feedback_schema}}},
                "responses": {
                    "200": {"description": "What the verdict did", "content": {"application/json": {"schema": json_object}}},
                    "400": _error("Malformed feedback"), "401": _error("Missing or unknown API key"),
                    "404": _error("No such response for this tenant"), "409": _error("Feedback given already"),
                    "429": _error("Tenant over its rate limit")}}},
            "/v1/{path}": {method: {
                "operationId": f"passThrough{method.capitalize()}", "security": bearer,
                "description": "Any other path under /v1/: passed to the model server untouched, never cached.",
                "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"default": {"description": "The model server's answer, as it came"},
                              "401": _error("Missing or unknown API key"), "502": _error("The model server failed")}}
                for method in ("get", "post", "put", "patch", "delete")},
            "/v1/models": {"get": {"operationId": "listModels", "security": bearer, "responses": {
                "200": {"description": "The upstream's models", "content": {"application/json": {"schema": json_object}}},
                "401": _error("Missing or unknown API key"), "502": _error("The model server failed")}}},
            "/health": {"get": {"operationId": "health", "responses": {
                "200": {"description": "ok or degraded", "content": {"application/json": {"schema": json_object}}}}}},
            "/metrics": {"get": {"operationId": "metrics", "responses": {
                "200": {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/admin/cache/invalidate": {"post": {
                "operationId": "invalidateCache", "security": bearer,
                "description": "Empty body: every entry (version bump). Otherwise one target: a category and/or "
                               "tenant, a key, a question (with its model), or a curated file.",
                "requestBody": {"required": False, "content": {"application/json": {"schema": invalidation_schema}}},
                "parameters": [{"name": "X-Strata-Operator", "in": "header", "required": False,
                                "schema": {"type": "string"}, "description": "who, for the audit stream"}],
                "responses": {
                    "200": {"description": "What was invalidated", "content": {"application/json": {"schema": json_object}}},
                    "400": _error("Malformed target (unknown category, malformed key, ...)"),
                    "404": _error("No entry under that key or for that question"),
                    "401": _error("Missing or wrong admin token"), "403": _error("Admin endpoints are disabled")}}},
            "/admin/cache/audit": {"get": {
                "operationId": "cacheAudit", "security": bearer,
                "parameters": [{"name": "count", "in": "query", "required": False,
                                "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50}}],
                "responses": {
                    "200": {"description": "The latest invalidations", "content": {"application/json": {"schema": json_object}}},
                    "400": _error("count out of range"),
                    "401": _error("Missing or wrong admin token"), "403": _error("Admin endpoints are disabled")}}},
        },
    }


class OpenAPIController(Controller):
    @get("/openapi.json", include_in_schema=False)
    async def openapi(self, resources: Resources) -> dict[str, Any]:
        """The OpenAPI 3.1 document of this service."""
        return build_openapi(sorted(resources.policy.categories))

    @get("/docs", include_in_schema=False, media_type="text/html")
    async def docs(self, request: Request[Any, Any, Any], resources: Resources) -> bytes:
        """Litestar's interactive API page (Swagger UI) over the same document."""
        return _DOCS_PAGE.render(request, build_openapi(sorted(resources.policy.categories)))
