"""Resources built when the app starts and closed when it stops, injected into controllers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from litestar import Litestar
from redis.exceptions import RedisClusterException

from app.assembly import (
    BucketCache,
    CacheParts,
    SemanticParts,
    assemble,
    pipeline_over,
    reconcile,
    response_ids,
    semantic_parts,
)
from app.auth import AdminToken, TenantResolver
from app.cache.learning.receipts import ResponseIds
from app.cache.readers.base import Reader
from app.cache.storage.buckets import Buckets, ClusterUnavailable, open_buckets
from app.cache.storage.contract import CACHE_ERRORS, SharedRedis
from app.cache.storage.invalidation import sweep_stale_generations
from app.cache.storage.recent import RecentHits
from app.cache.storage.usage import UsageCounts
from app.cache.storage.version import sweep_stale_versions
from app.embed import Encoder, load_encoder
from app.hygiene import PromptHygiene
from app.limits import TenantRateLimiter
from app.metrics import Metrics
from app.pipeline import ChatPipeline
from app.policy import Policy
from app.settings import Settings
from app.upstream import Upstream

logger = logging.getLogger("strata.lifespan")

# How often a worker checks that Redis still holds the response-id secret it signs with.
RESPONSE_SECRET_CHECK_S = 60.0


@dataclass
class Resources:
    """Everything a request may need, built once per worker process.

    Attributes:
        cache: Everything that lives in Redis; replaced whole when a cluster answers late.
        pipeline: The request path over ``cache``; replaced with it (:meth:`use`).
        usage: This worker's requests by category and outcome, flushed to Redis.
        semantic_parts: The embedder and the verification, kept to build a late cluster's cache.
        ids: Mints hits' response ids and opens them for feedback (its secret adopted at start).
        recent: This worker's recent semantic hits, in memory (the console's "served" page).
    """

    settings: Settings
    policy: Policy
    upstream: Upstream
    metrics: Metrics
    usage: UsageCounts
    tenants: TenantResolver
    admin: AdminToken
    hygiene: PromptHygiene | None
    rate_limiter: TenantRateLimiter
    semantic_parts: SemanticParts | None
    cache: CacheParts
    pipeline: ChatPipeline
    ids: ResponseIds
    recent: RecentHits
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def use(self, cache: CacheParts) -> None:
        """Serve from ``cache`` from now on (a cluster that answered after start-up)."""
        self.cache = cache
        self.pipeline = pipeline_over(cache, self.settings, self.upstream, self.metrics, self.ids, self.recent)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        """Run work in the background; failures are logged, the task is kept until done."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)

        def _done(finished: asyncio.Task[Any]) -> None:
            self.background.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                logger.error("background task %s failed: %r", name, finished.exception())

        task.add_done_callback(_done)


