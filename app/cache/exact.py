"""L1: the exact-match layer. One Redis hash per canonical request, TTL per category."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from app.cache.base import CacheHit, CacheQuery
from app.cache.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_CREATED_AT,
    FIELD_EXPIRES_AT,
    FIELD_HITS,
    FIELD_MODEL,
    FIELD_QUESTION,
    FIELD_TENANT,
    VERSION_KEY,
    exact_prefix,
)

# One round trip: confirm the version tag the worker assumes is still current (so a bump
# anywhere takes effect at once), then read the answer and count the hit. HINCRBY runs only
# on an existing entry, so a miss never creates a key without a TTL.
_LOOKUP_SCRIPT = f"""
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then return {{0, current}} end
local answer = redis.call('HGET', KEYS[2], '{FIELD_ANSWER}')
if answer then redis.call('HINCRBY', KEYS[2], '{FIELD_HITS}', 1) end
return {{1, answer}}
"""


class StaleVersion(Exception):
    """The version tag changed since this worker last read it."""

    def __init__(self, current: bytes | None) -> None:
        super().__init__("the cache version changed")
        self.current = current


def exact_key(query: CacheQuery) -> str:
    return exact_prefix(query.version) + query.canonical.exact_digest


class ExactCache:
    """Exact match on the canonical request."""

    name = "exact"

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._lookup = redis.register_script(_LOOKUP_SCRIPT)

    async def lookup(self, query: CacheQuery) -> CacheHit | None:
        """Find the answer stored for exactly this canonical request.

        Raises:
            StaleVersion: ``query.version`` is no longer the current version.
        """
        number = query.version[1:]
        found, value = await self._lookup(keys=[VERSION_KEY, exact_key(query)], args=[number])
        if not found:
            raise StaleVersion(value)
        if value is None:
            return None
        return CacheHit(layer=self.name, completion=value)

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        now = int(time.time())
        ttl = query.category.ttl_seconds
        key = exact_key(query)
        canonical = query.canonical
        fields = {
            FIELD_QUESTION: canonical.question if canonical.question is not None else "",
            FIELD_ANSWER: completion,
            FIELD_MODEL: canonical.model,
            FIELD_TENANT: canonical.tenant,
            FIELD_CATEGORY: query.category.name,
            FIELD_CREATED_AT: now,
            FIELD_EXPIRES_AT: now + ttl,
            FIELD_HITS: 0,
        }
        # MULTI/EXEC: the entry never exists without its TTL.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.expire(key, ttl)
            await pipe.execute()
