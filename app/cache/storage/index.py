"""The L2 index: HNSW over question embeddings in Redis Stack, through redisvl.

One index per version tag (``strata:vN:sem``, declared in schemas/semantic_index.yaml), created on
first use. A KNN query is pre-filtered by TAG on the request's scope digest and category, so a
cached answer only serves a request of the same scope, and no client-controlled text ever
reaches the query string.
"""

from __future__ import annotations

import asyncio
import copy
import logging
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

from app.cache.storage.contract import CacheQuery, Nearest
from app.cache.storage.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_EMBEDDING,
    FIELD_INTENT,
    FIELD_INTENT_CHECKED,
    FIELD_INTENT_CONFIDENCE,
    FIELD_INTENT_LIKELY,
    FIELD_INTENT_REFUTED,
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
from app.wire import decode_completion

logger = logging.getLogger("strata.semantic")

DISTANCE_FIELD = "vector_distance"
# Candidates compared per lookup of a fixed-threshold category; adaptive ones look at more, to
# find the nearest document serving another answer (the margin).
CANDIDATES = 3


def scope_filter(query: CacheQuery) -> FilterExpression:
    """The KNN pre-filter: the request's scope digest or its tenant's curated-answer scope (hex),
    and the category (a policy name), nothing a client wrote; redisvl escapes them all the same."""
    canonical = query.canonical
    scopes = [query.scope_digest, faq_scope_digest(canonical.tenant, query.category.name)]
    return (Tag(FIELD_SCOPE) == scopes) & (Tag(FIELD_CATEGORY) == query.category.name)


class SemanticIndex:
    """A keyspace's semantic index: created per version on first use, queried by KNN.

    Args:
        redis: The keyspace's Redis.
        dims: The embedder's vector dimension.
        embedder_name: For the log line.
        schema_path: The redisvl schema (its name, prefix and dims are filled in per version).
        keys: The keyspace.
    """

    def __init__(self, redis: Redis, dims: int, embedder_name: str, schema_path: Path, keys: Keyspace = KEYS) -> None:
        self.redis = redis
        self.keys = keys
        self._dims = dims
        self._embedder_name = embedder_name
        self._schema_template = yaml.safe_load(schema_path.read_text(encoding="utf-8"))
        self._indexes: dict[str, AsyncSearchIndex] = {}
        self._index_lock = asyncio.Lock()

    def schema_for(self, tag: str) -> dict[str, Any]:
        schema: dict[str, Any] = copy.deepcopy(self._schema_template)
        schema["index"]["name"] = self.keys.semantic_index_name(tag)
        schema["index"]["prefix"] = self.keys.semantic_prefix(tag)
        for field in schema["fields"]:
            if field["name"] == FIELD_EMBEDDING:
                field["attrs"]["dims"] = self._dims
        return schema

    async def index(self, tag: str) -> AsyncSearchIndex:
        """The index of a version, created on first use (kept when it already exists)."""
        index = self._indexes.get(tag)
        if index is not None:
            return index
        async with self._index_lock:
            index = self._indexes.get(tag)
            if index is None:
                index = AsyncSearchIndex.from_dict(self.schema_for(tag), redis_client=self.redis)
                await index.create(overwrite=False)
                logger.info("semantic index %s ready (%s, %d dims)", self.keys.semantic_index_name(tag),
                            self._embedder_name, self._dims)
                self._indexes[tag] = index
        return index

    def forget_index(self, tag: str) -> None:
        self._indexes.pop(tag, None)

    async def candidates(self, query: CacheQuery, vector: np.ndarray, limit: int = CANDIDATES) -> list[Nearest]:
        """The nearest cached questions in the query's scope and category, most similar first."""
        index = await self.index(query.version)
        knn = VectorQuery(
            vector=vector.astype(np.float32).tobytes(),
            vector_field_name=FIELD_EMBEDDING,
            return_fields=[FIELD_QUESTION, FIELD_ANSWER, FIELD_ROOT, FIELD_WRONG_ABOVE, FIELD_SOURCE, FIELD_INTENT,
                           FIELD_INTENT_CONFIDENCE, FIELD_INTENT_REFUTED, FIELD_INTENT_CHECKED, FIELD_INTENT_LIKELY],
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

    async def candidates_of_intent(self, query: CacheQuery, vector: np.ndarray, intent: str,
                                   limit: int) -> list[Nearest]:
        """The nearest cached questions in the query's scope that the tenant's head read as
        ``intent``, at any similarity (the intent rule beyond the band). An index made before the
        ``intent`` field existed has none: an empty list (a version bump makes the new index)."""
        index = await self.index(query.version)
        knn = VectorQuery(
            vector=vector.astype(np.float32).tobytes(), vector_field_name=FIELD_EMBEDDING,
            return_fields=[FIELD_QUESTION, FIELD_ANSWER, FIELD_ROOT, FIELD_WRONG_ABOVE, FIELD_SOURCE, FIELD_INTENT,
                           FIELD_INTENT_CONFIDENCE, FIELD_INTENT_REFUTED, FIELD_INTENT_CHECKED, FIELD_INTENT_LIKELY],
            filter_expression=scope_filter(query) & (Tag(FIELD_INTENT) == intent), num_results=limit, return_score=True)
        try:
            rows = await index.query(knn)
        except (ResponseError, RedisSearchError) as exc:
            if "unknown field" not in str(exc).lower() and "no such index" not in str(exc).lower():
                raise
            return []
        return [Nearest(row["id"], 1.0 - float(row[DISTANCE_FIELD]), row) for row in rows]

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
