"""Exact cache of ``/v1/embeddings``: the same input, model and options give the same vectors.

One Redis hash per request, ``strata:vN:emb:<sha256>`` (the digest of tenant, model, input and
options; the tenant keeps one tenant's inputs from being probed by another), holding the
upstream's response body as received, its TTL from ``STRATA_EMBEDDINGS_TTL_S``. The version tag
invalidates it with everything else; categories do not apply to embeddings.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from redis.asyncio import Redis

from app.cache.storage.contract import CACHE_ERRORS
from app.cache.storage.keys import FIELD_ANSWER, FIELD_CREATED_AT, FIELD_HITS, FIELD_MODEL, FIELD_TENANT
from app.cache.storage.version import VersionTag
from app.metrics import Metrics

_key_encoder = msgspec.json.Encoder(order="deterministic")
# Confirm the version tag (a bump anywhere counts at once), then read and count a hit in one
# step; a miss creates nothing. KEYS: version, entry. ARGV: version number.
_LOOKUP = f"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {{0}} end
local answer = redis.call('HGET', KEYS[2], '{FIELD_ANSWER}')
if answer then redis.call('HINCRBY', KEYS[2], '{FIELD_HITS}', 1) end
return {{1, answer}}
"""
# Fields that never change the vectors.
_IGNORED = frozenset({"user"})


def embeddings_digest(tenant: str, raw: dict[str, Any]) -> str:
    """sha256 of the tenant and every field that decides the vectors (``encoding_format``
    defaults to float, so naming it or not is one key)."""
    fields = {k: v for k, v in raw.items() if k not in _IGNORED and v is not None}
    fields.setdefault("encoding_format", "float")
    return hashlib.sha256(_key_encoder.encode([tenant, fields])).hexdigest()


class EmbeddingsCache:
    """Embeddings responses by request, under the current version tag.

    Args:
        redis: The Redis the cache lives in.
        versions: The version tag.
        ttl_s: How long a response is kept.
    """

    def __init__(self, redis: Redis, versions: VersionTag, ttl_s: int) -> None:
        self._redis = redis
        self._versions = versions
        self._ttl_s = ttl_s
        self._lookup = redis.register_script(_LOOKUP)

    async def lookup(self, digest: str) -> tuple[str, bytes | None]:
        """The key of a request's digest under the current version, and the stored response
        (counting the hit), ``None`` on a miss."""
        for _ in range(2):
            tag = self._versions.known or await self._versions.refresh()
            key = self._versions.keys.embeddings_key(tag, digest)
            found = await self._lookup(keys=[self._versions.keys.version_key, key], args=[tag[1:]])
            if found[0] == 1:
                return key, found[1] if len(found) > 1 else None
            await self._versions.refresh()  # bumped meanwhile: look under the new version
        return key, None

    async def store(self, key: str, tenant: str, model: str, response: bytes) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={FIELD_ANSWER: response, FIELD_MODEL: model, FIELD_TENANT: tenant,
                                    FIELD_CREATED_AT: int(time.time()), FIELD_HITS: 0})
            pipe.expire(key, self._ttl_s)
            await pipe.execute()


# The upstream's embeddings call: the request body -> the response body as received.
FetchEmbeddings = Callable[[dict[str, Any]], Awaitable[bytes]]


class CachedEmbeddings:
    """``/v1/embeddings`` cache-aside: the stored response, else the upstream's, stored.

    Args:
        stored: The cache; ``None`` when off (``STRATA_EMBEDDINGS_TTL_S=0``, or no Redis yet).
        metrics: Where requests and cache failures are counted (a failure is a bypass).
    """

    def __init__(self, stored: EmbeddingsCache | None, metrics: Metrics) -> None:
        self._stored = stored
        self._metrics = metrics

    async def create(self, tenant: str, model: str, raw: dict[str, Any], fetch: FetchEmbeddings, *,
                     use_cache: bool = True) -> tuple[bytes, str]:
        """The response body and its ``X-Cache`` outcome (``exact-hit``, ``miss``, ``bypass``).

        Args:
            tenant: Whose request (part of the key).
            model: The model named.
            raw: The request body as sent.
            fetch: The upstream call, on a miss.
            use_cache: ``False`` for ``Cache-Control: no-store``: neither read nor written.

        Raises:
            StrataError: The upstream failed (counted as ``error``).
        """
        counter = self._metrics.embedding_requests
        cache, key = self._stored if use_cache else None, None
        if cache is not None:
            try:
                key, found = await cache.lookup(embeddings_digest(tenant, raw))
            except CACHE_ERRORS as exc:
                self._metrics.cache_failed("embeddings", "lookup", exc)
                key = found = None
            if found is not None:
                counter.labels("exact-hit").inc()
                return found, "exact-hit"
        try:
            answer = await fetch(raw)
        except Exception:
            counter.labels("error").inc()
            raise
        if cache is not None and key is not None:
            try:
                await cache.store(key, tenant, model, answer)
            except CACHE_ERRORS as exc:
                self._metrics.cache_failed("embeddings", "store", exc)
        outcome = "miss" if key is not None else "bypass"
        counter.labels(outcome).inc()
        return answer, outcome
