"""Tenants from API keys.

A key looks like ``sk-strata-<key id>-<secret>``. The keys file (JSON, path in
``STRATA_KEYS_FILE``) stores per key its id, tenant, a random salt and sha256(salt + secret),
never the key itself. The id finds the record, so checking a key costs one hash and one
constant-time comparison. The file is re-read when it changes, so a revocation takes effect
without a restart. Without a keys file every request belongs to the default tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

import msgspec

from app.errors import Unauthorized

DEFAULT_TENANT = "default"
KEY_PREFIX = "sk-strata-"
_RELOAD_CHECK_S = 1.0
MAX_USER_CHARS = 256


def valid_user(user: str) -> bool:
    """A user id: 1 to 256 printable characters, not only spaces (it goes into keys and logs)."""
    return 0 < len(user) <= MAX_USER_CHARS and user.isprintable() and bool(user.strip())


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One API key (its hash).

    Attributes:
        user: The one user the key belongs to, if it is a user's own key: the identity of
            per-user categories, which no header or body field can then change.
        may_refresh: Whether ``Cache-Control: no-cache`` from this key may rewrite the answer the
            tenant's other clients are served (a tenant policy; otherwise it only skips the lookup).
        operator: Whether the key signs its tenant's operators in to the console (``/console``),
            where they see and change that tenant's cache only.
    """

    id: str
    tenant: str
    salt: str
    sha256: str
    created_at: int
    revoked: bool = False
    user: str | None = None
    may_refresh: bool = False
    operator: bool = False


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Who sent a request, as its API key says.

    Attributes:
        tenant: The tenant.
        user: The key's own user, or ``None`` for a tenant-wide key (or no keys file).
        may_refresh: Whether the key may rewrite shared entries with ``no-cache``.
        operator: Whether the key is a tenant operator's (the console).
    """

    tenant: str
    user: str | None = None
    may_refresh: bool = False
    operator: bool = False


class KeysFile(msgspec.Struct, kw_only=True):
    keys: list[KeyRecord] = msgspec.field(default_factory=list)


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def read_keys(path: Path) -> KeysFile:
    if not path.exists():
        return KeysFile()
    try:
        return msgspec.json.decode(path.read_bytes(), type=KeysFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"keys file {path}: {exc}") from exc


def write_keys(path: Path, keys: KeysFile) -> None:
    """Write atomically (rename), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_bytes(msgspec.json.format(msgspec.json.encode(keys), indent=2))
    os.chmod(temporary, 0o600)
    temporary.replace(path)


def add_key(path: Path, tenant: str, *, user: str | None = None, may_refresh: bool = False,
            operator: bool = False) -> tuple[str, KeyRecord]:
    """Create a key for a tenant (or one of its users); returns the key (shown once) and its record."""
    if not tenant or len(tenant) > 256:
        raise ValueError("a tenant name must have 1 to 256 characters")
    if user is not None and not valid_user(user):
        raise ValueError(f"a user id has 1 to {MAX_USER_CHARS} printable characters")
    if operator and user is not None:
        raise ValueError("an operator key is the tenant's, not one user's")
    keys = read_keys(path)
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    record = KeyRecord(id=key_id, tenant=tenant, salt=salt, sha256=_digest(salt, secret), created_at=int(time.time()),
                       user=user, may_refresh=may_refresh, operator=operator)
    keys.keys.append(record)
    write_keys(path, keys)
    return f"{KEY_PREFIX}{key_id}-{secret}", record


def revoke_key(path: Path, key_id: str) -> bool:
    keys = read_keys(path)
    found = False
    for index, record in enumerate(keys.keys):
        if record.id == key_id and not record.revoked:
            keys.keys[index] = msgspec.structs.replace(record, revoked=True)
            found = True
    if found:
        write_keys(path, keys)
    return found


