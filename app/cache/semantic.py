"""L2: the semantic layer. HNSW over question embeddings in Redis Stack, through redisvl.

A cached answer can only serve a request of the same scope (tenant, model, system prompt,
earlier turns, output parameters), enforced as a TAG pre-filter on the scope's sha256 in the
KNN query: no client-controlled text ever reaches the query string. Only the last user message
is embedded. Fixed-threshold categories are decided here (guards, verifier, judge); adaptive ones
by app/cache/adaptive.py, in one call.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag

from app.cache.adaptive import (
    AdaptiveDecision,
    PooledObservations,
    Serve,
    answer_bytes,
    check_row,
    milli,
    root_of,
    score_bin,
    source_of,
)
from app.cache.base import CacheHit, CacheQuery, Candidate, EmbeddingFailed, Nearest, Verdict
from app.cache.entry import CacheEntry, EntryWriter
from app.cache.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_EMBEDDING,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SCOPE,
    FIELD_SOURCE,
    FIELD_WRONG_ABOVE,
    KEYS,
    Keyspace,
    as_text,
    faq_scope_digest,
)
from app.cache.usage import HitCounts
from app.cache.verify import WRONG_BEFORE, CandidateCheck, ThresholdVerifier
from app.embed import Embedder
from app.policy import SemanticPolicy
from app.readers.base import Reader
from app.wire import decode_completion

logger = logging.getLogger("strata.semantic")

SEMANTIC = "semantic"
DISTANCE_FIELD = "vector_distance"
# Candidates compared per lookup: the best one that passes verification is served. Adaptive
# categories look at more, to find the nearest document serving another answer (the margin).
CANDIDATES = 3
# The verdict counted for a question longer than the semantic layer takes.
QUESTION_TOO_LONG = "question_too_long"
ADAPTIVE_CANDIDATES = 8


def scope_filter(query: CacheQuery) -> FilterExpression:
    """The KNN pre-filter: the request's scope digest or its tenant's curated-answer scope (hex),
    and the category (a policy name), nothing a client wrote; redisvl escapes them all the same."""
    canonical = query.canonical
    scopes = [query.scope_digest, faq_scope_digest(canonical.tenant, query.category.name)]
    return (Tag(FIELD_SCOPE) == scopes) & (Tag(FIELD_CATEGORY) == query.category.name)


class SemanticCache:
    """Nearest cached question in the same scope, if similar enough and verified."""

    name = SEMANTIC

    def __init__(
        self, redis: Redis, embedder: Embedder, schema_path: Path, check: CandidateCheck | None = None, *,
        memo_size: int = 4096, learning_refresh_s: float = 1.0, keys: Keyspace = KEYS,
        pool_sources: Sequence[tuple[Redis, Keyspace]] = (), max_question_chars: int = 1_000,
        reader: Reader | None = None, on_read: Callable[[str, str], None] | None = None,
    ) -> None:
        self._redis = redis
        self.keys = keys
        self._embedder = embedder
        self._schema_template = yaml.safe_load(schema_path.read_text(encoding="utf-8"))
        self._check = check or CandidateCheck(ThresholdVerifier())
        self.adaptive = AdaptiveDecision(redis, self._check,
                                         PooledObservations(redis, learning_refresh_s, keys, pool_sources), keys=keys,
                                         reader=reader, on_read=on_read)
        self._writer = EntryWriter(redis, keys)
        self.hits = HitCounts(redis)
        self._indexes: dict[str, AsyncSearchIndex] = {}
        self._index_lock = asyncio.Lock()
        # Recent question embeddings: the write-back after a miss reuses the lookup's vector. Keyed
        # by tenant too: a memo shared by tenants would answer one tenant's lookup faster when
        # another had asked the same question, telling it what the other asks.
        self._memo: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._memo_size = memo_size
        self._max_question_chars = max_question_chars

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @property
    def keys_redis(self) -> Redis:
        """The Redis holding this layer's documents (its bucket's, on a cluster)."""
        return self._redis

    def schema_for(self, tag: str) -> dict[str, Any]:
        schema: dict[str, Any] = copy.deepcopy(self._schema_template)
        schema["index"]["name"] = self.keys.semantic_index_name(tag)
        schema["index"]["prefix"] = self.keys.semantic_prefix(tag)
        for field in schema["fields"]:
            if field["name"] == FIELD_EMBEDDING:
                field["attrs"]["dims"] = self._embedder.dims
        return schema

    async def index(self, tag: str) -> AsyncSearchIndex:
        """The index of a version, created on first use (kept when it already exists)."""
        index = self._indexes.get(tag)
        if index is not None:
            return index
        async with self._index_lock:
            index = self._indexes.get(tag)
            if index is None:
                index = AsyncSearchIndex.from_dict(self.schema_for(tag), redis_client=self._redis)
                await index.create(overwrite=False)
                logger.info("semantic index %s ready (%s, %d dims)", self.keys.semantic_index_name(tag),
                            self._embedder.name, self._embedder.dims)
                self._indexes[tag] = index
        return index

    def forget_index(self, tag: str) -> None:
        self._indexes.pop(tag, None)

    async def vector(self, question: str, tenant: str) -> np.ndarray:
        """The question's embedding (memoised per tenant).

        Raises:
            EmbeddingFailed: The model failed; the pipeline treats it as a cache failure.
        """
        memo_key = (tenant, question)
        cached = self._memo.get(memo_key)
        if cached is not None:
            self._memo.move_to_end(memo_key)
            return cached
        try:
            vector: np.ndarray = (await self._embedder.embed([question], owner=tenant))[0]
        except Exception as exc:  # any model failure becomes a cache failure, never a 500
            raise EmbeddingFailed(f"{self._embedder.name}: {exc!r}") from exc
        self._memo[memo_key] = vector
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return vector

    async def candidates(self, query: CacheQuery, vector: np.ndarray, limit: int = CANDIDATES) -> list[Nearest]:
        """The nearest cached questions in the query's scope and category, most similar first."""
        index = await self.index(query.version)
        knn = VectorQuery(
            vector=vector.astype(np.float32).tobytes(),
            vector_field_name=FIELD_EMBEDDING,
            return_fields=[FIELD_QUESTION, FIELD_ANSWER, FIELD_ROOT, FIELD_WRONG_ABOVE, FIELD_SOURCE],
            filter_expression=scope_filter(query),
            num_results=limit,
            return_score=True,
        )
        try:
            rows = await index.query(knn)
        except (ResponseError, RedisSearchError) as exc:
            if "no such index" not in str(exc).lower():
                raise
            # Dropped from outside (an operator, FLUSHALL): re-create it, and nothing is in it.
            self.forget_index(query.version)
            await self.index(query.version)
            return []
        # RediSearch's cosine distance is 1 - cosine similarity.
        return [Nearest(row["id"], 1.0 - float(row[DISTANCE_FIELD]), row) for row in rows]

    def serves(self, question: str | None, policy: SemanticPolicy) -> bool:
        """Whether this layer looks up and stores the question: a text of at most the configured
        length, in a category whose semantic layer is on."""
        return question is not None and policy.enabled and len(question) <= self._max_question_chars

    async def lookup(self, query: CacheQuery) -> CacheHit | Candidate | None:
        question, policy = query.canonical.question, query.category.semantic
        if question is not None and policy.enabled and len(question) > self._max_question_chars:
            self._check.held(QUESTION_TOO_LONG)  # counted; the exact layer still serves it
        if question is None or not self.serves(question, policy):
            return None
        vector = await self.vector(question, query.canonical.tenant)
        if policy.adaptive:
            decided = await self.adaptive.decide(query, question, await self.candidates(query, vector, ADAPTIVE_CANDIDATES))
            if isinstance(decided, Serve):
                return self._hit(decided.row, decided.reason, decided.score_bin)
            return decided
        for row in await self.candidates(query, vector):
            if row.similarity < policy.threshold:
                break  # most similar first: the rest are below too
            check_row(row)
            if milli(row.similarity) <= int(row.fields.get(FIELD_WRONG_ABOVE) or -1):
                # An end user said this document's answer was wrong at this similarity or below.
                self._check.count(Verdict(False, WRONG_BEFORE))
                continue
            verdict = await self._check.decide(question, row.fields[FIELD_QUESTION], row.similarity, policy,
                                               query.canonical.model)
            if verdict.accepted:
                return self._hit(row, verdict.reason, score_bin(row.similarity))
        return None

    def _hit(self, row: Nearest, reason: str, bin_: int) -> CacheHit:
        self.hits.add(row.key)  # added in a batch every second: no round trip per hit
        return CacheHit(layer=self.name, completion=answer_bytes(row), similarity=row.similarity,
                        matched_question=row.fields[FIELD_QUESTION], reason=reason, source=source_of(row),
                        key=root_of(row), document=row.key, score_bin=bin_)

    async def documents_of(self, tag: str, root: str) -> set[str]:
        """The keys of every document serving an entry's answer: the entry and its aliases."""
        index = await self.index(tag)
        found: set[str] = set()
        offset = 0
        while True:
            query = FilterQuery(Tag(FIELD_ROOT) == root, return_fields=[FIELD_ROOT], num_results=500)
            query.paging(offset, 500)
            rows = await index.query(query)
            found.update(row["id"] for row in rows)
            if len(rows) < 500:
                return found
            offset += 500

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        canonical, policy = query.canonical, query.category.semantic
        if canonical.question is None or not self.serves(canonical.question, policy):
            return
        if not policy.tool_calls and calls_tools(completion):
            return  # an action is served only to the request it was made for (the exact layer)
        await self.index(query.version)
        vector = await self.vector(canonical.question, canonical.tenant)
        key = self.keys.semantic_prefix(query.version) + query.entry_digest
        entry = CacheEntry.for_query(
            query, completion, scope=query.scope_digest, embedding=vector.astype(np.float32).tobytes(), root=key
        )
        await self._writer.write(key, entry, query)


