"""Admission limits: a request budget per tenant, and a bound on calls in flight to the model."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app.errors import Overloaded, RateLimited


class TenantRateLimiter:
    """A token bucket per tenant: ``rate`` requests a second, bursts up to ``burst``.

    Per worker process: with W workers behind one port, each holds rate / W, so the tenant's
    total stays at ``rate`` without a Redis round trip on every request.
    """

    def __init__(self, rate: float, burst: float, workers: int = 1) -> None:
        self._rate = rate / max(1, workers)
        self._burst = max(1.0, burst / max(1, workers))
        self._buckets: dict[str, tuple[float, float]] = {}

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def admit(self, tenant: str) -> None:
        """Take one token for the tenant.

        Raises:
            RateLimited: The bucket is empty; ``Retry-After`` is when one token is back.
        """
        if not self.enabled:
            return
        now = time.monotonic()
        tokens, last = self._buckets.get(tenant, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            wait = math.ceil((1.0 - tokens) / self._rate)
            raise RateLimited(
                "request budget exceeded for this API key; retry later", code="rate_limit_exceeded",
                headers={"Retry-After": str(max(1, wait))},
            )
        self._buckets[tenant] = (tokens - 1.0, now)


class ConcurrencyLimit:
    """At most ``limit`` upstream calls at once; others wait up to ``queue_timeout_s``, then 503."""

    def __init__(self, limit: int, queue_timeout_s: float) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._timeout = queue_timeout_s

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=self._timeout)
        except TimeoutError as exc:
            raise Overloaded(
                "the model server is at capacity; retry later", code="upstream_overloaded", headers={"Retry-After": "1"}
            ) from exc
        try:
            yield
        finally:
            self._slots.release()