def new_admin_token(path: Path, *, rotate: bool = False) -> tuple[str, bool]:
    """The admin token kept in ``path`` (0600), made when missing or when ``rotate`` is asked.

    Returns:
        (the token, whether it was written now).
    """
    if path.exists() and not rotate:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    temporary = path.with_suffix(path.suffix + ".tmp")
    # Created 0600 from the start: the token is never readable by others, not even for a moment.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.chmod(temporary, 0o600)
    temporary.replace(path)
    return token, True


class AdminToken:
    """The admin token: ``STRATA_ADMIN_TOKEN``, else the first line of ``STRATA_ADMIN_TOKEN_FILE``
    (what ``make up`` writes), re-read when the file changes, so that rotating it
    (``strata admin-token rotate``) ends every admin session and API use of the old one at once.

    Args:
        token: The token given directly, or ``None``.
        path: The token's file, or ``None``.
    """

    def __init__(self, token: str | None, path: Path | None) -> None:
        # Stripped as the file's line is: a Secret made from a file keeps its final newline.
        self._fixed = (token or "").strip() or None
        self._path = path
        self._read: str | None = None
        self._stamp: tuple[int, int] | None = None
        self._checked = -_RELOAD_CHECK_S

    @property
    def source(self) -> str | None:
        """Where the token comes from, for messages: the variable or the file; ``None``: nowhere."""
        if self._fixed is not None:
            return "STRATA_ADMIN_TOKEN"
        return str(self._path) if self._path is not None else None

    def current(self) -> str | None:
        """The token in force now; ``None``: admin endpoints and the admin's console are off."""
        if self._fixed is not None or self._path is None:
            return self._fixed
        now = time.monotonic()
        if now - self._checked >= _RELOAD_CHECK_S:
            self._checked = now
            try:
                stat = self._path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    self._read = self._path.read_text(encoding="utf-8").strip() or None
                    self._stamp = stamp
            except OSError:
                self._read, self._stamp = None, None
        return self._read


class TenantResolver:
    """Maps ``Authorization: Bearer <key>`` to a tenant."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._by_id: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        if path is not None:
            self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        assert self._path is not None
        now = time.monotonic()
        if not force and now - self._checked < _RELOAD_CHECK_S:
            return
        self._checked = now
        try:
            stat = self._path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = (0, 0)
        if stamp == self._stamp:
            return
        self._by_id = {r.id: r for r in read_keys(self._path).keys if not r.revoked}
        self._stamp = stamp

    def tenant(self, authorization: str | None) -> str:
        """The tenant of a request.

        Raises:
            Unauthorized: Keys are configured and the key is missing, malformed, unknown or revoked.
        """
        return self.caller(authorization).tenant

    def caller(self, authorization: str | None) -> Caller:
        """Who sent a request: tenant, the key's own user, what the key may do.

        Raises:
            Unauthorized: Keys are configured and the key is missing, malformed, unknown or revoked.
        """
        if self._path is None:
            return Caller(tenant=DEFAULT_TENANT)
        self._reload()
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.startswith(KEY_PREFIX):
            raise Unauthorized("a valid API key is required (Authorization: Bearer sk-strata-...)", code="invalid_api_key")
        key_id, _, secret = key[len(KEY_PREFIX) :].partition("-")
        record = self._by_id.get(key_id)
        if record is None or not hmac.compare_digest(_digest(record.salt, secret), record.sha256):
            raise Unauthorized("the API key is not valid", code="invalid_api_key")
        return Caller(tenant=record.tenant, user=record.user, may_refresh=record.may_refresh, operator=record.operator)

    @property
    def configured(self) -> bool:
        """Whether a keys file is in use (requests then need a key)."""
        return self._path is not None

    def known_tenants(self) -> set[str]:
        """The tenants of the active keys (none without a keys file)."""
        if self._path is None:
            return set()
        self._reload()
        return {record.tenant for record in self._by_id.values()}

    def record(self, key_id: str) -> KeyRecord | None:
        """The active (unrevoked) key of this id, as the keys file says now; ``None``: no such key."""
        if self._path is None:
            return None
        self._reload()
        return self._by_id.get(key_id)
