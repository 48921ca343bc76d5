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

from app.errors import StrataError

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


class SingleFlight:
    def __init__(self, redis: Redis, *, lease_s: float, poll_s: float) -> None:
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._poll = poll_s
        self._release = redis.register_script(_RELEASE)
        self._local: dict[str, asyncio.Future[Outcome]] = {}

    def follow_local(self, key: str) -> asyncio.Future[Outcome] | None:
        """The future of a leader in this worker, if there is one."""
        return self._local.get(key)

    def lead_local(self, key: str) -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._local[key] = future
        return future

    def finish_local(self, key: str, future: asyncio.Future[Outcome], answer: Outcome) -> None:
        """Hand the outcome to this worker's followers."""
        if not future.done():
            future.set_result(answer)
        if self._local.get(key) is future:
            del self._local[key]

    async def acquire(self, key: str) -> Lease | None:
        """Take the cross-worker lease, or ``None`` when another worker leads."""
        token = secrets.token_hex(8)
        if await self._redis.set(key, token, nx=True, px=self._lease_ms):
            return Lease(self, key, token)
        return None

    async def wait(self, key: str, read: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
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
