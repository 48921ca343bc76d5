"""L1: the exact-match layer. One Redis hash per canonical request, TTL per category."""

from __future__ import annotations

from redis.asyncio import Redis

from app.cache.storage.contract import CacheHit, CacheQuery
from app.cache.storage.entry import CacheEntry, EntryWriter
from app.cache.storage.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_HITS,
    FIELD_QUESTION,
    FIELD_TENANT,
    KEYS,
    Keyspace,
    as_text,
    scope_fields,
)
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


def wording_key_of(query: CacheQuery, keys: Keyspace = KEYS) -> str | None:
    """The wording set an exact entry joins: a text question of a category that curated answers
    can own (one with a semantic layer); ``None`` for any other request."""
    question = query.canonical.question
    if not question or not query.category.semantic.enabled:
        return None
    return keys.wording_key(query.version, query.canonical.tenant, query.category.name, question)


async def wording_keys_of(redis: Redis, keys: Keyspace, tag: str, documents: list[str]) -> set[str]:
    """The wording sets of stored documents (their question, tenant and category read back)."""
    if not documents:
        return set()
    async with redis.pipeline(transaction=False) as pipe:
        for document in documents:
            pipe.hmget(document, [FIELD_QUESTION, FIELD_TENANT, FIELD_CATEGORY])
        rows = await pipe.execute()
    return {keys.wording_key(tag, str(as_text(tenant)), str(as_text(category)), str(as_text(question)))
            for question, tenant, category in rows if question is not None and tenant is not None and category is not None}


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
            await self._writer.write(key, CacheEntry.for_query(query, completion), query,
                                     wording_key=wording_key_of(query, self._keys))
        finally:
            if self._unwritten.get(key) is completion:
                del self._unwritten[key]