def calls_tools(completion: bytes) -> bool:
    """Whether a stored answer calls tools (``tool_calls`` or the legacy ``function_call``)."""
    if b"tool_calls" not in completion and b"function_call" not in completion:
        return False  # the common case, without decoding
    decoded = decode_completion(completion)
    if decoded is None:
        return True  # not ours to judge: keep it out of the semantic layer
    return any((choice.get("message") or {}).get("tool_calls") or (choice.get("message") or {}).get("function_call")
               for choice in decoded.get("choices") or [])


async def index_dims(redis: Redis, name: str) -> int | None:
    """The vector dimension of an existing index, or ``None`` when there is no such index."""
    try:
        info = await redis.ft(name).info()
    except ResponseError:
        return None
    for attribute in info.get("attributes", []):
        pairs = dict(zip(attribute[::2], attribute[1::2], strict=False))
        decoded = {(k.decode() if isinstance(k, bytes) else k): v for k, v in pairs.items()}
        if decoded.get("type") in (b"VECTOR", "VECTOR"):
            dim = decoded.get("dim")
            return int(dim) if dim is not None else None
    return None


async def adopt_embedder(redis: Redis, fingerprint: str, keys: Keyspace = KEYS) -> str | None:
    """Record the embedder in use; returns the previous one when it was a different embedder.

    Vectors of different embedders cannot be compared, so the caller bumps the version tag.
    ``SET ... GET`` makes this atomic: of several workers starting with a new embedder, only the
    first sees the old fingerprint.
    """
    previous = await redis.set(keys.embedder_key, fingerprint, get=True)
    if previous is None:
        return None
    previous_text = as_text(previous)
    return None if previous_text == fingerprint else previous_text
