"""What keeps console sessions honest beyond their signature, and sign-in guessing slow.

A session is refused at its next request when it was signed out (``strata:console:ended:<sid>``,
kept only until the session would have expired anyway), when the operator key it signed in with
is revoked or has lost operator rights or its tenant, or when the admin token was rotated. Failed
sign-ins are counted per client address and per token prefix in a fixed window
(``strata:console:signin:...``); past the limit sign-in answers 429 with ``Retry-After``. If Redis
cannot answer, a session is refused (fail closed): the console is never more open than Redis says.
"""

from __future__ import annotations

import hashlib
import time

from app.auth import KEY_PREFIX, AdminToken, TenantResolver
from app.cache.storage.contract import CACHE_ERRORS, SharedRedis
from app.cache.storage.keys import CONSOLE_ENDED_PREFIX, CONSOLE_SIGNIN_PREFIX
from app.web.sessions import ConsoleSession, SessionSigner


def token_prefix(token: str) -> str:
    """What a guesser keeps fixed while trying secrets: an API key's id, or a token's first 8 characters."""
    if token.startswith(KEY_PREFIX):
        return token[: len(KEY_PREFIX)] + token[len(KEY_PREFIX):].partition("-")[0]
    return token[:8]


def _signin_key(kind: str, value: str) -> str:
    # Hashed: a token prefix is part of a secret and has no business in redis-cli's output.
    return f"{CONSOLE_SIGNIN_PREFIX}{kind}:{hashlib.sha256(value.encode()).hexdigest()[:16]}"


def _signin_keys(address: str, token: str) -> list[str]:
    """The two counters a sign-in attempt is held to: its client address's and its token prefix's."""
    return [_signin_key("addr", address), _signin_key("prefix", token_prefix(token))]


class ConsoleGuard:
    """Checks sessions against what holds now, ends them, and limits sign-in attempts.

    Args:
        redis: The shared Redis (``None``: no Redis, so no session is valid).
        signer: The sessions' signer.
        admin: The admin token in force.
        tenants: The API keys (operators).
        attempts: Failed sign-ins allowed per address and per prefix in a window.
        window_s: The window's length in seconds.
    """

    def __init__(self, redis: SharedRedis | None, signer: SessionSigner, admin: AdminToken, tenants: TenantResolver,
                 attempts: int, window_s: int) -> None:
        self._redis = redis
        self._signer = signer
        self._admin = admin
        self._tenants = tenants
        self._attempts = attempts
        self._window_s = window_s

    def principal_holds(self, session: ConsoleSession) -> bool:
        """Whether the admin token, or the operator's key, is still what the session signed in with."""
        if session.is_admin:
            token = self._admin.current()
            return bool(token) and session.token_mark == self._signer.token_mark(token or "")
        record = self._tenants.record(session.key_id or "")
        return record is not None and record.operator and record.tenant == session.tenant

    async def valid(self, session: ConsoleSession) -> bool:
        """Whether a signed, unexpired session may act now."""
        if not self.principal_holds(session) or self._redis is None:
            return False
        try:
            return not await self._redis.exists(CONSOLE_ENDED_PREFIX + session.sid)
        except CACHE_ERRORS:
            return False

    async def end(self, session: ConsoleSession) -> None:
        """Sign a session out on every worker, until it would have expired anyway."""
        if self._redis is None:
            return
        remaining = max(1, session.expires - int(time.time()))
        await self._redis.set(CONSOLE_ENDED_PREFIX + session.sid, "1", ex=remaining)

    async def wait_s(self, address: str, token: str) -> int:
        """Seconds until sign-in from this address with this token's prefix is allowed (0: now)."""
        if self._redis is None:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in _signin_keys(address, token):
                pipe.get(key)
                pipe.ttl(key)
            counted, addr_ttl, prefix_counted, prefix_ttl = await pipe.execute()
        waits = [max(int(ttl), 1) for value, ttl in ((counted, addr_ttl), (prefix_counted, prefix_ttl))
                 if value is not None and int(value) >= self._attempts]
        return max(waits, default=0)

    async def failed(self, address: str, token: str) -> int:
        """Count a failed sign-in; returns the larger of the two counts now."""
        if self._redis is None:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in _signin_keys(address, token):
                pipe.incr(key)
                pipe.expire(key, self._window_s, nx=True)
            first, _, second, _ = await pipe.execute()
        return max(int(first), int(second))

    @property
    def attempts(self) -> int:
        return self._attempts
