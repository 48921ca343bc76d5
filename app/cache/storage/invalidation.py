"""Invalidation an operator can aim: everything (the version tag), one category and/or tenant
(its generation), one entry by key, the entry a question would be served, one curated file, or
every answer of one user of a tenant (per-user categories).

Every kind is O(1) on the request path: a bump makes entries unreachable at once (their keys and
semantic scope hold the version and the generation), and a background sweep returns their
memory. Deleting one entry deletes its aliases too. Every invalidation is appended to the audit
stream ``strata:meta:audit`` (capped), readable with ``redis-cli XREVRANGE strata:meta:audit + -``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec
from redis.asyncio import Redis

from app.cache.storage.contract import CacheHit, CacheQuery, Candidate, SharedRedis
from app.cache.storage.exact import exact_key, wording_keys_of
from app.cache.storage.keys import (
    AUDIT_KEY,
    CURATED_MARK,
    FAQ_SET_NAME,
    FIELD_CATEGORY,
    FIELD_GENERATION,
    FIELD_ROOT,
    FIELD_TENANT,
    FIELD_USER,
    KEYS,
    NAMESPACE,
    NO_GENERATION,
    Keyspace,
    as_text,
    canonicalize,
    generation_of,
    scope_fields,
)
from app.cache.storage.version import ScopeGenerations, VersionTag
from app.policy import Policy, UnknownCategory
from app.wire import ChatCompletionRequest

logger = logging.getLogger("strata.invalidation")

# Audit entries kept (approximately: XADD MAXLEN ~ trims whole macro nodes).
AUDIT_MAX_LEN = 10_000
# An entry key as Strata writes it: exact or semantic, a sha256 or a curated answer's; in a
# cluster bucket's keyspace (``strata:{b3}:v1:...``) on a cluster.
ENTRY_KEY = re.compile(
    rf"^(?P<namespace>{NAMESPACE}(?::\{{[A-Za-z0-9]+\}})?):(?P<tag>v[1-9][0-9]*):(exact|sem):(faq-)?[0-9a-f]{{64}}$"
)


class SemanticEntries(Protocol):
    """What invalidation asks of the semantic layer (app/cache/semantic.py), which is above it."""

    async def documents_of(self, tag: str, root: str) -> set[str]: ...

    async def lookup(self, query: CacheQuery) -> CacheHit | Candidate | None: ...


class InvalidationError(ValueError):
    """An invalidation that names nothing that can exist (unknown category, malformed key)."""


class NothingThere(LookupError):
    """A well-formed target with nothing stored under it."""


class Invalidation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What to invalidate: exactly one target. The body of ``POST /admin/cache/invalidate``
    (empty: everything) and the options of ``strata cache invalidate``.

    Attributes:
        category: With or without ``tenant``: that category's entries (of every tenant).
        tenant: With or without ``category``: that tenant's entries (of every category).
        key: One entry by its Redis key (and its aliases).
        question: The entry a request with this question would be served, in the scope of
            ``category`` (the default category when absent), ``tenant``, ``model`` and ``system``.
        model: The model of ``question``'s request.
        system: The system prompt of ``question``'s request.
        faq: Every entry one ``strata faq load`` file wrote (its name).
        user: With ``tenant`` (and optionally ``category``): every entry of that user of the
            tenant (per-user categories), found by a scan of the current version.
    """

    category: str | None = None
    tenant: str | None = None
    key: str | None = None
    question: str | None = None
    model: str | None = None
    system: str | None = None
    faq: str | None = None
    user: str | None = None

    @property
    def kind(self) -> str:
        if self.user is not None:
            return "user"
        if self.key is not None:
            return "key"
        if self.question is not None:
            return "question"
        if self.faq is not None:
            return "faq"
        if self.category is not None or self.tenant is not None:
            return "scope"
        return "everything"


class Invalidated(msgspec.Struct, frozen=True, kw_only=True):
    """What an invalidation did (the endpoint's response)."""

    kind: str
    target: str
    deleted: int = 0
    version: str | None = None
    generation_field: str | None = None


