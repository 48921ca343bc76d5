"""Console sessions (app/web/sessions.py): signed, expiring, bound to their CSRF token."""

from __future__ import annotations

from app.web.sessions import SESSION_TTL_S, SessionSigner


def test_a_session_opens_only_as_signed_and_before_it_expires() -> None:
    signer = SessionSigner(b"secret")
    session, cookie = signer.new("operator:abc", "acme", now=1000.0)
    opened = signer.open(cookie, now=1001.0)
    assert opened == session and opened is not None and opened.sees("acme") and not opened.sees("default")
    assert signer.open(cookie, now=1000.0 + SESSION_TTL_S + 1) is None  # expired
    body, _, mac = cookie.rpartition(".")
    assert signer.open(body + "." + mac[:-1] + ("A" if mac[-1] != "A" else "B"), now=1001.0) is None  # altered mac
    forged_body = body[:-2] + ("xx" if body[-2:] != "xx" else "yy")
    assert signer.open(forged_body + "." + mac, now=1001.0) is None  # altered body
    assert SessionSigner(b"another secret").open(cookie, now=1001.0) is None
    assert signer.open(None) is None and signer.open("garbage") is None and signer.open("a.b") is None


def test_the_csrf_token_is_the_sessions_own() -> None:
    signer = SessionSigner(b"secret")
    admin, _ = signer.new("admin", None)
    other, _ = signer.new("admin", None)
    assert admin.sees("anyone")
    token = signer.csrf_token(admin)
    assert signer.csrf_ok(admin, token)
    assert not signer.csrf_ok(other, token) and not signer.csrf_ok(admin, None) and not signer.csrf_ok(admin, "")
