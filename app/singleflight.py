"""Single flight: N concurrent identical misses cause one upstream call, across worker processes.

Within a worker the first request for a key is the leader and the others await its future.
Across workers the leader also holds a lease in Redis (``SET key token NX PX``); a request in
another worker that finds the lease taken waits for the answer to appear in the cache,
checking every ``poll_s``. If the lease disappears without an answer (the leader failed, or its
answer was not cacheable) or outlives ``lease_s`` (the leader died), the waiting request goes on
by itself. The lease is released with a compare-and-delete, so a slow leader never frees a
lease someone else took over.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from app.cache.base import CACHE_ERRORS
from app.errors import StrataError
from app.metrics import Metrics

# What a leader hands its followers in this worker: the answer, the upstream's error (shared,
# so a failing model server sees one call, not one per follower), or None: go on by yourselves.
Outcome = bytes | StrataError | None

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lease:
    """A held lease; ``release`` gives it back only if it is still ours."""

    def __init__(self, flight: SingleFlight, key: str, token: str) -> None:
        self._flight, self.key, self._token = flight, key, token

    async def release(self) -> None:
        await self._flight._release(keys=[self.key], args=[self._token])


class Ticket:
    """What :meth:`SingleFlight.coalesce` hands a request.

    Either ``answer`` holds another request's answer (``source`` says from where: ``local`` or
    ``remote``), or this request must ask the model itself and then call :meth:`finish` exactly
    once with what it got (``source`` is ``leader``, or ``alone`` when it goes uncoordinated).
    """

    def __init__(self, source: str, answer: bytes | None = None,
                 done: Callable[[Outcome], Awaitable[None]] | None = None) -> None:
        self.source = source
        self.answer = answer
        self._done = done

    async def finish(self, outcome: Outcome) -> None:
        """Hand the leader's outcome to its followers and release the lease (idempotent)."""
        done, self._done = self._done, None
        if done is not None:
            await done(outcome)


class SingleFlight:
    """One upstream call per key across the workers sharing a Redis.

    Args:
        redis: The Redis the leases live in.
        metrics: Where roles and lease failures are counted.
        lease_s: How long a lease lives (longer than any upstream call).
        poll_s: How often a follower in another worker looks for the answer.
    """

    def __init__(self, redis: Redis, metrics: Metrics, *, lease_s: float, poll_s: float) -> None:
        self._redis = redis
        self._metrics = metrics
        self._lease_ms = int(lease_s * 1000)
        self._poll = poll_s
        self._release = redis.register_script(_RELEASE)
        self._local: dict[str, asyncio.Future[Outcome]] = {}

    async def coalesce(self, key: str, read: Callable[[], Awaitable[bytes | None]]) -> Ticket:
        """Join the request in flight for ``key``, or lead it.

        Args:
            key: The lease key of the request.
            read: Reads the answer from the cache (how another worker's leader delivers it).

        Returns:
            A ticket with the answer, or one whose holder asks the model and then finishes it.

        Raises:
            StrataError: The leader in this worker failed with it; it is shared, not retried.
        """
        leader = self._local.get(key)
        if leader is not None:
            answer = await asyncio.shield(leader)
            if isinstance(answer, StrataError):
                raise answer
            if answer is not None:
                self._metrics.singleflight.labels("follower_local").inc()
                return Ticket("local", answer)
            return Ticket("alone")  # the leader got nothing cacheable: ask by ourselves
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._local[key] = future
        lease = None
        try:
            lease = await self._acquire(key)
            # Holding the lease, or waiting for its holder: either way the answer may already be
            # stored by a leader that finished since this request's lookup missed.
            answer = await read() if lease is not None else await self._wait(key, read)
            if answer is None and lease is None:
                lease = await self._acquire(key)  # it is gone without an answer: lead instead
            if answer is not None:
                if lease is not None:
                    await lease.release()
                self._finish_local(key, future, answer)
                self._metrics.singleflight.labels("follower_remote").inc()
                return Ticket("remote", answer)
        except CACHE_ERRORS as exc:
            self._metrics.cache_failed("singleflight", "lease", exc)  # go on uncoordinated
        except BaseException:
            self._finish_local(key, future, None)
            raise
        self._metrics.singleflight.labels("leader").inc()

        async def done(outcome: Outcome) -> None:
            self._finish_local(key, future, outcome)
            if lease is not None:
                try:
                    await lease.release()
                except CACHE_ERRORS as exc:
                    self._metrics.cache_failed("singleflight", "release", exc)  # it expires by itself

        return Ticket("leader", done=done)

    def _finish_local(self, key: str, future: asyncio.Future[Outcome], answer: Outcome) -> None:
        if not future.done():
            future.set_result(answer)
        if self._local.get(key) is future:
            del self._local[key]

    async def _acquire(self, key: str) -> Lease | None:
        """Take the cross-worker lease, or ``None`` when another worker leads."""
        token = secrets.token_hex(8)
        if await self._redis.set(key, token, nx=True, px=self._lease_ms):
            return Lease(self, key, token)
        return None

    async def _wait(self, key: str, read: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        """Wait for another worker's leader: its answer once stored, or ``None`` when it is gone."""
        deadline = time.monotonic() + self._lease_ms / 1000
        while time.monotonic() < deadline:
            answer = await read()
            if answer is not None:
                return answer
            if not await self._redis.exists(key):
                return await read()  # stored just before the lease went, or nothing
            await asyncio.sleep(self._poll)
        return None
