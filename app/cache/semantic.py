"""L2: the semantic layer. HNSW over question embeddings in Redis Stack, through redisvl.

A cached answer can only serve a request of the same scope (tenant, model, system prompt,
earlier turns, output parameters), enforced as a TAG pre-filter on the scope's sha256 in the
KNN query: no client-controlled text ever reaches the query string. Only the last user message
is embedded.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import yaml
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag

from app.cache.base import CacheHit, CacheQuery, Candidate, CorruptEntry, EmbeddingFailed, Neighbour, TurnedDown
from app.cache.entry import CacheEntry, EntryWriter
from app.cache.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_EMBEDDING,
    FIELD_HITS,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SCOPE,
    FIELD_SOURCE,
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_GUARD_OK,
    OBS_GUARD_WRONG,
    SOURCE_MODEL,
    Keyspace,
    faq_scope_digest,
)
from app.cache.learning import (
    MARGIN_WEIGHT,
    PooledObservations,
    decision_score,
    entry_record_fields,
    entry_vouches,
    score_bin,
    within_bound,
)
from app.cache.verify import CandidateCheck, ThresholdVerifier
from app.embed import Embedder
from app.policy import SemanticPolicy
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
# Other entries of model answers among those, handed to the learner with a candidate: the
# nearest few are where a second entry of the same answer would be.
NEIGHBOURS = 3


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
    ) -> None:
        self._redis = redis
        self.keys = keys
        self._embedder = embedder
        self._schema_template = yaml.safe_load(schema_path.read_text(encoding="utf-8"))
        self._check = check or CandidateCheck(ThresholdVerifier())
        self.pooled = PooledObservations(redis, learning_refresh_s, keys, pool_sources)
        self._writer = EntryWriter(redis, keys)
        # Which would-be hits are explored: random across questions and across repeats of one
        # question (a question served wrongly is checked again), and seeded, so that a replay of
        # a stream in one process makes the same draws every time.
        self._explore = random.Random(0)
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

    def schema_for(self, tag: str) -> dict[str, Any]:
        schema = copy.deepcopy(self._schema_template)
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
                logger.info("semantic index %s ready (%s, %d dims)", self.keys.semantic_index_name(tag), self._embedder.name, self._embedder.dims)
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
            vector = (await self._embedder.embed([question], owner=tenant))[0]
        except Exception as exc:  # any model failure becomes a cache failure, never a 500
            raise EmbeddingFailed(f"{self._embedder.name}: {exc!r}") from exc
        self._memo[memo_key] = vector
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return vector

    async def candidates(self, query: CacheQuery, vector: np.ndarray, limit: int = CANDIDATES) -> list[tuple[str, float, dict[str, Any]]]:
        """The nearest cached questions in the query's scope and category, most similar first.

        Returns:
            (key, cosine similarity, fields) for each candidate.
        """
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
        return [(row["id"], 1.0 - float(row[DISTANCE_FIELD]), row) for row in rows]

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
            return await self._adaptive(query, question, await self.candidates(query, vector, ADAPTIVE_CANDIDATES))
        for key, similarity, row in await self.candidates(query, vector):
            if similarity < policy.threshold:
                break  # most similar first: the rest are below too
            _check_row(key, row)
            verdict = await self._check.decide(question, row[FIELD_QUESTION], similarity, policy, query.canonical.model)
            if not verdict.accepted:
                continue
            return await self._hit(key, row, similarity, verdict.reason)
        return None

    async def _adaptive(self, query: CacheQuery, question: str, rows: list[tuple[str, float, dict[str, Any]]]) -> CacheHit | Candidate | None:
        """An adaptive category's decision on the nearest candidate the guards let through
        (app/cache/learning.py): served within the error bound, otherwise a candidate to learn from.
        With ``guard_lift``, a guard an entry has outgrown lets its candidates through, and when
        no candidate passes, the nearest one a guard turned down is returned to learn from."""
        policy = query.category.semantic
        turned_down: Candidate | None = None
        for key, similarity, row in rows:
            if similarity < policy.threshold:
                break
            _check_row(key, row)
            root = _text(row.get(FIELD_ROOT)) or key
            guard = self._check.guard(question, row[FIELD_QUESTION]) or ""
            lifted = bool(guard) and await self._guard_lifted(root, guard, policy)
            if guard and not lifted:
                self._check.held(guard)
                if turned_down is None and policy.guard_lift > 0 and _source(row) == SOURCE_MODEL:
                    turned_down = self._candidate(key, root, row, rows, similarity, 0, policy, guard=guard)
                continue
            others = [s for k, s, r in rows if (_text(r.get(FIELD_ROOT)) or k) != root]
            score = decision_score(similarity, max(others) if others else None, policy.threshold)
            bin_ = score_bin(score)
            wrong_before = _milli(similarity) <= int(row.get(FIELD_WRONG_ABOVE) or -1)
            # From accept_above a candidate that passes the guards is served unless the observations
            # refute it (the category's prior); below it, they must show it is safe.
            prior = similarity >= policy.accept_above
            within = not wrong_before and within_bound(
                await self.pooled.counts(query.version, query.category.name, query.canonical.tenant), bin_, policy,
                prior=prior
            )
            entry = False
            if within and root != key:
                # A wrong observation on any document of the entry vetoes its aliases too; read
                # only for would-be hits, so misses cost no extra round trip.
                wrong_before = _milli(similarity) <= int(await self._redis.hget(root, FIELD_WRONG_ABOVE) or -1)
                within = not wrong_before
            elif not within and not wrong_before and self._entry_may_vouch(policy, similarity, score):
                # Below what the pool allows, the entry's own record may (one read of its fields).
                values = await self._redis.hmget(root, entry_record_fields(policy.threshold, bin_))
                within = entry = entry_vouches(values, similarity, policy)
            verdict = self._check.learned(within, wrong_before, prior, entry)
            candidate = self._candidate(key, root, row, rows, similarity, bin_, policy, guard=guard, lifted=lifted)
            if turned_down is not None:  # learn about the guard of the nearer one too
                candidate = msgspec.structs.replace(candidate, turned_down=TurnedDown(
                    root=turned_down.root, answer=turned_down.answer, guard=turned_down.guard))
            rate = policy.entry_explore if entry else policy.explore
            if verdict.accepted and rate and self._explore.random() < rate:
                return msgspec.structs.replace(candidate, explored=True)
            if verdict.accepted:
                return await self._hit(key, row, similarity, verdict.reason)
            return candidate
        return turned_down

    @staticmethod
    def _candidate(key: str, root: str, row: dict[str, Any], rows: list[tuple[str, float, dict[str, Any]]],
                   similarity: float, bin_: int, policy: SemanticPolicy, *, guard: str = "", lifted: bool = False) -> Candidate:
        answer = row[FIELD_ANSWER]
        return Candidate(key=key, root=root, question=row[FIELD_QUESTION], similarity=similarity, score_bin=bin_,
                         answer=answer.encode() if isinstance(answer, str) else answer,
                         neighbours=_neighbours(root, row, rows, policy.threshold), guard=guard, guard_lifted=lifted)

    async def _guard_lifted(self, root: str, guard: str, policy: SemanticPolicy) -> bool:
        """Whether the entry has outgrown a guard: ``guard_lift`` answered misses it turned
        down had the entry's answer, and none had another (one read, only when a guard fires)."""
        if policy.guard_lift <= 0:
            return False
        ok, wrong = await self._redis.hmget(root, [f"{OBS_GUARD_OK}:{guard}", f"{OBS_GUARD_WRONG}:{guard}"])
        return int(ok or 0) >= policy.guard_lift and not int(wrong or 0)

    @staticmethod
    def _entry_may_vouch(policy: SemanticPolicy, similarity: float, score: float) -> bool:
        """Whether an entry's record is worth reading: on, the score above its floor, and no
        other answer within ``entry_margin`` (the score holds half the margin)."""
        margin = (score - similarity) / MARGIN_WEIGHT
        return policy.entry_confirmations > 0 and score >= policy.entry_floor and margin >= policy.entry_margin

    async def _hit(self, key: str, row: dict[str, Any], similarity: float, reason: str) -> CacheHit:
        await self._redis.hincrby(key, FIELD_HITS, 1)
        answer = row[FIELD_ANSWER]
        return CacheHit(
            layer=self.name,
            completion=answer.encode() if isinstance(answer, str) else answer,
            similarity=similarity,
            matched_question=row[FIELD_QUESTION],
            reason=reason,
            source=_source(row),
            key=_text(row.get(FIELD_ROOT)) or key,
        )

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