def check_invalidation(what: Invalidation, policy: Policy) -> None:
    """Raise :class:`InvalidationError` unless ``what`` names one well-formed target."""
    targets = sum(x is not None for x in (what.key, what.question, what.faq))
    if targets > 1:
        raise InvalidationError("name one of key, question and faq")
    if what.key is not None and (what.category or what.tenant or what.model or what.system):
        raise InvalidationError("key names an entry on its own: no category, tenant, model or system with it")
    if what.key is not None and not ENTRY_KEY.match(what.key):
        raise InvalidationError(f"not a Strata entry key: {what.key!r} (strata:vN:exact:<sha256> or strata:vN:sem:<sha256>)")
    if what.faq is not None and (what.category or what.tenant or not FAQ_SET_NAME.match(what.faq)):
        raise InvalidationError(f"faq takes a file's name alone, matching {FAQ_SET_NAME.pattern}")
    if what.category is not None:
        try:
            policy.category(what.category)
        except UnknownCategory as exc:
            raise InvalidationError(str(exc)) from exc
    if what.tenant is not None and not 0 < len(what.tenant) <= 256:
        raise InvalidationError("a tenant name has 1 to 256 characters")
    if what.question is not None and (not what.question.strip() or not what.model):
        raise InvalidationError("question needs a non-empty text and the model of its requests")
    if (what.model is not None or what.system is not None) and what.question is None:
        raise InvalidationError("model and system go with question")
    if what.user is not None and (what.tenant is None or targets or not 0 < len(what.user) <= 256):
        raise InvalidationError("user names a user of one tenant: with tenant (and optionally category), "
                                "1 to 256 characters")



class AuditLog:
    """The audit stream ``strata:meta:audit``, outside any bucket (the cluster client routes it).

    Args:
        redis: The Redis of the keys outside any bucket.
    """

    def __init__(self, redis: SharedRedis) -> None:
        self.redis = redis

    async def record(self, what: Invalidation, done: Invalidated, who: str) -> None:
        """Append an invalidation."""
        await self.record_event(who=who, done=done, request=msgspec.to_builtins(what))
        logger.info("invalidated %s %s by %s (%d deleted)", done.kind, done.target, who, done.deleted)

    async def record_event(self, *, who: str, done: Invalidated, request: dict[str, object]) -> None:
        """Append one entry: who, what kind, its target, what was deleted, the request as JSON."""
        await self.redis.xadd(AUDIT_KEY, {"who": who, "kind": done.kind, "target": done.target, "deleted": done.deleted,
                                          "request": msgspec.json.encode(request).decode(), "at": int(time.time())},
                              maxlen=AUDIT_MAX_LEN, approximate=True)

    async def latest(self, count: int = 50) -> list[dict[str, str]]:
        """The latest invalidations, newest first."""
        rows = await self.redis.xrevrange(AUDIT_KEY, count=count)
        return [{"id": str(as_text(entry_id)), **{str(as_text(k)): str(as_text(v)) for k, v in (fields or {}).items()}}
                for entry_id, fields in rows or []]


class Invalidator(Protocol):
    """What the admin endpoint and ``strata cache`` ask of invalidation: one keyspace's
    :class:`CacheInvalidator`, or a cluster's buckets behind one (app/cache/routed.py)."""

    @property
    def audit_log(self) -> AuditLog: ...

    def check(self, what: Invalidation) -> None: ...

    async def invalidate(self, what: Invalidation, *, who: str) -> Invalidated: ...

    async def audit(self, count: int = 50) -> list[dict[str, str]]: ...

    async def entry_of_question(self, what: Invalidation) -> str: ...

    def for_key(self, key: str) -> CacheInvalidator: ...

    async def affected(self, what: Invalidation) -> int: ...


