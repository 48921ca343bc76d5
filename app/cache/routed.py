"""A Redis Cluster's buckets behind the contracts of one Redis (docs/SCALING.md).

Each bucket holds a whole keyspace and behaves as a single Redis (app/cache/storage/buckets.py), so the
cluster's cache and invalidator are compositions: one :class:`~app.cache.layered.LayeredCache`
and one :class:`~app.cache.storage.invalidation.CacheInvalidator` per bucket, and a router that sends
each request or invalidation to the bucket (or buckets) that can hold it. Both implement the
same protocols as their single-node peers, so nothing above them knows which it has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from app.cache.layered import CacheMode, CachePlan, LayeredCache
from app.cache.storage.buckets import Buckets, ClusterUnavailable
from app.cache.storage.contract import CacheHit, CacheQuery
from app.cache.storage.invalidation import AuditLog, CacheInvalidator, Invalidated, Invalidation, NothingThere, check_invalidation
from app.cache.storage.keys import CanonicalRequest
from app.cache.storage.version import VersionTag
from app.metrics import Metrics
from app.policy import CategoryPolicy, Policy

logger = logging.getLogger("strata.routed")

NOT_YET = "the Redis Cluster has not answered since start-up"


class RoutedCache:
    """The layered caches of a cluster's buckets as one request cache (``RequestCache``): each
    request goes to its bucket's.

    Args:
        buckets: The buckets (none yet: every request is a bypass, counted as a cache failure).
        caches: One layered cache per bucket, in the buckets' order.
        metrics: Where a cache that is not there yet is counted.
    """

    def __init__(self, buckets: Buckets, caches: Sequence[LayeredCache], metrics: Metrics) -> None:
        if len(caches) != len(buckets.all):
            raise ValueError("one layered cache per bucket")
        self._buckets = buckets
        self._metrics = metrics
        self.caches = tuple(caches)

    @property
    def versions(self) -> VersionTag:
        """The first bucket's version tag (every bump moves all of them)."""
        return self.caches[0].versions

    def _of(self, query: CacheQuery) -> LayeredCache:
        return self.caches[self._buckets.of(query.canonical.tenant, query.category.name)]

    async def plan(self, canonical: CanonicalRequest, category: CategoryPolicy, mode: CacheMode) -> CachePlan:
        if not self.caches:
            if mode is CacheMode.USE or mode is CacheMode.REFRESH:
                self._metrics.cache_failed("version", "read", ClusterUnavailable(NOT_YET))
                return CachePlan(CacheMode.UNAVAILABLE)
            return CachePlan(mode)
        return await self.caches[self._buckets.of(canonical.tenant, category.name)].plan(canonical, category, mode)

    async def lookup(self, plan: CachePlan) -> tuple[CachePlan, CacheHit | None]:
        if plan.query is None:
            return plan, None
        return await self._of(plan.query).lookup(plan)

    def lease_key(self, query: CacheQuery) -> str:
        return self._of(query).lease_key(query)

    async def read_exact(self, query: CacheQuery) -> bytes | None:
        return await self._of(query).read_exact(query)

    async def store(self, plan: CachePlan, raw: bytes, completion: dict[str, Any]) -> None:
        if plan.query is not None:
            await self._of(plan.query).store(plan, raw, completion)

    async def settle(self) -> None:
        await asyncio.gather(*(cache.settle() for cache in self.caches))


class RoutedInvalidator:
    """Invalidations on a Redis Cluster (``Invalidator``): a version bump or a scope moves every
    bucket's copy, a key or a question goes to the bucket that holds it, a user or a curated
    file to every bucket. Audited once, in the stream outside the buckets.

    Args:
        buckets: The buckets (none yet: every invalidation fails as Redis being down would).
        each: One invalidator per bucket, in the buckets' order.
        policy: The categories.
        audit: The audit stream (on the cluster client); ``None`` before the cluster answers.
    """

    def __init__(self, buckets: Buckets, each: Sequence[CacheInvalidator], policy: Policy, audit: AuditLog | None) -> None:
        self._buckets = buckets
        self._each = tuple(each)
        self._policy = policy
        self._audit = audit

    @property
    def audit_log(self) -> AuditLog:
        if self._audit is None:
            raise ClusterUnavailable(NOT_YET)
        return self._audit

    def check(self, what: Invalidation) -> None:
        check_invalidation(what, self._policy)

    async def invalidate(self, what: Invalidation, *, who: str) -> Invalidated:
        self.check(what)
        if not self._each:
            raise ClusterUnavailable(NOT_YET)
        done = await self._carry_out(what)
        await self.audit_log.record(what, done, who)
        return done

    async def audit(self, count: int = 50) -> list[dict[str, str]]:
        if not self._each:
            raise ClusterUnavailable(NOT_YET)
        return await self.audit_log.latest(count)

    async def affected(self, what: Invalidation) -> int:
        if not self._each:
            raise ClusterUnavailable(NOT_YET)
        if what.key is not None:
            return await self.for_key(what.key).affected(what)
        if what.kind == "question":
            category = self._policy.category(what.category)  # checked
            return await self._each[self._buckets.of(what.tenant or "default", category.name)].affected(what)
        return sum([await each.affected(what) for each in self._each])

    def for_key(self, key: str) -> CacheInvalidator:
        index = self._buckets.holding(key)
        if index is None:
            raise NothingThere(f"no bucket of this cluster holds {key}")
        return self._each[index]

    async def entry_of_question(self, what: Invalidation) -> str:
        category = self._policy.category(what.category)  # checked
        return await self._each[self._buckets.of(what.tenant or "default", category.name)].entry_of_question(what)

    async def _carry_out(self, what: Invalidation) -> Invalidated:
        kind = what.kind
        if kind == "user":
            done = await asyncio.gather(*(each.carry_out(what) for each in self._each))
            return msgspec.structs.replace(done[0], deleted=sum(d.deleted for d in done))
        if kind in ("everything", "scope"):
            # Each bucket's lookups check their own copy atomically: no bucket is half-invalidated.
            done = await asyncio.gather(*(each.carry_out(what) for each in self._each))
            logger.info("%s moved in %d buckets", done[0].target, len(done))
            return done[0]
        if kind == "question":
            category = self._policy.category(what.category)  # checked
            return await self._each[self._buckets.of(what.tenant or "default", category.name)].carry_out(what)
        if kind == "key":
            assert what.key is not None
            return Invalidated(kind=kind, target=what.key, deleted=await self.for_key(what.key).delete_entry(what.key))
        results = await asyncio.gather(*(each.carry_out(what) for each in self._each), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, NothingThere)]
        if failures:
            raise failures[0]
        found = [r for r in results if isinstance(r, Invalidated)]
        if not found:
            raise NothingThere(f"no curated answers loaded under {what.faq!r}")
        return Invalidated(kind=kind, target=found[0].target, deleted=sum(r.deleted for r in found))
