"""Single flight: N concurrent identical misses cause one upstream call, across worker processes.

Within a worker the first request for a key is the leader and the others await its future.
Across workers the leader also holds a lease in Redis (``SET key token NX PX``), short
(``lease_s``, 2 s) and renewed every quarter of it while the leader works, stream included: a
leader that dies (``kill -9`` mid-stream) stops renewing, and its lease is gone within ``lease_s``.
A request in another worker that finds the lease taken waits for the answer to appear in the
cache, checking every ``poll_s``. If the lease disappears without an answer (the leader died, or
its answer was not cacheable), the waiting request goes on by itself. A leader whose model call
failed leaves its error in the lease for a moment (``failed:<error>``), so followers everywhere
answer with that error instead of calling a failing (or hanging) model server again: each request
costs at most one upstream timeout. Leases are renewed, failed and released only by their holder
(compare-and-set), so a slow leader never touches a lease someone else took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import msgspec

from app.cache.storage.contract import CACHE_ERRORS, SharedRedis
from app.errors import StrataError
from app.metrics import Metrics

logger = logging.getLogger("strata.singleflight")

# What a leader hands its followers in this worker: the answer, the upstream's error (shared,
# so a failing model server sees one call, not one per follower), or None: go on by yourselves.
FlightResult = bytes | StrataError | None

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lease. ARGV: token, milliseconds.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: lease. ARGV: token, the failure, milliseconds it is kept.
_FAIL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
# A lease's value once its leader failed: the followers that waited for it answer with this error;
# a request arriving after the failure takes the lease over (a retry reaches the model).
FAILED_PREFIX = b"failed:"
# KEYS: lease. ARGV: token, milliseconds.
_ACQUIRE = f"""
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, {len(FAILED_PREFIX)}) ~= '{FAILED_PREFIX.decode()}' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class SharedFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A leader's upstream error as other workers' followers re-raise it."""

    message: str
    status: int
    type: str
    code: str | int | None = None
    param: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)

    @classmethod
    def of(cls, error: StrataError) -> SharedFailure:
        return cls(message=error.message, status=error.status_code, type=error.error_type, code=error.code,
                   param=error.param, headers=dict(error.headers))

    def error(self) -> StrataError:
        return StrataError(self.message, status_code=self.status, error_type=self.type, code=self.code,
                           param=self.param, headers=dict(self.headers))


_failure_decoder = msgspec.json.Decoder(SharedFailure)


class Lease:
    """A held lease, renewed in the background until it is released or failed (only while ours)."""

    def __init__(self, flight: SingleFlight, key: str, token: str) -> None:
        self._flight, self.key, self._token = flight, key, token
        self._keeper = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        flight = self._flight
        while True:
            await asyncio.sleep(flight.renew_s)
            try:
                if not await flight._renew(keys=[self.key], args=[self._token, flight.lease_ms]):
                    return  # taken over or gone: nothing left to keep
            except CACHE_ERRORS as exc:
                flight._metrics.cache_failed("singleflight", "renew", exc)

    def stop(self) -> None:
        """Stop renewing (the lease then lives out its last ``lease_s``)."""
        self._keeper.cancel()

    async def release(self) -> None:
        self.stop()
        await self._flight._release(keys=[self.key], args=[self._token])

    async def fail(self, error: StrataError) -> None:
        """Leave the error in the lease for a moment: other workers' followers answer with it."""
        self.stop()
        shared = FAILED_PREFIX + msgspec.json.encode(SharedFailure.of(error))
        await self._flight._fail(keys=[self.key], args=[self._token, shared, self._flight.failure_ms])


