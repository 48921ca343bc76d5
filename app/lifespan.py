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
from redis.exceptions import RedisClusterException

from app.auth import TenantResolver
from app.cache.base import CACHE_ERRORS, CacheLayer
from app.cache.buckets import Bucket, BucketedCache, Buckets, ClusterUnavailable, open_buckets
from app.cache.embeddings import EmbeddingsCache
from app.cache.exact import ExactCache
from app.cache.invalidation import BucketedInvalidator, CacheInvalidator, sweep_stale_generations
from app.cache.judge import AnswerJudge
from app.cache.layered import LayeredCache, RequestCache
from app.cache.learning import AnswerLearner
from app.cache.semantic import SemanticCache, adopt_embedder, index_dims
from app.cache.verify import CandidateCheck, load_verifier
from app.cache.version import ScopeGenerations, VersionTag, sweep_stale_versions
from app.embed import BatchingEmbedder, Encoder, load_encoder
from app.hygiene import PromptHygiene
from app.limits import TenantRateLimiter
from app.metrics import Metrics
from app.pipeline import ChatPipeline
from app.policy import Policy
from app.relay import Relay
from app.settings import Settings
from app.singleflight import SingleFlight
from app.token_caps import TokenCaps
from app.upstream import Upstream

logger = logging.getLogger("strata.lifespan")


@dataclass
class BucketCache:
    """The cache of one bucket (the whole Redis on a single node)."""

    bucket: Bucket
    versions: VersionTag
    generations: ScopeGenerations
    cache: LayeredCache
    semantic: SemanticCache | None
    invalidator: CacheInvalidator


@dataclass
class Resources:
    """Everything a request may need, built once per worker process."""

    settings: Settings
    policy: Policy
    # Keys outside any bucket: the Redis, or the RedisCluster client on a cluster (typed Any:
    # Litestar's signature model takes no union of two classes).
    redis: Any
    versions: VersionTag
    upstream: Upstream
    metrics: Metrics
    pipeline: ChatPipeline
    cache: RequestCache
    tenants: TenantResolver
    hygiene: PromptHygiene | None
    rate_limiter: TenantRateLimiter
    invalidator: CacheInvalidator
    embeddings: EmbeddingsCache | None
    buckets: Buckets
    bucket_caches: list[BucketCache]
    semantic: SemanticCache | None = None
    embedder: BatchingEmbedder | None = None
    semantic_parts: Any = None  # SemanticParts, kept to build the cache parts of a late cluster
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


@dataclass(frozen=True)
class SemanticParts:
    """What every bucket's semantic layer shares: the embedder and the verification."""

    embedder: BatchingEmbedder
    verifier: Any
    check: CandidateCheck
    judge: AnswerJudge


async def build_resources(settings: Settings, encoder: Encoder | None = None) -> Resources:
    """Build every resource of one worker.

    On a cluster that does not answer at start-up the cache parts are built once it does
    (:func:`connect_when_reachable`); until then every request is a bypass.

    Args:
        settings: The settings.
        encoder: An already loaded embedding model to use instead of loading the configured one.
    """
    policy = Policy.load(settings.resolve(settings.policy_file))
    upstream = Upstream(settings.upstream)
    metrics = Metrics(tenant_labels=settings.metrics_tenant_labels)
    parts = None
    options = settings.semantic
    if options.enabled:
        if encoder is None:
            # Loading a model takes from under a second to several: keep the loop free meanwhile.
            encoder = await asyncio.to_thread(load_encoder, options.embedder, options.embedder_model)
        # A model's first run is slow (allocation, lazy init): do it now, not in a request's lookup.
        await asyncio.to_thread(encoder.encode, ["warm-up"])

        def count_batch(size: int) -> None:
            metrics.embed_batches.inc()
            metrics.embed_texts.inc(size)

        embedder = BatchingEmbedder(
            encoder, window_ms=options.embed_batch_window_ms, max_batch=options.embed_max_batch,
            max_batch_chars=options.embed_max_batch_chars, max_pending=options.embed_max_pending, on_batch=count_batch,
        )
        verifier = load_verifier(settings)
        judge = AnswerJudge(upstream, options.judge_timeout_s, options.judge_model)
        parts = SemanticParts(embedder, verifier, CandidateCheck(verifier, confirm=judge, on_verdict=metrics.verdict), judge)
    try:
        buckets = await open_buckets(settings.redis)
    except ClusterUnavailable as exc:
        logger.warning("%r: serving without the cache until the cluster answers", exc)
        buckets = Buckets.offline()
    tenants = TenantResolver(settings.resolve(settings.keys_file) if settings.keys_file else None)
    hygiene = None if settings.prompt_hygiene == "off" else PromptHygiene.load(settings.resolve(settings.prompt_hygiene_file))
    limits = settings.limits
    rate_limiter = TenantRateLimiter(limits.tenant_rps, limits.tenant_burst or limits.tenant_rps, settings.workers)
    return Resources(settings=settings, policy=policy, upstream=upstream, metrics=metrics, tenants=tenants,
                     hygiene=hygiene, rate_limiter=rate_limiter, embedder=parts.embedder if parts else None,
                     semantic_parts=parts, **cache_parts(settings, policy, buckets, upstream, metrics, parts))


