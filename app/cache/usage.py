"""Counts kept in memory and added to Redis in batches: requests by category and outcome per
minute (``strata cache stats``), and semantic documents' hits.

Prometheus keeps the service's metrics; this keeps the last two hours where an operator with
only ``redis-cli`` can see them (``HGETALL strata:meta:usage:202612011405``), summed over every
worker and instance. Each worker counts in memory and adds its counts every few seconds, so a
request costs no Redis command.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from redis.asyncio import Redis

from app.cache.base import SharedRedis
from app.cache.keys import FIELD_HITS, usage_key

logger = logging.getLogger("strata.usage")

# Minutes kept: `strata cache stats` reads the last hour of them.
USAGE_TTL_S = 2 * 3600
FLUSH_EVERY_S = 5.0


def usage_field(category: str, outcome: str) -> str:
    return f"{category}|{outcome}"


class UsageCounts:
    """This worker's counts since the last flush."""

    def __init__(self) -> None:
        self._pending: Counter[tuple[int, str]] = Counter()

    def add(self, category: str, outcome: str, now: float | None = None) -> None:
        minute = int((time.time() if now is None else now) // 60)
        self._pending[(minute, usage_field(category, outcome))] += 1

    async def flush(self, redis: SharedRedis) -> int:
        """Add the pending counts to Redis (one pipeline); kept for the next flush if it fails."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, Counter()
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for (minute, field), count in pending.items():
                    pipe.hincrby(usage_key(minute), field, count)
                for minute in {m for m, _ in pending}:
                    pipe.expire(usage_key(minute), USAGE_TTL_S)
                await pipe.execute()
        except BaseException:
            self._pending.update(pending)
            raise
        return sum(pending.values())

    async def run(self, redis: SharedRedis, errors: tuple[type[BaseException], ...]) -> None:
        """Flush every few seconds until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(FLUSH_EVERY_S)
                try:
                    await self.flush(redis)
                except errors as exc:
                    logger.debug("usage counts not flushed (kept for the next try): %r", exc)
        finally:
            try:
                async with asyncio.timeout(1):
                    await self.flush(redis)
            except (TimeoutError, *errors):  # type: ignore[misc]  # mypy cannot read a starred tuple of classes
                pass


async def last_hour(redis: SharedRedis, now: float | None = None) -> Counter[tuple[str, str]]:
    """Requests by (category, outcome) over the last 60 minutes, all workers."""
    minute = int((time.time() if now is None else now) // 60)
    async with redis.pipeline(transaction=False) as pipe:
        for m in range(minute - 59, minute + 1):
            pipe.hgetall(usage_key(m))
        rows = await pipe.execute()
    total: Counter[tuple[str, str]] = Counter()
    for row in rows:
        for field, count in row.items():
            category, _, outcome = (field.decode() if isinstance(field, bytes) else field).rpartition("|")
            total[(category, outcome)] += int(count)
    return total


# Adds each pending count to a document that still exists: a count must never create a key
# without a TTL (an entry evicted or invalidated meanwhile stays gone). KEYS: the documents;
# ARGV: their counts, in order.
_ADD_HITS_SCRIPT = f"""
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('HINCRBY', key, '{FIELD_HITS}', ARGV[i]) end
end
return #KEYS
"""
HIT_FLUSH_EVERY_S = 1.0
# Documents per script call: keeps one call short for Redis.
HIT_FLUSH_BATCH = 256


class HitCounts:
    """The ``hits`` of one bucket's semantic documents, counted in memory and added every second
    (issue #32: a semantic hit's only Redis reads are its KNN and at most one record).

    Every key of one bucket shares its hash tag, so one script call adds a batch on a cluster too.

    Args:
        redis: The bucket's Redis.
    """

    def __init__(self, redis: Redis) -> None:
        self._pending: Counter[str] = Counter()
        self._add = redis.register_script(_ADD_HITS_SCRIPT)

    def add(self, document: str) -> None:
        self._pending[document] += 1

    async def flush(self) -> int:
        """Add the pending counts (kept for the next flush if Redis fails)."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, Counter()
        items = list(pending.items())
        try:
            for start in range(0, len(items), HIT_FLUSH_BATCH):
                batch = items[start:start + HIT_FLUSH_BATCH]
                await self._add(keys=[k for k, _ in batch], args=[n for _, n in batch])
        except BaseException:
            self._pending.update(pending)
            raise
        return sum(pending.values())

    async def run(self, errors: tuple[type[BaseException], ...]) -> None:
        """Flush every second until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(HIT_FLUSH_EVERY_S)
                try:
                    await self.flush()
                except errors as exc:
                    logger.debug("hit counts not flushed (kept for the next try): %r", exc)
        finally:
            try:
                async with asyncio.timeout(1):
                    await self.flush()
            except (TimeoutError, *errors):  # type: ignore[misc]  # mypy cannot read a starred tuple of classes
                pass