class Ticket:
    """What :meth:`SingleFlight.coalesce` hands a request.

    Either ``answer`` holds another request's answer (``source`` says from where: ``local`` or
    ``remote``), or this request must ask the model itself and then call :meth:`finish` exactly
    once with what it got (``source`` is ``leader``, or ``alone`` when it goes uncoordinated).
    """

    def __init__(self, source: str, answer: bytes | None = None,
                 done: Callable[[FlightResult], Awaitable[None]] | None = None) -> None:
        self.source = source
        self.answer = answer
        self._done = done

    async def finish(self, outcome: FlightResult) -> None:
        """Hand the leader's outcome to its followers and release the lease (idempotent)."""
        done, self._done = self._done, None
        if done is not None:
            await done(outcome)


class SingleFlight:
    """One upstream call per key across the workers sharing a Redis.

    Args:
        redis: The Redis the leases live in.
        metrics: Where roles and lease failures are counted.
        lease_s: How long a lease lives without renewal: how soon a dead leader's followers go on.
        poll_s: How often a follower in another worker looks for the answer.
        max_wait_s: The longest a follower waits for a leader in another worker (the upstream
            timeout and some: a live leader's call ends by then, one way or the other).
        failure_s: How long a failed leader's error answers its followers.
    """

    def __init__(self, redis: SharedRedis, metrics: Metrics, *, lease_s: float, poll_s: float, max_wait_s: float = 130.0,
                 failure_s: float = 1.0) -> None:
        self._redis = redis
        self._metrics = metrics
        self.lease_ms = max(1, int(lease_s * 1000))
        self.renew_s = lease_s / 4
        self.failure_ms = max(1, int(failure_s * 1000))
        self._max_wait_s = max_wait_s
        self._poll = poll_s
        self._release = redis.register_script(_RELEASE)
        self._take = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._fail = redis.register_script(_FAIL)
        self._local: dict[str, asyncio.Future[FlightResult]] = {}

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
        future: asyncio.Future[FlightResult] = asyncio.get_running_loop().create_future()
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
        except StrataError as exc:  # another worker's leader failed: so do its followers here
            self._finish_local(key, future, exc)
            raise
        except BaseException:
            if lease is not None:
                lease.stop()
            self._finish_local(key, future, None)
            raise
        self._metrics.singleflight.labels("leader").inc()

        async def done(outcome: FlightResult) -> None:
            self._finish_local(key, future, outcome)
            if lease is not None:
                try:
                    if isinstance(outcome, StrataError):
                        await lease.fail(outcome)  # the same request fails the same way: followers share it
                    else:
                        await lease.release()
                except CACHE_ERRORS as exc:
                    self._metrics.cache_failed("singleflight", "release", exc)  # it expires by itself

        return Ticket("leader", done=done)

    def _finish_local(self, key: str, future: asyncio.Future[FlightResult], answer: FlightResult) -> None:
        if not future.done():
            future.set_result(answer)
        if self._local.get(key) is future:
            del self._local[key]

    async def _acquire(self, key: str) -> Lease | None:
        """Take the cross-worker lease, or ``None`` when another worker leads."""
        token = secrets.token_hex(8)
        if await self._take(keys=[key], args=[token, self.lease_ms]):
            return Lease(self, key, token)
        return None

    async def _wait(self, key: str, read: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        """Wait for another worker's leader: its answer once stored, or ``None`` when it is gone.

        Raises:
            StrataError: The leader's model call failed; its error is this request's answer too.
        """
        deadline = time.monotonic() + self._max_wait_s
        waited = False
        while time.monotonic() < deadline:
            answer = await read()
            if answer is not None:
                return answer
            holder = await self._redis.get(key)
            if holder is None:
                return await read()  # stored just before the lease went, or nothing
            if isinstance(holder, bytes) and holder.startswith(FAILED_PREFIX):
                if not waited:
                    return None  # it failed before this request came: ask again, as a leader
                self._metrics.singleflight.labels("follower_failed").inc()
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    raise _failure_decoder.decode(holder[len(FAILED_PREFIX):]).error()
                return None
            waited = True
            await asyncio.sleep(self._poll)
        logger.warning("gave up waiting %.0f s for the leader of %s", self._max_wait_s, key)
        return None