def cache_parts(settings: Settings, policy: Policy, buckets: Buckets, upstream: Upstream, metrics: Metrics,
                parts: SemanticParts | None) -> dict[str, Any]:
    """The resources that live in Redis, over ``buckets`` (none yet: a cluster not reachable)."""
    options = settings.semantic
    bucket_caches = []
    for bucket in buckets.all:
        redis, keys = bucket.redis, bucket.keys
        versions = VersionTag(redis, keys)
        generations = ScopeGenerations(redis, keys)
        layers: list[CacheLayer] = [ExactCache(redis, keys)]
        semantic = learner = None
        if parts is not None:
            semantic = SemanticCache(redis, parts.embedder, settings.resolve(options.index_schema), parts.check,
                                     learning_refresh_s=options.learning_refresh_s, keys=keys,
                                     pool_sources=[(b.redis, b.keys) for b in buckets.all],
                                     max_question_chars=options.semantic_max_question_chars)
            layers.append(semantic)
            learner = AnswerLearner(redis, parts.embedder, parts.verifier.analyzer, judge=parts.judge,
                                    documents_of=semantic.documents_of, keys=keys)
        cache = LayeredCache(versions, layers, metrics, lookup_timeout_s=settings.lookup_timeout_s,
                             judge_timeout_s=options.judge_timeout_s, learner=learner,
                             max_learning=options.learning_max_pending, generations=generations)
        invalidator = CacheInvalidator(redis, versions, generations, policy, semantic, audit=buckets.shared)
        bucket_caches.append(BucketCache(bucket, versions, generations, cache, semantic, invalidator))
    if buckets.clustered:
        layered: RequestCache = BucketedCache(buckets, [b.cache for b in bucket_caches], metrics)
        invalidator = BucketedInvalidator(buckets, [b.invalidator for b in bucket_caches], policy)
    else:
        layered, invalidator = bucket_caches[0].cache, bucket_caches[0].invalidator
    flight = caps = None
    if buckets.shared is not None:
        # Leases, L4's statistics and usage counts are single keys: the cluster client routes them.
        # A follower waits at most for a leader's whole model call (the upstream's timeout and a lease).
        flight = SingleFlight(buckets.shared, metrics, lease_s=settings.singleflight_lease_s,
                              poll_s=settings.singleflight_poll_s,
                              max_wait_s=settings.upstream.timeout_s + settings.singleflight_lease_s)
        caps = TokenCaps(buckets.shared, settings.limits, metrics)
    home = bucket_caches[0] if bucket_caches else None
    return {
        "redis": buckets.shared, "buckets": buckets, "bucket_caches": bucket_caches, "cache": layered,
        "invalidator": invalidator, "versions": home.versions if home else VersionTag(None),
        "semantic": home.semantic if home else None,
        "pipeline": ChatPipeline(limits=settings.limits, cache=layered, relay=Relay(upstream, layered, metrics, caps),
                                 metrics=metrics, flight=flight, caps=caps),
        # /v1/embeddings responses live in the first bucket on a cluster (one script: version + entry).
        "embeddings": EmbeddingsCache(home.bucket.redis, home.versions, settings.embeddings_ttl_s)
        if home and settings.embeddings_ttl_s > 0 else None,
    }


