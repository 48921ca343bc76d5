"""Console sessions: who signed in, in a signed cookie; a CSRF token per session.

The cookie holds who (``admin`` or an operator key's id), the tenant an operator sees (none for
the admin), an expiry and a random session id, signed with HMAC-SHA256 under a key derived from
the secret every worker shares (the response-id secret kept in Redis, app/cache/receipts.py), so
any worker opens any session and nothing is stored per session. It is ``HttpOnly``,
``SameSite=Strict`` and ``Secure`` (browsers keep Secure cookies on http://localhost too). Every
change carries the session's CSRF token (an HMAC of the session id), checked in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

import msgspec

SESSION_COOKIE = "strata_console"
SESSION_TTL_S = 8 * 3600
_SESSION_DOMAIN = b"strata-console-session-v1"
_CSRF_DOMAIN = b"csrf|"


class ConsoleSession(msgspec.Struct, frozen=True, kw_only=True):
    """A signed-in operator.

    Attributes:
        who: ``admin``, or ``operator:<key id>``.
        tenant: The one tenant an operator sees and changes; ``None``: every tenant (the admin).
        expires: Unix time the session ends.
        sid: Random id: what the CSRF token is bound to.
    """

    who: str
    tenant: str | None
    expires: int
    sid: str

    def sees(self, tenant: str) -> bool:
        """Whether this session may see and change a tenant's cache."""
        return self.tenant is None or self.tenant == tenant


_decoder = msgspec.json.Decoder(ConsoleSession)


class SessionSigner:
    """Signs and opens session cookies and CSRF tokens.

    Args:
        secret: The shared secret the signing key is derived from.
    """

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, _SESSION_DOMAIN, hashlib.sha256).digest()

    def _mac(self, data: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, data, hashlib.sha256).digest()).decode().rstrip("=")

    def new(self, who: str, tenant: str | None, now: float | None = None) -> tuple[ConsoleSession, str]:
        """A fresh session and its cookie value."""
        session = ConsoleSession(who=who, tenant=tenant, expires=int((now or time.time()) + SESSION_TTL_S),
                                 sid=secrets.token_urlsafe(16))
        body = base64.urlsafe_b64encode(msgspec.json.encode(session)).decode().rstrip("=")
        return session, f"{body}.{self._mac(body.encode())}"

    def open(self, cookie: str | None, now: float | None = None) -> ConsoleSession | None:
        """The session a cookie names, or ``None`` (absent, altered, expired, unreadable)."""
        if not cookie or "." not in cookie:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(body.encode()).encode()):
            return None
        try:
            session = _decoder.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, msgspec.DecodeError):
            return None
        return session if session.expires > (now or time.time()) else None

    def csrf_token(self, session: ConsoleSession) -> str:
        return self._mac(_CSRF_DOMAIN + session.sid.encode())

    def csrf_ok(self, session: ConsoleSession, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest((presented or "").encode(), self.csrf_token(session).encode())
