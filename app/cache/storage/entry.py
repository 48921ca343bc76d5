"""One entry type for every layer: the fields of a cached answer and their Redis hash mapping.

Both layers store the same hash (``HGETALL`` shows it with redis-cli); the semantic layer adds
the scope digest and the question's embedding. Entries are written by one script with their
TTL, so no entry ever exists without one, and only under the version and generation they were
asked under.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.typing import EncodableT

from app.cache.storage.contract import CacheQuery, CorruptEntry
from app.cache.storage.keys import (
    CURATED_MARK,
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_CREATED_AT,
    FIELD_EMBEDDING,
    FIELD_EXPIRES_AT,
    FIELD_GENERATION,
    FIELD_HITS,
    FIELD_INTENT,
    FIELD_INTENT_CONFIDENCE,
    FIELD_INTENT_LIKELY,
    FIELD_MODEL,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SCOPE,
    FIELD_SOURCE,
    FIELD_TENANT,
    FIELD_USER,
    NO_GENERATION,
    Keyspace,
    scope_fields,
)
from app.cache.storage.version import CHECK_CURRENT, raise_if_moved

_INTEGER_FIELDS = (FIELD_CREATED_AT, FIELD_EXPIRES_AT, FIELD_HITS)


class CacheEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A cached answer as stored in one Redis hash.

    Attributes:
        question: The normalised last user message ("" when it was not a text question).
        answer: The completion JSON as the model returned it.
        model: The model the request named.
        tenant: The tenant it was stored for.
        category: The content category (its TTL bounds the entry's life).
        created_at: Unix seconds when stored.
        expires_at: Unix seconds when it expires (absolute: a hit does not extend it).
        hits: Times it was served.
        scope: The scope digest (semantic entries only).
        embedding: The question's embedding as float32 bytes (semantic entries only).
        root: The entry whose answer it serves: its own key, or its entry's for an alias
            (semantic entries only).
        source: ``faq`` for an operator's curated answer; absent for the model's.
        generation: The (category, tenant) generation it was stored under, once its scope has
            had a targeted invalidation (a sweep deletes entries of older generations).
        user: The user it belongs to, in a per-user category (``strata cache invalidate --user``).
        intent: The intent the tenant's intent head gave its question (semantic entries, when
            the team loaded intents), or the team's own label of a curated answer.
        intent_confidence: How sure the head was (1.0 for the team's own label).
        intent_likely: The head's probabilities of the question's likely intents, as JSON.
    """

    question: str
    answer: bytes
    model: str
    tenant: str
    category: str
    created_at: int
    expires_at: int
    hits: int = 0
    scope: str | None = None
    embedding: bytes | None = None
    root: str | None = None
    source: str | None = None
    generation: str | None = None
    user: str | None = None
    intent: str | None = None
    intent_confidence: float | None = None
    intent_likely: str | None = None

    @classmethod
    def for_query(cls, query: CacheQuery, answer: bytes, *, now: int | None = None, **extra: Any) -> CacheEntry:
        """The entry that stores ``answer`` for ``query``, living for the category's TTL.

        Args:
            query: The query the answer was generated for.
            answer: The completion JSON.
            now: Unix seconds of creation (the current time when omitted).
            **extra: Layer-specific fields (``scope``, ``embedding``).
        """
        created = int(time.time()) if now is None else now
        canonical = query.canonical
        return cls(
            question=canonical.question if canonical.question is not None else "",
            answer=answer,
            model=canonical.model,
            tenant=canonical.tenant,
            category=query.category.name,
            created_at=created,
            expires_at=created + query.category.ttl_seconds,
            generation=None if query.generation == NO_GENERATION else query.generation,
            user=canonical.user,
            **extra,
        )

    @property
    def ttl_seconds(self) -> int:
        return max(1, self.expires_at - self.created_at)

    def to_hash(self) -> dict[EncodableT, EncodableT]:
        """The hash fields, absent values left out."""
        fields: dict[EncodableT, EncodableT] = {
            FIELD_QUESTION: self.question,
            FIELD_ANSWER: self.answer,
            FIELD_MODEL: self.model,
            FIELD_TENANT: self.tenant,
            FIELD_CATEGORY: self.category,
            FIELD_CREATED_AT: self.created_at,
            FIELD_EXPIRES_AT: self.expires_at,
            FIELD_HITS: self.hits,
        }
        if self.scope is not None:
            fields[FIELD_SCOPE] = self.scope
        if self.embedding is not None:
            fields[FIELD_EMBEDDING] = self.embedding
        if self.root is not None:
            fields[FIELD_ROOT] = self.root
        if self.source is not None:
            fields[FIELD_SOURCE] = self.source
        if self.generation is not None:
            fields[FIELD_GENERATION] = self.generation
        if self.user is not None:
            fields[FIELD_USER] = self.user
        if self.intent is not None:
            fields[FIELD_INTENT] = self.intent
            fields[FIELD_INTENT_CONFIDENCE] = round(self.intent_confidence or 0.0, 4)
        if self.intent_likely is not None:
            fields[FIELD_INTENT_LIKELY] = self.intent_likely
        return fields

    @classmethod
    def from_hash(cls, fields: Mapping[bytes | str, bytes | str]) -> CacheEntry:
        """Read an entry back from ``HGETALL``.

        Raises:
            CorruptEntry: A field Strata always writes is missing or malformed.
        """
        named = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        try:
            text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in named.items() if k not in (FIELD_ANSWER, FIELD_EMBEDDING)}
            answer = named[FIELD_ANSWER]
            embedding = named.get(FIELD_EMBEDDING)
            return cls(
                question=text[FIELD_QUESTION],
                answer=answer.encode() if isinstance(answer, str) else answer,
                model=text[FIELD_MODEL],
                tenant=text[FIELD_TENANT],
                category=text[FIELD_CATEGORY],
                scope=text.get(FIELD_SCOPE),
                root=text.get(FIELD_ROOT),
                source=text.get(FIELD_SOURCE),
                generation=text.get(FIELD_GENERATION),
                user=text.get(FIELD_USER),
                intent=text.get(FIELD_INTENT),
                intent_confidence=float(text[FIELD_INTENT_CONFIDENCE]) if FIELD_INTENT_CONFIDENCE in text else None,
                intent_likely=text.get(FIELD_INTENT_LIKELY),
                embedding=embedding.encode() if isinstance(embedding, str) else embedding,
                **{name: int(text[name]) for name in _INTEGER_FIELDS},
            )
        except (KeyError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntry(f"cache entry lacks or garbles {exc}") from exc


# Write an entry with its TTL only if the version tag and the scope's generation are still the
# ones the answer was asked under: an answer generated while the cache was invalidated is never
# stored, and the check costs no round trip of its own. KEYS: version, entry, scopes. ARGV:
# version number, generation, the three scope fields, TTL, then field, value, field, value, ...
_WRITE_IF_CURRENT = CHECK_CURRENT + """
redis.call('HSET', KEYS[2], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[2], ARGV[6])
return {1, false}
"""


# The exact layer's write: the same, and the entry joins its wording's set (one wording's copies
# under every system prompt and parameter, which a curated answer removes whole), unless a curated
# answer owns the wording: then nothing is stored ({3}), so an answer that was in flight while the
# operator saved cannot shadow the curated one. KEYS: version, entry, scopes, wording set.
_WRITE_EXACT_IF_CURRENT = CHECK_CURRENT + f"""
if redis.call('SISMEMBER', KEYS[4], '{CURATED_MARK}') == 1 then return {{3, false}} end
redis.call('HSET', KEYS[2], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('SADD', KEYS[4], KEYS[2])
if redis.call('TTL', KEYS[4]) < tonumber(ARGV[6]) then redis.call('EXPIRE', KEYS[4], ARGV[6]) end
return {{1, false}}
"""


class EntryWriter:
    """Writes entries of one keyspace, each in one script with its TTL and the check above.

    Args:
        redis: The Redis of the keyspace.
        keys: The keyspace (its version tag and scope counters are checked).
    """

    def __init__(self, redis: Redis, keys: Keyspace) -> None:
        self._script = redis.register_script(_WRITE_IF_CURRENT)
        self._exact_script = redis.register_script(_WRITE_EXACT_IF_CURRENT)
        self._keys = keys

    async def write(self, key: str, entry: CacheEntry, query: CacheQuery, *, wording_key: str | None = None) -> None:
        """Store ``entry`` under ``key`` with its TTL; with ``wording_key`` (the exact layer's
        entries of a text question), as one of that wording's copies, and nothing at all while a
        curated answer owns the wording.

        Raises:
            StaleVersion: The version tag moved since ``query`` was planned (nothing written).
            StaleScope: The scope's generation moved (nothing written).
        """
        args: list[Any] = [query.version[1:], query.generation,
                           *scope_fields(query.category.name, query.canonical.tenant), entry.ttl_seconds]
        for name, value in entry.to_hash().items():
            args += (name, value)
        keys = [self._keys.version_key, key, self._keys.scopes_key]
        if wording_key is None:
            found, value = await self._script(keys=keys, args=args)
        else:
            found, value = await self._exact_script(keys=[*keys, wording_key], args=args)
        raise_if_moved(found, value)