async def reconcile(redis: Redis, versions: VersionTag, semantic: SemanticCache | None) -> str:
    """The current version tag, bumped first when the stored vectors come from another embedder
    or dimension (they cannot be compared with the new ones)."""
    current = await versions.refresh()
    if semantic is None:
        return current
    embedder = semantic.embedder
    fingerprint = f"{embedder.name}:{embedder.dims}"
    previous = await adopt_embedder(redis, fingerprint, versions.keys)
    existing_dims = await index_dims(redis, versions.keys.semantic_index_name(current))
    if previous is None and existing_dims in (None, embedder.dims):
        return current
    logger.warning(
        "embedder changed (%s -> %s, index dims %s): bumping the cache version", previous, fingerprint, existing_dims
    )
    _, new = await versions.bump()
    return new


async def sweep_after(bucket: BucketCache, current: str) -> None:
    try:
        await sweep_stale_versions(bucket.bucket.redis, current, keys=bucket.bucket.keys)
    except CACHE_ERRORS as exc:
        logger.warning("sweep of stale versions failed (entries still expire by TTL): %r", exc)


async def start_cache(resources: Resources) -> None:
    """Adopt each bucket's version (bumped if the embedder changed) and start the background
    work on Redis: sweeps, usage counts and, on a cluster, following failovers."""
    for bucket in resources.bucket_caches:
        try:
            current = await reconcile(bucket.bucket.redis, bucket.versions, bucket.semantic)
        except CACHE_ERRORS as exc:
            # Start anyway: the service answers from the upstream until Redis is back.
            logger.warning("Redis (%s) is unavailable at start-up, serving without cache: %r", bucket.bucket.address, exc)
        else:
            logger.info("cache version %s (%s)", current, bucket.bucket.keys.namespace)
            resources.spawn(sweep_after(bucket, current), f"sweep-stale-versions {bucket.bucket.keys.namespace}")
    resources.spawn(resources.metrics.usage.run(resources.redis, CACHE_ERRORS), "usage-counts")
    if resources.buckets.clustered:
        resources.spawn(follow_cluster(resources), "follow-cluster")


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
        parts = cache_parts(settings, resources.policy, buckets, resources.upstream, resources.metrics,
                            resources.semantic_parts)
        for name, value in parts.items():
            setattr(resources, name, value)
        logger.info("Redis Cluster reachable: the cache is on (%d buckets)", len(buckets.all))
        await start_cache(resources)
        return


async def follow_cluster(resources: Resources) -> None:
    """On a cluster: every few seconds, move buckets whose slot changed master (a failover)."""
    while True:
        await asyncio.sleep(resources.settings.redis.cluster_refresh_s)
        try:
            await resources.buckets.follow()
        except (*CACHE_ERRORS, RedisClusterException) as exc:
            logger.warning("reading the cluster's slot map failed (buckets stay where they were): %r", exc)


async def sweep_versions_after(resources: Resources) -> None:
    """After a bump: each bucket's stale versions (the versions of all buckets move together)."""
    for bucket in resources.bucket_caches:
        try:
            current = await bucket.versions.refresh()
        except CACHE_ERRORS as exc:
            logger.warning("sweep of stale versions failed (entries still expire by TTL): %r", exc)
        else:
            await sweep_after(bucket, current)


async def sweep_generations_after(resources: Resources) -> None:
    for bucket in resources.bucket_caches:
        try:
            await sweep_stale_generations(bucket.bucket.redis, await bucket.versions.refresh(), keys=bucket.bucket.keys)
        except CACHE_ERRORS as exc:
            logger.warning("sweep of invalidated scopes failed (entries still expire by TTL): %r", exc)


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    resources: Resources = await app.state.resources_factory()
    app.state.resources = resources
    if resources.buckets.clustered and not resources.buckets.all:
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
            logger.warning("write-backs or observations still in flight at shutdown were dropped")
        for task in list(resources.background):
            task.cancel()
        await asyncio.gather(*resources.background, return_exceptions=True)
        await resources.upstream.close()
        await resources.buckets.aclose()
        if resources.embedder is not None:
            resources.embedder.close()
