"""Resources built when the app starts and closed when it stops, injected into controllers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from litestar import Litestar
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.cache.exact import ExactCache
from app.cache.version import VersionTag, sweep_stale_versions
from app.metrics import Metrics
from app.pipeline import CACHE_ERRORS, ChatPipeline
from app.policy import Policy
from app.settings import Settings
from app.upstream import Upstream

logger = logging.getLogger("strata.lifespan")


@dataclass
class Resources:
    """Everything a request may need, built once per worker process."""

    settings: Settings
    policy: Policy
    redis: Redis
    versions: VersionTag
    upstream: Upstream
    metrics: Metrics
    pipeline: ChatPipeline
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        """Run work in the background; failures are logged, the task is kept until done."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)

        def _done(finished: asyncio.Task[Any]) -> None:
            self.background.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                logger.error("background task %s failed: %r", name, finished.exception())

        task.add_done_callback(_done)


def connect_redis(settings: Settings) -> Redis:
    """A Redis client that fails fast: a slow or absent Redis must cost a miss, not a stall."""
    return Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
        max_connections=settings.redis_max_connections,
        # One immediate retry: it replaces a pooled connection that died with a Redis restart.
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
    )


def build_resources(settings: Settings) -> Resources:
    policy = Policy.load(settings.resolve(settings.policy_file))
    redis = connect_redis(settings)
    versions = VersionTag(redis)
    upstream = Upstream(settings)
    metrics = Metrics()
    layers = [ExactCache(redis)]
    pipeline = ChatPipeline(settings=settings, versions=versions, layers=layers, upstream=upstream, metrics=metrics)
    return Resources(
        settings=settings, policy=policy, redis=redis, versions=versions,
        upstream=upstream, metrics=metrics, pipeline=pipeline,
    )


async def sweep_after(resources: Resources, current: str) -> None:
    try:
        await sweep_stale_versions(resources.redis, current)
    except CACHE_ERRORS as exc:
        logger.warning("sweep of stale versions failed (entries still expire by TTL): %r", exc)


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    resources: Resources = app.state.resources_factory()
    app.state.resources = resources
    try:
        current = await resources.versions.refresh()
    except CACHE_ERRORS as exc:
        # Start anyway: the service answers from the upstream until Redis is back.
        logger.warning("Redis is unavailable at start-up, serving without cache: %r", exc)
    else:
        logger.info("cache version %s", current)
        resources.spawn(sweep_after(resources, current), "sweep-stale-versions")
    try:
        yield
    finally:
        for task in list(resources.background):
            task.cancel()
        await asyncio.gather(*resources.background, return_exceptions=True)
        await resources.upstream.close()
        await resources.redis.aclose()