class CacheInvalidator:
    """Carries out invalidations against one Redis (or one cluster bucket).

    Args:
        redis: The Redis the cache lives in (a bucket's master).
        versions: The version tag (its keyspace is the one invalidated).
        generations: The (category, tenant) generations.
        policy: The categories (names are checked against it).
        semantic: The semantic layer, to find a question's entry; ``None`` without one.
        audit: The audit stream; on ``redis`` when ``None``.
    """

    def __init__(self, redis: Redis, versions: VersionTag, generations: ScopeGenerations, policy: Policy,
                 semantic: SemanticEntries | None, audit: AuditLog | None = None) -> None:
        self._redis = redis
        self._audit = AuditLog(redis) if audit is None else audit
        self._versions = versions
        self._generations = generations
        self._policy = policy
        self._semantic = semantic

    @property
    def redis(self) -> Redis:
        return self._redis

    @property
    def audit_log(self) -> AuditLog:
        return self._audit

    @property
    def versions(self) -> VersionTag:
        return self._versions

    @property
    def semantic(self) -> SemanticEntries | None:
        return self._semantic

    def check(self, what: Invalidation) -> None:
        """Raise :class:`InvalidationError` unless ``what`` names one well-formed target."""
        check_invalidation(what, self._policy)

    async def invalidate(self, what: Invalidation, *, who: str) -> Invalidated:
        """Carry out one invalidation and record it in the audit stream.

        Raises:
            InvalidationError: ``what`` is malformed (nothing is changed).
            NothingThere: A key or question with no entry (nothing is changed).
        """
        self.check(what)
        done = await self.carry_out(what)
        await self._audit.record(what, done, who)
        return done

    async def carry_out(self, what: Invalidation) -> Invalidated:
        """Invalidate a checked target in this keyspace, without recording it."""
        kind = what.kind
        if kind == "everything":
            previous, current = await self._versions.bump()
            done = Invalidated(kind=kind, target=f"version {previous} -> {current}", version=current)
        elif kind == "scope":
            field = await self._generations.bump(what.category, what.tenant)
            done = Invalidated(kind=kind, target=field, generation_field=field)
        elif kind == "key":
            assert what.key is not None
            done = Invalidated(kind=kind, target=what.key, deleted=await self.delete_entry(what.key))
        elif kind == "question":
            copies = await self.copies_of_question(what)
            deleted = 0
            for key in copies:
                try:
                    deleted += await self.delete_entry(key)
                except NothingThere:
                    continue  # went with an earlier copy (an alias of it), or expired meanwhile
            done = Invalidated(kind=kind, target=copies[0], deleted=deleted)
        elif kind == "user":
            assert what.user is not None and what.tenant is not None
            deleted = await self._delete_user(what.tenant, what.user, what.category)
            done = Invalidated(kind=kind, target=f"user {what.user} of tenant {what.tenant}", deleted=deleted)
        else:
            assert what.faq is not None
            done = Invalidated(kind=kind, target=what.faq, deleted=await self._delete_faq(what.faq))
        return done

    async def _delete_user(self, tenant: str, user: str, category: str | None) -> int:
        """Delete every entry (exact, semantic, and so their aliases) of one user of a tenant in the
        current version. An answer being written back for that user meanwhile may still land: it
        is that user's own, served to nobody else, and expires with its TTL."""
        deleted = 0
        async for mine in self._entries(tenant=tenant, user=user, category=category):
            deleted += int(await self._redis.unlink(*mine))
        return deleted

    async def affected(self, what: Invalidation) -> int:
        """How many entries (exact and semantic, curated answers apart) an invalidation would
        take, for a confirmation; a scan of the keyspace for scopes, so an operator's step only."""
        kind = what.kind
        if kind == "key":
            assert what.key is not None
            if not await self._redis.exists(what.key):
                return 0
            root = as_text(await self._redis.hget(what.key, FIELD_ROOT))
            if root is None or self._semantic is None:
                return 1  # an exact entry: itself
            return len(await self._semantic.documents_of(await self._versions.refresh(), root) | {root})
        if kind == "question":
            try:
                return len(await self.copies_of_question(what))
            except NothingThere:
                return 0
        if kind == "faq":
            return int(await self._redis.scard(self._versions.keys.faq_set_key(await self._versions.refresh(), what.faq or "")))
        counted = 0
        async for chunk in self._entries(tenant=what.tenant, user=what.user, category=what.category):
            counted += len(chunk)
        return counted

    async def _entries(self, *, tenant: str | None, user: str | None, category: str | None,
                       batch: int = 500) -> AsyncIterator[list[bytes]]:
        """The model's entries of the current version (both layers) in a scope, a batch at a time;
        ``None`` matches anything."""
        tag = await self._versions.refresh()
        keys = self._versions.keys
        for prefix in (keys.exact_prefix(tag), keys.semantic_prefix(tag)):
            found = [k async for k in self._redis.scan_iter(match=prefix + "*", count=1000) if b":faq-" not in k]
            for start in range(0, len(found), batch):
                chunk = found[start:start + batch]
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.hmget(key, [FIELD_TENANT, FIELD_USER, FIELD_CATEGORY])
                    rows = await pipe.execute()
                mine = [key for key, (t, u, c) in zip(chunk, rows, strict=True) if t is not None
                        and (tenant is None or as_text(t) == tenant) and (user is None or as_text(u) == user)
                        and (category is None or as_text(c) == category)]
                if mine:
                    yield mine

    def for_key(self, key: str) -> CacheInvalidator:
        """The invalidator of the keyspace holding ``key`` (this one on a single Redis)."""
        return self

    async def audit(self, count: int = 50) -> list[dict[str, str]]:
        """The latest invalidations, newest first."""
        return await self._audit.latest(count)

    async def delete_entry(self, key: str) -> int:
        """Delete an entry and, for a semantic one, every document of its entry (its aliases)."""
        root = as_text(await self._redis.hget(key, FIELD_ROOT)) or key
        if not await self._redis.exists(key):
            raise NothingThere(f"no entry {key}")
        keys = {key, root}
        if self._semantic is not None and ":sem:" in key:
            match = ENTRY_KEY.match(key)
            assert match is not None  # checked
            keys |= await self._semantic.documents_of(match["tag"], root)
        return int(await self._redis.unlink(*keys))

    async def entry_of_question(self, what: Invalidation) -> str:
        """The key of the entry a request with this question would be served from."""
        return (await self.copies_of_question(what))[0]

    async def copies_of_question(self, what: Invalidation) -> list[str]:
        """Every copy of the answer a request with this question is served: its exact entry and the
        semantic document stored with it (one digest), or else the semantic entry that serves it.

        Raises:
            NothingThere: Nothing serves the question.
        """
        category = self._policy.category(what.category)  # checked
        messages: list[dict[str, Any]] = [{"role": "system", "content": what.system}] if what.system else []
        messages.append({"role": "user", "content": what.question})
        raw = {"model": what.model, "messages": messages}
        try:
            request = msgspec.convert(raw, ChatCompletionRequest)
        except msgspec.ValidationError as exc:
            raise InvalidationError(f"not a request Strata would cache: {exc}") from exc
        tenant = what.tenant or "default"
        canonical = canonicalize(request, raw, tenant=tenant, category=category.name, max_tokens=None)
        version = await self._versions.refresh()
        generation = await self._generations.refresh(category.name, tenant)
        query = CacheQuery(canonical=canonical, category=category, version=version, generation=generation)
        key = exact_key(query, self._versions.keys)
        document = self._versions.keys.semantic_prefix(version) + query.entry_digest
        copies = [k for k in (key, document) if await self._redis.exists(k)]
        if copies:
            return copies
        if self._semantic is not None:
            found = await self._semantic.lookup(query)
            if isinstance(found, CacheHit) and found.key is not None:
                return [found.key]
        raise NothingThere(f"no entry serves {what.question!r} in category {category.name!r} for tenant {tenant!r}")

    async def _delete_faq(self, name: str) -> int:
        tag = await self._versions.refresh()
        set_key = self._versions.keys.faq_set_key(tag, name)
        keys = await self._redis.smembers(set_key)
        if not keys:
            raise NothingThere(f"no curated answers loaded under {name!r}")
        # Their wordings are the model's to answer again.
        released = await wording_keys_of(self._redis, self._versions.keys, tag, [str(as_text(k)) for k in keys])
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.unlink(*keys)
            pipe.unlink(set_key)
            for wording in released:
                pipe.srem(wording, CURATED_MARK)
            deleted, *_ = await pipe.execute()
        return int(deleted)


