"""The one place the cache's parts are put together: for the service (app/lifespan.py), the
operators' commands (app/ops.py, ``strata faq load``) and the replay.

Everything that lives in Redis is built over a set of buckets (one Redis is one bucket; a
cluster has several, app/cache/storage/buckets.py) into one :class:`CacheParts`; a cluster that answers
only after start-up gets a new :class:`CacheParts`, put in place whole. Above the cache (the
pipeline, the relay) nothing knows whether it talks to one Redis or to a cluster: the routed
parts (app/cache/routed.py) implement the same protocols as their single-node peers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import msgspec
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from app.cache.decision.verify import CandidateCheck, PairVerifier, load_verifier
from app.cache.layered import LayeredCache, RequestCache
from app.cache.learning.feedback import Feedback, FeedbackTarget, Verdicts
from app.cache.learning.learner import AnswerLearner
from app.cache.learning.observations import ObservationWriter
from app.cache.learning.receipts import ResponseIds, parse_secrets
from app.cache.learning.review import ReviewQueue
from app.cache.readers.base import Reader, Unanimous
from app.cache.readers.embedder import (
    INTENT_PROMPTS,
    BatchedVectors,
    EmbedderReader,
    LocalModelVectors,
    vector_source,
)
from app.cache.readers.judge import LLMJudge
from app.cache.readers.onnx_vectors import OnnxModelVectors, is_onnx_folder
from app.cache.readers.queue import ReadQueue
from app.cache.routed import RoutedCache, RoutedInvalidator
from app.cache.semantic import SemanticCache
from app.cache.storage.buckets import Bucket, Buckets, open_buckets
from app.cache.storage.contract import CacheLayer
from app.cache.storage.embeddings import CachedEmbeddings, EmbeddingsCache
from app.cache.storage.exact import ExactCache
from app.cache.storage.index import adopt_embedder, index_dims
from app.cache.storage.intents import HeadReader, IntentHeads, IntentStore
from app.cache.storage.invalidation import AuditLog, CacheInvalidator, Invalidator
from app.cache.storage.recent import RecentHits
from app.cache.storage.version import ScopeGenerations, VersionTag
from app.embed import BatchingEmbedder, Encoder, load_encoder
from app.metrics import Metrics
from app.pipeline import ChatPipeline
from app.policy import Policy
from app.relay import Relay
from app.settings import SemanticSettings, Settings
from app.singleflight import SingleFlight
from app.token_caps import TokenCaps
from app.upstream import Upstream

logger = logging.getLogger("strata.assembly")

# Operators' commands wait longer for Redis than requests do (a scan, an index build).
TOOL_REDIS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SemanticParts:
    """What every bucket's semantic layer shares: the embedder and the verification.

    Attributes:
        embedder: The embedding model behind its batching queue.
        verifier: The guards and the learned verifier (its analyzer compares answers too).
        check: Verification as the semantic layer runs it (counts every verdict).
        judge: The LLM judge of categories that ask for one; ``None`` in tools that never judge.
        reader: The grey zone's reader (app/cache/readers); ``None``: none configured.
        reads: Its reads after the response, shared by every bucket of the worker.
        head_reader: What the teams' intent heads read (the index's vectors unless
            ``STRATA_INTENT_EMBEDDER`` names a second embedder); ``None``: the index's.
        english_reader: What the heads of English files read when no ``STRATA_INTENT_EMBEDDER``
            is named (``STRATA_INTENT_READER_EN``); ``None``: none here, they read ``head_reader``.
    """

    embedder: BatchingEmbedder
    verifier: PairVerifier
    check: CandidateCheck
    judge: LLMJudge | None = None
    reader: Reader | None = None
    reads: ReadQueue | None = None
    head_reader: HeadReader | None = None
    english_reader: HeadReader | None = None

    def heads_read(self) -> HeadReader:
        """The heads' reader (the index's own vectors when none was configured)."""
        return self.head_reader or HeadReader(None, f"{self.embedder.name}:{self.embedder.dims}")

    def close(self) -> None:
        self.embedder.close()


@dataclass(frozen=True)
class BucketCache:
    """The cache of one bucket (the whole Redis on a single node)."""

    bucket: Bucket
    versions: VersionTag
    generations: ScopeGenerations
    cache: LayeredCache
    semantic: SemanticCache | None
    invalidator: CacheInvalidator
    review: ReviewQueue
    learner: AnswerLearner | None


@dataclass(frozen=True)
class CacheParts:
    """Everything that lives in Redis, over one set of buckets.

    Attributes:
        buckets: The buckets (none yet: a cluster that has not answered; every request bypasses).
        each: The cache of each bucket, in the buckets' order.
        cache: What the pipeline asks: the one bucket's layered cache, or the routed one.
        invalidator: What operators ask: the one bucket's invalidator, or the routed one.
        embeddings: ``/v1/embeddings`` cache-aside.
        feedback: ``/v1/feedback`` (``None`` before a cluster answers).
        flight: Single flight across workers (``None`` before a cluster answers).
        caps: L4's learnt ``max_tokens`` (``None`` before a cluster answers).
        intents: The teams' intent heads, this worker's copy (``None``: no semantic layer or Redis).
    """

    buckets: Buckets
    each: tuple[BucketCache, ...]
    cache: RequestCache
    invalidator: Invalidator
    embeddings: CachedEmbeddings
    feedback: Feedback | None
    flight: SingleFlight | None
    caps: TokenCaps | None
    intents: IntentHeads | None = None

    @property
    def shared(self) -> Redis | RedisCluster | None:
        """The client of the keys outside any bucket (usage, leases, the audit stream)."""
        return self.buckets.shared

    @property
    def known_version(self) -> str | None:
        """The version tag last read (every bump moves every bucket's); ``None`` before a
        cluster answers or before the first read."""
        return self.each[0].versions.known if self.each else None

    @property
    def semantic(self) -> SemanticCache | None:
        """The first bucket's semantic layer: what every bucket's shares (the embedder, the
        pooled figures of every bucket)."""
        return self.each[0].semantic if self.each else None


def configured_reader(options: SemanticSettings) -> Reader | None:
    """The readers the settings name: the LLM judge (``judge_url``), the second embedder
    (``reader_embedder``), both (a yes needs both), or none."""
    readers: list[Reader] = []
    if options.reader_embedder:
        source = vector_source(options.reader_embedder, options.reader_embedder_threads, options.judge_timeout_s,
                               options.judge_api_key, options.reader_embedder_model)
        readers.append(EmbedderReader(source, options.reader_threshold))
    if options.judge_url:
        readers.append(LLMJudge.on_endpoint(options.judge_url, options.judge_model, options.judge_timeout_s, options.judge_api_key))
    if len(readers) > 1:
        return Unanimous(readers)
    return readers[0] if readers else None


def semantic_parts(settings: Settings, encoder: Encoder, metrics: Metrics, upstream: Upstream | None,
                   reader: Reader | None = None) -> SemanticParts:
    """The semantic layer's shared parts over a loaded embedding model.

    Args:
        settings: The settings (batching, verifier files, judge).
        encoder: The embedding model.
        metrics: Where embedding batches and verdicts are counted.
        upstream: The model server the judge asks; ``None``: no judge (tools).
        reader: The grey zone's reader; ``None``: the LLM judge at ``judge_url`` if set, else none.
    """
    options = settings.semantic

    def count_batch(size: int) -> None:
        metrics.embed_batches.inc()
        metrics.embed_texts.inc(size)

    embedder = BatchingEmbedder(
        encoder, window_ms=options.embed_batch_window_ms, max_batch=options.embed_max_batch,
        max_batch_chars=options.embed_max_batch_chars, max_pending=options.embed_max_pending, on_batch=count_batch,
    )
    verifier = load_verifier(settings)
    judge = LLMJudge.on_upstream(upstream, options.judge_timeout_s, options.judge_model) if upstream is not None else None
    if reader is None:
        reader = configured_reader(options)
    reads = None
    if reader is not None:
        reads = ReadQueue(reader, options.reader_max_pending,
                          on_read=lambda name, verdict: metrics.reader_verdicts.labels(name, "after", verdict).inc(),
                          on_pending=metrics.judge_pending.set)
    return SemanticParts(embedder, verifier, CandidateCheck(verifier, confirm=judge, on_verdict=metrics.verdict), judge,
                         reader, reads, configured_head_reader(options), english_head_reader(settings))


def configured_head_reader(options: SemanticSettings) -> HeadReader | None:
    """``STRATA_INTENT_EMBEDDER``: a second embedder the teams' intent heads read (a
    sentence-transformers folder with its classification prompt, or an embeddings URL); ``None``
    (unset): they read the index's vectors."""
    if not options.intent_embedder:
        return None
    source = vector_source(options.intent_embedder, options.intent_embedder_threads, options.judge_timeout_s,
                           options.judge_api_key, options.intent_embedder_model, prompts=INTENT_PROMPTS)
    if isinstance(source, LocalModelVectors | OnnxModelVectors):  # every question of the category is read: batch them
        source = BatchedVectors(source, max_pending=options.embed_max_pending)
    return HeadReader(source, source.fingerprint)


