"""``POST /v1/feedback``: an end user's verdict on a served answer (app/cache/learning/feedback.py)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, post

from app.api.protocol import parse_view, read_body
from app.cache.learning.feedback import FeedbackError, FeedbackRequest
from app.cache.storage.contract import CACHE_ERRORS
from app.errors import CacheUnavailable, Conflict, InvalidRequest, NotFound
from app.lifespan import Resources
from app.protocols.events import chat_completion_id


class FeedbackController(Controller):
    path = "/v1"

    @post("/feedback", status_code=200)
    async def feedback(self, request: Request[Any, Any, Any], resources: Resources) -> dict[str, Any]:
        """Give a verdict on a hit: ``{"id": "chatcmpl-...", "verdict": "wrong" | "right"}``.

        ``wrong`` vetoes the semantic entry (or alias) at that similarity at once, or deletes the
        exact entry; ``right`` counts a right observation. One verdict per response, from the
        tenant it was served to (and its user's own key in per-user categories); audited.
        """
        caller = resources.tenants.caller(request.headers.get("authorization"))
        resources.rate_limiter.admit(caller.tenant)
        limits = resources.settings.limits
        given, _ = parse_view(await read_body(request, limits.body_timeout_s), FeedbackRequest, limits.max_json_depth)
        if not given.id.strip() or len(given.id) > 512:
            raise InvalidRequest("id names the response: its body's id (1 to 512 characters)", param="id",
                                 code="invalid_feedback")
        given = msgspec.structs.replace(given, id=chat_completion_id(given.id))  # resp_... and msg_... name it too
        feedback = resources.cache.feedback
        if feedback is None:
            raise CacheUnavailable("feedback needs the cache, which is not reachable yet", code="cache_unavailable")
        try:
            done = await feedback.give(given, tenant=caller.tenant, user=caller.user, who=f"tenant {caller.tenant}")
        except FeedbackError as exc:
            if exc.status == 409:
                raise Conflict(str(exc), param="id", code="feedback_exists") from exc
            raise NotFound(str(exc), param="id", code="unknown_response") from exc
        except CACHE_ERRORS as exc:
            resources.metrics.cache_failed("feedback", "store", exc)
            raise CacheUnavailable("feedback could not be recorded: the cache is not reachable",
                                   code="cache_unavailable") from exc
        resources.metrics.feedback.labels(done.verdict, done.layer).inc()
        built: dict[str, Any] = msgspec.to_builtins(done)
        return built
