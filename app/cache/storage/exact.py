"""L1: the exact-match layer. One Redis hash per canonical request, TTL per category."""

from __future__ import annotations

from redis.asyncio import Redis

from app.cache.storage.contract import CacheHit, CacheQuery
from app.cache.storage.entry import CacheEntry, EntryWriter
from app.cache.storage.keys import FIELD_ANSWER, FIELD_HITS, KEYS, Keyspace, scope_fields
from app.cache.storage.version import CHECK_CURRENT, raise_if_moved

EXACT = "exact"

# One round trip: confirm the version tag and the scope's generation the worker assumes are
# still current (so an invalidation anywhere takes effect at once), then read the answer and
# count the hit. HINCRBY runs only on an existing entry, so a miss never creates a key without
# a TTL. KEYS: version, entry, scopes. ARGV: version number, generation, the three scope fields.
_LOOKUP_SCRIPT = CHECK_CURRENT + f"""
local answer = redis.call('HGET', KEYS[2], '{FIELD_ANSWER}')
if answer then redis.call('HINCRBY', KEYS[2], '{FIELD_HITS}', 1) end
return {{1, answer}}
"""


def exact_key(query: CacheQuery, keys: Keyspace = KEYS) -> str:
    return keys.exact_prefix(query.version) + query.entry_digest


class ExactCache:
    """Exact match on the canonical request.

    Answers are written back after their response has gone out (app/relay.py); until a write
    lands, this worker's lookups of that key see the answer being written, once the lookup
    script has confirmed the version and the scope's generation.
    """

    name = EXACT

    def __init__(self, redis: Redis, keys: Keyspace = KEYS) -> None:
        self._redis = redis
        self._keys = keys
        self._lookup = redis.register_script(_LOOKUP_SCRIPT)
        self._writer = EntryWriter(redis, keys)
        self._unwritten: dict[str, bytes] = {}

    async def lookup(self, query: CacheQuery) -> CacheHit | None:
        """Find the answer stored for exactly this canonical request.

        Raises:
            StaleVersion: ``query.version`` is no longer the current version.
            StaleScope: ``query.generation`` is no longer its scope's generation.
        """
        number = query.version[1:]
        fields = scope_fields(query.category.name, query.canonical.tenant)
        key = exact_key(query, self._keys)
        found, value = await self._lookup(keys=[self._keys.version_key, key, self._keys.scopes_key],
                                          args=[number, query.generation, *fields])
        raise_if_moved(found, value)
        if value is None:
            value = self._unwritten.get(key)
            if value is None:
                return None
        return CacheHit(layer=self.name, completion=value, key=key, document=key)

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        key = exact_key(query, self._keys)
        self._unwritten[key] = completion
        try:
            await self._writer.write(key, CacheEntry.for_query(query, completion), query)
        finally:
            if self._unwritten.get(key) is completion:
                del self._unwritten[key]