async def build_resources(settings: Settings, encoder: Encoder | None = None, reader: Reader | None = None) -> Resources:
    """Build every resource of one worker.

    On a cluster that does not answer at start-up the cache parts are built once it does
    (:func:`connect_when_reachable`); until then every request is a bypass.

    Args:
        settings: The settings.
        encoder: An already loaded embedding model to use instead of loading the configured one.
        reader: The grey zone's reader to use instead of the configured one (simulated replays).
    """
    policy = Policy.load(settings.resolve(settings.policy_file))
    upstream = Upstream(settings.upstream)
    usage = UsageCounts()
    metrics = Metrics(tenant_labels=settings.metrics_tenant_labels, outcomes=usage)
    parts = None
    options = settings.semantic
    if options.enabled:
        if encoder is None:
            # Loading a model takes from under a second to several: keep the loop free meanwhile.
            encoder = await asyncio.to_thread(load_encoder, options.embedder, options.embedder_model)
        # A model's first run is slow (allocation, lazy init): do it now, not in a request's lookup.
        await asyncio.to_thread(encoder.encode, ["warm-up"])
        parts = semantic_parts(settings, encoder, metrics, upstream, reader)
    try:
        buckets = await open_buckets(settings.redis)
    except ClusterUnavailable as exc:
        logger.warning("%r: serving without the cache until the cluster answers", exc)
        buckets = Buckets.offline()
    tenants = TenantResolver(settings.resolve(settings.keys_file) if settings.keys_file else None)
    hygiene = None if settings.prompt_hygiene == "off" else PromptHygiene.load(settings.resolve(settings.prompt_hygiene_file))
    limits = settings.limits
    rate_limiter = TenantRateLimiter(limits.tenant_rps, limits.tenant_burst or limits.tenant_rps, settings.workers)
    ids = response_ids(settings)
    recent = RecentHits()
    cache = assemble(settings, policy, buckets, metrics, parts, ids)
    admin = AdminToken(settings.admin_token,
                       settings.resolve(settings.admin_token_file) if settings.admin_token_file else None)
    return Resources(ids=ids, settings=settings, policy=policy, upstream=upstream, metrics=metrics, usage=usage, tenants=tenants,
                     admin=admin,
                     hygiene=hygiene, rate_limiter=rate_limiter, semantic_parts=parts, cache=cache,
                     pipeline=pipeline_over(cache, settings, upstream, metrics, ids, recent), recent=recent)


async def sweep_after(bucket: BucketCache, current: str) -> None:
    try:
        await sweep_stale_versions(bucket.bucket.redis, current, keys=bucket.bucket.keys)
    except CACHE_ERRORS as exc:
        logger.warning("sweep of stale versions failed (entries still expire by TTL): %r", exc)


async def start_cache(resources: Resources) -> None:
    """Adopt each bucket's version (bumped if the embedder changed) and start the background
    work on Redis: sweeps, usage counts and, on a cluster, following failovers."""
    for bucket in resources.cache.each:
        try:
            current = await reconcile(bucket.bucket.redis, bucket.versions, bucket.semantic)
        except CACHE_ERRORS as exc:
            # Start anyway: the service answers from the upstream until Redis is back.
            logger.warning("Redis (%s) is unavailable at start-up, serving without cache: %r", bucket.bucket.address, exc)
        else:
            logger.info("cache version %s (%s)", current, bucket.bucket.keys.namespace)
            resources.spawn(sweep_after(bucket, current), f"sweep-stale-versions {bucket.bucket.keys.namespace}")
    shared = resources.cache.shared
    assert shared is not None  # started once there are buckets
    resources.spawn(resources.usage.run(shared, CACHE_ERRORS), "usage-counts")
    try:
        await resources.ids.adopt(shared)  # before the first hit, so every hit's id can be opened
    except CACHE_ERRORS as exc:
        logger.warning("response-id secret not read yet (hits get plain ids until it is): %r", exc)
    resources.spawn(adopt_response_secret(resources.ids, shared, resources.settings.redis.cluster_refresh_s),
                    "response-id-secret")
    for bucket in resources.cache.each:
        if bucket.semantic is not None:
            resources.spawn(bucket.semantic.hits.run(CACHE_ERRORS), f"semantic-hit-counts {bucket.bucket.keys.namespace}")
    if resources.cache.intents is not None:
        try:
            await resources.cache.intents.refresh()  # before the first request: a loaded head serves at once
        except CACHE_ERRORS as exc:
            logger.warning("intent heads not read yet (read again in the background): %r", exc)
        resources.spawn(resources.cache.intents.run(), "intent-heads")
    if resources.cache.buckets.clustered:
        resources.spawn(follow_cluster(resources), "follow-cluster")


async def adopt_response_secret(ids: ResponseIds, shared: SharedRedis, retry_s: float) -> None:
    """Keep the response-id secret agreed with Redis: again until Redis answers (until then hits'
    ids are plain), then every minute (a Redis that lost the key gets this worker's back)."""
    while ids.ttl_s > 0 and not ids.configured:
        await asyncio.sleep(RESPONSE_SECRET_CHECK_S if ids.ready else max(retry_s, 0.5))
        try:
            await ids.adopt(shared)
        except CACHE_ERRORS as exc:
            logger.debug("response-id secret not read: %r", exc)