async def sweep_stale_generations(redis: Redis, tag: str, *, keys: Keyspace = KEYS, batch: int = 500) -> int:
    """Delete the entries of version ``tag`` stored under an older generation of their scope.

    Runs in the background after a targeted invalidation; they are unreachable already, and
    would expire by TTL anyway. Curated answers are not scoped by generation and are kept.

    Returns:
        How many keys were deleted.
    """
    generations: dict[tuple[str, str], str] = {}
    deleted = 0
    for prefix in (keys.exact_prefix(tag), keys.semantic_prefix(tag)):
        found = [k async for k in redis.scan_iter(match=prefix + "*", count=1000) if b":faq-" not in k]
        for start in range(0, len(found), batch):
            chunk = found[start:start + batch]
            async with redis.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hmget(key, [FIELD_CATEGORY, FIELD_TENANT, FIELD_GENERATION])
                rows = await pipe.execute()
            stale = []
            for key, (category, tenant, stored) in zip(chunk, rows, strict=True):
                if category is None or tenant is None:
                    continue  # gone meanwhile
                scope = (str(as_text(category)), str(as_text(tenant)))
                if scope not in generations:
                    generations[scope] = generation_of(await redis.hmget(keys.scopes_key, list(scope_fields(*scope))))
                if (as_text(stored) or NO_GENERATION) != generations[scope]:
                    stale.append(key)
            if stale:
                deleted += int(await redis.unlink(*stale))
            await asyncio.sleep(0)  # let requests through between batches
    if deleted:
        logger.info("swept %d entries of stale generations (%s)", deleted, tag)
    return deleted