def _neighbours(root: str, row: dict[str, Any], rows: list[tuple[str, float, dict[str, Any]]], floor: float) -> tuple[Neighbour, ...]:
    """Entries of model answers in the band other than the candidate's, nearest first (none for
    a curated candidate: operators' entries are never merged)."""
    if _source(row) != SOURCE_MODEL:
        return ()
    found: dict[str, Neighbour] = {}
    for key, similarity, other in rows:
        other_root = _text(other.get(FIELD_ROOT)) or key
        if similarity < floor or len(found) == NEIGHBOURS:
            break
        if other_root != root and other_root not in found and _source(other) == SOURCE_MODEL and other.get(FIELD_ANSWER):
            answer = other[FIELD_ANSWER]
            found[other_root] = Neighbour(root=other_root, answer=answer.encode() if isinstance(answer, str) else answer)
    return tuple(found.values())


def _source(row: dict[str, Any]) -> str:
    return _text(row.get(FIELD_SOURCE)) or SOURCE_MODEL


def _milli(similarity: float) -> int:
    """Similarity in thousandths, rounded down: a wrong observation recorded (rounded) at 0.823
    vetoes every similarity up to 0.8239."""
    return int(similarity * 1000)


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _check_row(key: str, row: dict[str, Any]) -> None:
    if not row.get(FIELD_QUESTION) or not row.get(FIELD_ANSWER):
        raise CorruptEntry(f"semantic entry {key} lacks its question or answer")


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
    previous_text = previous.decode() if isinstance(previous, bytes) else str(previous)
    return None if previous_text == fingerprint else previous_text