def english_head_reader(settings: Settings) -> HeadReader | None:
    """``STRATA_INTENT_READER_EN``: the ONNX encoder the heads of English files read, when no
    ``STRATA_INTENT_EMBEDDER`` names one reader for all and the folder is there (``None`` else,
    said once in the log: English files then read the index's vectors)."""
    options = settings.semantic
    if options.intent_embedder or options.intent_reader_en in ("", "off"):
        return None
    folder = settings.resolve(options.intent_reader_en)
    if not is_onnx_folder(str(folder)):
        logger.info("no English intent reader at %s (strata intents export-reader writes it): English teams' heads "
                    "read the index's vectors", folder)
        return None
    source = BatchedVectors(OnnxModelVectors(str(folder), options.intent_embedder_threads),
                            max_pending=options.embed_max_pending)
    return HeadReader(source, source.fingerprint)


def response_ids(settings: Settings) -> ResponseIds:
    """What mints and opens hits' response ids (the configured secrets; else, once adopted, the
    one kept in Redis)."""
    return ResponseIds(parse_secrets(settings.response_id_secrets), settings.feedback_ttl_s)


def assemble(settings: Settings, policy: Policy, buckets: Buckets, metrics: Metrics,
             parts: SemanticParts | None, ids: ResponseIds | None = None) -> CacheParts:
    """The cache over ``buckets``.

    Args:
        settings: The settings.
        policy: The categories.
        buckets: Where the cache lives (none yet: a cluster not reachable).
        metrics: Where the cache counts.
        parts: The semantic layer's shared parts; ``None``: exact only.
        ids: The response ids feedback opens; ``None``: from the settings (tools).
    """
    ids = ids if ids is not None else response_ids(settings)
    options = settings.semantic
    audit = AuditLog(buckets.shared) if buckets.shared is not None else None
    # The teams' intent heads (issue #46): one copy per worker, shared by every bucket.
    intents = IntentHeads(IntentStore(buckets.shared), parts.heads_read(), parts.english_reader) \
        if parts is not None and buckets.shared is not None else None
    each = []
    for bucket in buckets.all:
        redis, keys = bucket.redis, bucket.keys
        versions = VersionTag(redis, keys)
        generations = ScopeGenerations(redis, keys)
        layers: list[CacheLayer] = [ExactCache(redis, keys)]
        semantic = learner = None
        review = ReviewQueue(redis, keys)
        if parts is not None:
            semantic = SemanticCache(redis, parts.embedder, settings.resolve(options.index_schema), parts.check,
                                     learning_refresh_s=options.learning_refresh_s, keys=keys,
                                     pool_sources=[(b.redis, b.keys) for b in buckets.all],
                                     max_question_chars=options.semantic_max_question_chars, reader=parts.reader,
                                     on_read=lambda name, verdict: metrics.reader_verdicts.labels(name, "now", verdict).inc(),
                                     intents=intents)
            layers.append(semantic)
            learner = AnswerLearner(redis, parts.embedder, parts.verifier.analyzer, judge=parts.judge,
                                    documents_of=semantic.documents_of, keys=keys, reads=parts.reads,
                                    review=review)
        cache = LayeredCache(versions, layers, metrics, lookup_timeout_s=settings.lookup_timeout_s,
                             judge_timeout_s=options.judge_timeout_s, learner=learner,
                             max_learning=options.learning_max_pending, generations=generations)
        invalidator = CacheInvalidator(redis, versions, generations, policy, semantic, audit=audit)
        each.append(BucketCache(bucket, versions, generations, cache, semantic, invalidator, review, learner))
    routed: RequestCache
    invalidating: Invalidator
    if buckets.clustered:
        routed = RoutedCache(buckets, [b.cache for b in each], metrics)
        invalidating = RoutedInvalidator(buckets, [b.invalidator for b in each], policy, audit)
    else:
        routed, invalidating = each[0].cache, each[0].invalidator
    flight = caps = None
    if buckets.shared is not None:
        # Leases, L4's statistics and usage counts are single keys: the cluster client routes them.
        # A follower waits at most for a leader's whole model call (the upstream's timeout and a lease).
        flight = SingleFlight(buckets.shared, metrics, lease_s=settings.singleflight_lease_s,
                              poll_s=settings.singleflight_poll_s,
                              max_wait_s=settings.upstream.timeout_s + settings.singleflight_lease_s)
        caps = TokenCaps(buckets.shared, settings.limits, metrics)
    # /v1/embeddings responses live in the first bucket on a cluster (one script: version + entry).
    stored = EmbeddingsCache(each[0].bucket.redis, each[0].versions, settings.embeddings_ttl_s) \
        if each and settings.embeddings_ttl_s > 0 else None
    embeddings = CachedEmbeddings(stored, metrics)
    feedback = None
    if each and buckets.shared is not None and audit is not None:
        targets = [FeedbackTarget(b.bucket.redis, ObservationWriter(b.bucket.redis, b.bucket.keys)) for b in each]
        feedback = Feedback(Verdicts(buckets.shared, ids), targets, buckets.holding, audit)
    return CacheParts(buckets=buckets, each=tuple(each), cache=routed, invalidator=invalidating,
                      embeddings=embeddings, feedback=feedback, flight=flight, caps=caps, intents=intents)


