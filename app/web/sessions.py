"""Console sessions: who signed in, in a signed cookie; a CSRF token per session.

The cookie holds who (``admin`` or an operator key's id), the tenant an operator sees (none for
the admin), an expiry, a random session id and, for the admin, a fingerprint of the admin token it
signed in with, signed with HMAC-SHA256 under a key derived from the secret every worker shares
(the response-id secret kept in Redis, app/cache/learning/receipts.py), so any worker opens any session.
A signature alone does not keep a session alive: app/web/guard.py checks at every request that it
was not signed out, that the operator's key still exists with operator rights, and that the admin
token is still the one it signed in with. It is ``HttpOnly``,
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
        sid: Random id: what the CSRF token and a sign-out are bound to.
        key_id: The operator key's id; ``None`` for the admin.
        token_mark: For the admin: a keyed fingerprint of the admin token signed in with, so that
            rotating the token ends the session; empty for an operator.
    """

    who: str
    tenant: str | None
    expires: int
    sid: str
    key_id: str | None = None
    token_mark: str = ""

    @property
    def is_admin(self) -> bool:
        return self.tenant is None

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

    def new(self, who: str, tenant: str | None, now: float | None = None, *, key_id: str | None = None,
            token_mark: str = "") -> tuple[ConsoleSession, str]:
        """A fresh session and its cookie value."""
        session = ConsoleSession(who=who, tenant=tenant, expires=int((now or time.time()) + SESSION_TTL_S),
                                 sid=secrets.token_urlsafe(16), key_id=key_id, token_mark=token_mark)
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

    def token_mark(self, token: str) -> str:
        """A keyed fingerprint of the admin token: equal for the same token, telling nothing of it."""
        return self._mac(b"admin-token|" + token.encode())[:22]

    def sign(self, text: str) -> str:
        """A MAC of a text the console itself wrote (a confirmation's details in a redirect)."""
        return self._mac(b"detail|" + text.encode())[:22]

    def csrf_token(self, session: ConsoleSession) -> str:
        return self._mac(_CSRF_DOMAIN + session.sid.encode())

    def csrf_ok(self, session: ConsoleSession, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest((presented or "").encode(), self.csrf_token(session).encode())
