"""Counts kept in memory and added to Redis in batches: requests by category and outcome per
minute (``strata cache stats``), the same per tenant and answering layer with their latency (the
console's overview), and semantic documents' hits.

Prometheus keeps the service's metrics; this keeps the last two hours where an operator with
only ``redis-cli`` can see them (``HGETALL strata:meta:usage:202612011405``), summed over every
worker and instance. Each worker counts in memory and adds its counts every few seconds, so a
request costs no Redis command.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import Counter

from redis.asyncio import Redis

from app.cache.storage.contract import SharedRedis
from app.cache.storage.keys import FIELD_HITS, layers_key, usage_key

logger = logging.getLogger("strata.usage")

# Minutes kept: `strata cache stats` reads the last hour of them.
USAGE_TTL_S = 2 * 3600
FLUSH_EVERY_S = 5.0


# The layers a request is answered by, as the console names them: a curated answer is told apart
# from the model's answers whether it was found exactly or semantically; a request that waited for
# an identical request's model answer (single flight) is ``coalesced``: no model call of its own,
# but no hit either (it waited as long as the model took).
LAYERS = ("exact", "semantic", "curated", "coalesced", "miss", "bypass", "error")
_LAYER_OF_OUTCOME = {"exact-hit": "exact", "semantic-hit": "semantic", "miss": "miss", "bypass": "bypass",
                     "error": "error"}
# Upper bounds (ms) of the latency histogram: fine where hits are (a few ms), coarse where the
# model is (seconds). A percentile read from it is the bound of the bucket it falls in.
LATENCY_BOUNDS_MS = (1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200, 300, 500, 800, 1300, 2000, 3000, 5000, 8000,
                     13000, 20000, 30000, 60000, 120000)
# Field kinds of strata:meta:layers:<minute>: requests, summed milliseconds, and ``le<ms>`` buckets.
KIND_REQUESTS = "n"
KIND_MILLISECONDS = "ms"


def usage_field(category: str, outcome: str) -> str:
    return f"{category}|{outcome}"


def layer_field(kind: str, layer: str, category: str, tenant: str) -> str:
    """A field of the layers hash; the tenant last, so that a ``|`` in its name splits nothing."""
    return f"{kind}|{layer}|{category}|{tenant}"


def parse_layer_field(field: str) -> tuple[str, str, str, str] | None:
    """(kind, layer, category, tenant) of a layers field, or ``None`` for one of another shape."""
    parts = field.split("|", 3)
    return (parts[0], parts[1], parts[2], parts[3]) if len(parts) == 4 else None


def latency_bucket(milliseconds: float) -> str:
    """The histogram field kind a latency falls in (``le<bound>``; ``le+inf`` past the last)."""
    index = bisect.bisect_left(LATENCY_BOUNDS_MS, milliseconds)
    return f"le{LATENCY_BOUNDS_MS[index]}" if index < len(LATENCY_BOUNDS_MS) else "le+inf"


class UsageCounts:
    """This worker's counts since the last flush."""

    def __init__(self) -> None:
        self._pending: Counter[tuple[int, str]] = Counter()
        self._layers: Counter[tuple[int, str]] = Counter()

    def add(self, category: str, outcome: str, now: float | None = None, *, tenant: str | None = None,
            seconds: float | None = None, curated: bool = False, coalesced: bool = False) -> None:
        """Count one finished request.

        Args:
            category: Its content category.
            outcome: Its ``X-Cache`` outcome.
            now: When it finished (Unix time; now if omitted).
            tenant: Its tenant: also counted per tenant and layer, with its latency.
            seconds: How long it took, for the per-layer latency.
            curated: Whether a curated answer served it.
            coalesced: Whether it was answered by waiting on an identical request's model answer.
        """
        minute = int((time.time() if now is None else now) // 60)
        self._pending[(minute, usage_field(category, outcome))] += 1
        if tenant is None:
            return
        layer = "coalesced" if coalesced else "curated" if curated else _LAYER_OF_OUTCOME.get(outcome, outcome)
        self._layers[(minute, layer_field(KIND_REQUESTS, layer, category, tenant))] += 1
        if seconds is not None:
            milliseconds = max(0.0, seconds * 1000)
            self._layers[(minute, layer_field(KIND_MILLISECONDS, layer, category, tenant))] += round(milliseconds)
            self._layers[(minute, layer_field(latency_bucket(milliseconds), layer, category, tenant))] += 1

    async def flush(self, redis: SharedRedis) -> int:
        """Add the pending counts to Redis (one pipeline); kept for the next flush if it fails."""
        if not self._pending and not self._layers:
            return 0
        pending, self._pending = self._pending, Counter()
        layers, self._layers = self._layers, Counter()
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for (minute, field), count in pending.items():
                    pipe.hincrby(usage_key(minute), field, count)
                for (minute, field), count in layers.items():
                    pipe.hincrby(layers_key(minute), field, count)
                for minute in {m for m, _ in pending}:
                    pipe.expire(usage_key(minute), USAGE_TTL_S)
                for minute in {m for m, _ in layers}:
                    pipe.expire(layers_key(minute), USAGE_TTL_S)
                await pipe.execute()
        except BaseException:
            self._pending.update(pending)
            self._layers.update(layers)
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
