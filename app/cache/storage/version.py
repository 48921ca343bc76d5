"""The version tag: part of every key and index name; bumping it invalidates everything at once.

The current number lives in Redis (``strata:meta:version``) so every worker agrees on it.
Each worker keeps the last value it saw; the exact layer's lookup script checks it against
Redis atomically on every request, so a bump takes effect on the very next request without
an extra round trip.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from app.cache.storage.keys import KEYS, Keyspace, generation_of, scope_fields, version_tag

logger = logging.getLogger("strata.version")


# The first lines of every script that must act only under the version tag and the scope
# generation the worker assumed (the exact lookup, the write of an entry): returns {0, version}
# or {2, generation} when either moved. KEYS[1]: the version tag, KEYS[3]: the scope counters.
# ARGV[1]: the version number, ARGV[2]: the generation, ARGV[3..5]: the three scope fields.
CHECK_CURRENT = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then return {0, current} end
local counters = redis.call('HMGET', KEYS[3], ARGV[3], ARGV[4], ARGV[5])
local generation = (counters[1] or '0') .. '.' .. (counters[2] or '0') .. '.' .. (counters[3] or '0')
if generation ~= ARGV[2] then return {2, generation} end
"""


def raise_if_moved(found: int, value: bytes | str | None) -> None:
    """Turn the {0, version} / {2, generation} answer of a script that begins with
    :data:`CHECK_CURRENT` into :class:`StaleVersion` / :class:`StaleScope`."""
    if found == 0:
        raise StaleVersion(value if not isinstance(value, str) else value.encode())
    if found == 2:
        raise StaleScope(value.decode() if isinstance(value, bytes) else str(value))


class StaleVersion(Exception):
    """The version tag changed since this worker last read it (part of the layer contract:
    the caller adopts ``current`` and asks again).

    Attributes:
        current: The version number Redis holds now, as read (``None`` if it is gone).
    """

    def __init__(self, current: bytes | None) -> None:
        super().__init__("the cache version changed")
        self.current = current


class StaleScope(Exception):
    """A targeted invalidation moved a (category, tenant) generation since this worker read it
    (part of the layer contract, like :class:`StaleVersion`).

    Attributes:
        generation: The generation Redis holds now (``"c.t.p"``).
    """

    def __init__(self, generation: str) -> None:
        super().__init__("the scope's generation changed")
        self.generation = generation


class ScopeGenerations:
    """Targeted invalidation: a counter per category, per tenant and per (category, tenant) in
    ``strata:meta:scopes``; the three make a scope's generation, part of its keys and semantic
    scope, so a bump makes exactly that scope's entries unreachable at once.

    Like the version tag, each worker keeps the generations it saw and the exact layer's lookup
    script checks them against Redis on every request (no extra round trip).
    """

    # Generations remembered per worker; beyond it they are forgotten and read again.
    MAX_KNOWN = 65_536

    def __init__(self, redis: Redis, keys: Keyspace = KEYS) -> None:
        self._redis = redis
        self.keys = keys
        self._known: dict[tuple[str, str], str] = {}

    def known(self, category: str, tenant: str) -> str | None:
        return self._known.get((category, tenant))

    def observe(self, category: str, tenant: str, generation: str) -> str:
        if len(self._known) >= self.MAX_KNOWN:
            self._known.clear()
        self._known[(category, tenant)] = generation
        return generation

    async def refresh(self, category: str, tenant: str) -> str:
        """Read a scope's generation from Redis (HMGET; nothing is written)."""
        values = await self._redis.hmget(self.keys.scopes_key, list(scope_fields(category, tenant)))
        return self.observe(category, tenant, generation_of(values))

    async def bump(self, category: str | None, tenant: str | None) -> str:
        """Invalidate a category (every tenant), a tenant (every category) or one pair.

        Returns:
            The field of ``strata:meta:scopes`` that moved.
        """
        if category is None and tenant is None:
            raise ValueError("a category, a tenant or both")
        if category is not None and tenant is not None:
            field = scope_fields(category, tenant)[2]
        elif category is not None:
            field = scope_fields(category, "")[0]
        else:
            assert tenant is not None
            field = scope_fields("", tenant)[1]
        await self._redis.hincrby(self.keys.scopes_key, field, 1)
        self._known.clear()
        return field


class VersionTag:
    """The current cache version of one Redis database (or of one cluster bucket)."""

    def __init__(self, redis: Redis, keys: Keyspace = KEYS) -> None:
        self._redis = redis
        self.keys = keys
        self._number: int | None = None

    @property
    def known(self) -> str | None:
        """The tag last seen, without asking Redis ("v3"), or ``None`` before the first read."""
        return None if self._number is None else version_tag(self._number)

    def observe(self, raw: bytes | str | int | None) -> str | None:
        """Record a version number read from Redis by someone else; returns its tag."""
        if raw is None:
            self._number = None
            return None
        self._number = int(raw)
        return version_tag(self._number)

    async def refresh(self) -> str:
        """Read the version from Redis, creating version 1 on a fresh database.

        Only a fresh database costs a write: a full (OOM) Redis can still be read.
        """
        tag = self.observe(await self._redis.get(self.keys.version_key))
        if tag is None:
            await self._redis.set(self.keys.version_key, 1, nx=True)
            tag = self.observe(await self._redis.get(self.keys.version_key))
        assert tag is not None
        return tag

    async def bump(self) -> tuple[str, str]:
        """Move to the next version; returns the (previous, new) tags."""
        await self._redis.set(self.keys.version_key, 1, nx=True)
        new = await self._redis.incr(self.keys.version_key)
        self._number = new
        return version_tag(new - 1), version_tag(new)


async def sweep_stale_versions(redis: Redis, current: str, *, keys: Keyspace = KEYS, batch: int = 500) -> int:
    """Delete the keys and drop the indexes of every version other than ``current``.

    Runs in the background after a bump and at start-up. Entries would expire by TTL anyway;
    this returns their memory sooner. Indexes are dropped with their documents (``DD``).

    Args:
        redis: The Redis connection.
        current: The tag to keep ("v3").
        keys: The keyspace swept (one cluster bucket's: ``redis`` is then its master).
        batch: Keys unlinked per round trip.

    Returns:
        How many keys were deleted (documents dropped with an index not included).
    """
    keep = f"{keys.namespace}:{current}:"
    for raw_name in await redis.execute_command("FT._LIST"):
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        if name.startswith(keys.versioned) and not (name + ":").startswith(keep):
            logger.info("dropping stale index %s with its documents", name)
            await redis.execute_command("FT.DROPINDEX", name, "DD")
    deleted = 0
    pending: list[bytes] = []
    async for key in redis.scan_iter(match=f"{keys.versioned}*", count=1000):
        if key.decode().startswith(keep):
            continue
        pending.append(key)
        if len(pending) >= batch:
            deleted += await redis.unlink(*pending)
            pending.clear()
            await asyncio.sleep(0)  # let requests through between batches
    if pending:
        deleted += await redis.unlink(*pending)
    if deleted:
        logger.info("swept %d keys of stale versions (kept %s)", deleted, current)
    return deleted