async def connect_when_reachable(resources: Resources) -> None:
    """A cluster that did not answer at start-up: try again every few seconds; once it answers,
    build the cache parts over its buckets and put them in place (requests bypass until then)."""
    settings = resources.settings
    while True:
        await asyncio.sleep(settings.redis.cluster_refresh_s)
        try:
            buckets = await open_buckets(settings.redis)
        except ClusterUnavailable:
            continue
        resources.use(assemble(settings, resources.policy, buckets, resources.metrics, resources.semantic_parts,
                               resources.ids))
        logger.info("Redis Cluster reachable: the cache is on (%d buckets)", len(buckets.all))
        await start_cache(resources)
        return


async def follow_cluster(resources: Resources) -> None:
    """On a cluster: every few seconds, move buckets whose slot changed master (a failover)."""
    this = asyncio.current_task()
    while True:
        await asyncio.sleep(resources.settings.redis.cluster_refresh_s)
        try:
            await resources.cache.buckets.follow()
        except (*CACHE_ERRORS, RedisClusterException) as exc:
            logger.warning("reading the cluster's slot map failed (buckets stay where they were): %r", exc)
        # redis-py's cluster client can swallow a cancellation that lands mid-read; without this the
        # loop went on sleeping and a worker never finished its shutdown (a task dump showed it).
        if this is not None and this.cancelling():
            raise asyncio.CancelledError


async def sweep_versions_after(resources: Resources) -> None:
    """After a bump: each bucket's stale versions (the versions of all buckets move together)."""
    for bucket in resources.cache.each:
        try:
            current = await bucket.versions.refresh()
        except CACHE_ERRORS as exc:
            logger.warning("sweep of stale versions failed (entries still expire by TTL): %r", exc)
        else:
            await sweep_after(bucket, current)


async def sweep_generations_after(resources: Resources) -> None:
    for bucket in resources.cache.each:
        try:
            await sweep_stale_generations(bucket.bucket.redis, await bucket.versions.refresh(), keys=bucket.bucket.keys)
        except CACHE_ERRORS as exc:
            logger.warning("sweep of invalidated scopes failed (entries still expire by TTL): %r", exc)


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    resources: Resources = await app.state.resources_factory()
    app.state.resources = resources
    if resources.cache.buckets.clustered and not resources.cache.buckets.all:
        resources.spawn(connect_when_reachable(resources), "connect-cluster")
    else:
        await start_cache(resources)
    prefix_cache = await resources.upstream.prefix_cache()
    logger.info("upstream prefix-cache metrics: %s",
                ", ".join(prefix_cache.names) if prefix_cache else "none found (no hit ratio on /metrics and /health)")
    try:
        yield
    finally:
        try:
            async with asyncio.timeout(5):
                await resources.pipeline.settle()  # write-backs and observations in flight
        except TimeoutError:
            logger.warning("write-backs, checks or observations still in flight at shutdown were dropped")
        for task in list(resources.background):
            task.cancel()
        try:
            async with asyncio.timeout(5):  # a task that swallowed its cancellation must not hold the exit
                await asyncio.gather(*resources.background, return_exceptions=True)
        except TimeoutError:
            logger.warning("background tasks still running 5 s after shutdown began: %s",
                           ", ".join(t.get_name() for t in resources.background if not t.done()))
        # Closing a client must not keep a worker from exiting (its peer may be gone mid-close).
        for closing, what in ((resources.upstream.close, "upstream client"), (resources.cache.buckets.aclose, "Redis clients")):
            try:
                async with asyncio.timeout(5):
                    await closing()
            except TimeoutError:
                logger.warning("closing the %s took more than 5 s at shutdown; left to the process's exit", what)
        if resources.semantic_parts is not None:
            resources.semantic_parts.close()