def pipeline_over(parts: CacheParts, settings: Settings, upstream: Upstream, metrics: Metrics,
                  ids: ResponseIds | None = None, recent: RecentHits | None = None) -> ChatPipeline:
    """The request path over a cache: lookups, single flight, the relay and the write-back."""
    relay = Relay(upstream, parts.cache, metrics, parts.caps)
    return ChatPipeline(limits=settings.limits, cache=parts.cache, relay=relay, metrics=metrics,
                        flight=parts.flight, caps=parts.caps, ids=ids, recent=recent,
                        max_checks=settings.semantic.max_hit_checks)


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


@asynccontextmanager
async def open_cache(settings: Settings, *, semantic: bool) -> AsyncIterator[CacheParts]:
    """The cache of the configured Redis for an operator's command (every bucket's, on a
    cluster), with a longer Redis timeout than requests get; closed on exit.

    Args:
        settings: The settings.
        semantic: Whether to load the embedding model (finding a question's entry, loading
            curated answers); without it the cache is exact only.

    Raises:
        ClusterUnavailable: A cluster whose slot map cannot be read.
    """
    policy = Policy.load(settings.resolve(settings.policy_file))
    buckets = await open_buckets(msgspec.structs.replace(settings.redis, timeout_s=TOOL_REDIS_TIMEOUT_S))
    parts = None
    try:
        if semantic and settings.semantic.enabled:
            options = settings.semantic
            encoder = await asyncio.to_thread(load_encoder, options.embedder, options.embedder_model)
            parts = semantic_parts(settings, encoder, Metrics(), upstream=None)
        yield assemble(settings, policy, buckets, Metrics(), parts)
    finally:
        await buckets.aclose()
        if parts is not None:
            parts.close()
