"""``/health`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get

from app.cache.base import CACHE_ERRORS
from app.lifespan import Resources
from app.metrics import CONTENT_TYPE


class HealthController(Controller):
    @get("/health")
    async def health(self, resources: Resources) -> dict[str, Any]:
        """``ok`` when Redis and the upstream both answer, ``degraded`` otherwise."""
        redis: dict[str, Any] = {"status": "ok"}
        try:
            await resources.redis.ping()
            redis["version"] = resources.versions.known
        except CACHE_ERRORS as exc:
            redis = {"status": "down", "error": repr(exc)}
        up, error = await resources.upstream.healthy()
        upstream: dict[str, Any] = {"status": "ok"} if up else {"status": "down", "error": error}
        status = "ok" if redis["status"] == "ok" and up else "degraded"
        return {"status": status, "redis": redis, "upstream": upstream}

    @get("/metrics")
    async def metrics(self, resources: Resources) -> Response[bytes]:
        """Prometheus text exposition."""
        return Response(content=resources.metrics.render(), media_type=CONTENT_TYPE)
