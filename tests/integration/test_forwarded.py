"""Forwarding headers are believed only from the proxies the operator names (issue #56 item 2):
Strata as production runs it (``python -m app.serve``), so uvicorn's own defaults are what is
tested. A local client's ``X-Forwarded-For`` neither escapes the sign-in lock nor names another
address in the audit."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support import ADMIN_TOKEN, FakeUpstream, free_port, serve_process, stop_process

FORGED = "203.0.113.9"


def _env(redis_url: str, upstream: FakeUpstream, port: int, **extra: str) -> dict[str, str]:
    return {**os.environ, "STRATA_REDIS_URL": redis_url, "STRATA_UPSTREAM_URL": upstream.url + "/v1",
            "STRATA_PORT": str(port), "STRATA_ADMIN_TOKEN": ADMIN_TOKEN, "STRATA_SEMANTIC_ENABLED": "false",
            "STRATA_CONSOLE_SIGNIN_ATTEMPTS": "3", **extra}


@pytest.fixture
def clean_signins(redis_sync: redis.Redis) -> Iterator[None]:
    def clean() -> None:
        for key in redis_sync.scan_iter(match="strata:console:signin:*"):
            redis_sync.delete(key)
    clean()
    yield
    clean()


def _sign_in(base: str, token: str, forwarded: str | None = None) -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    return httpx.post(base + "/console/login", data={"token": token}, headers=headers, timeout=10)


def _last_sign_in(redis_sync: redis.Redis) -> str:
    for _, fields in redis_sync.xrevrange("strata:meta:audit", count=20):
        if fields.get(b"kind") == b"sign-in":
            return fields[b"who"].decode()
    raise AssertionError("no sign-in audited")


@pytest.mark.single_node
def test_a_local_client_cannot_forge_its_address_past_the_lock_or_into_the_audit(
        redis_url: str, fake_upstream: FakeUpstream, redis_sync: redis.Redis, clean_signins: None) -> None:
    port = free_port()
    process = serve_process(_env(redis_url, fake_upstream, port), port)
    base = f"http://127.0.0.1:{port}"
    try:
        statuses = [_sign_in(base, f"guess-{n}", forwarded=f"198.51.100.{n}").status_code for n in range(4)]
        assert statuses == [401, 401, 401, 429], statuses
        # The lock is the peer's, whatever address the request claims.
        assert _sign_in(base, ADMIN_TOKEN, forwarded=FORGED).status_code == 429
        for key in redis_sync.scan_iter(match="strata:console:signin:*"):
            redis_sync.delete(key)
        signed = _sign_in(base, ADMIN_TOKEN, forwarded=FORGED)
        assert signed.status_code in (302, 303)
        assert _last_sign_in(redis_sync) == "console:admin@127.0.0.1"
    finally:
        stop_process(process)


@pytest.mark.single_node
def test_a_named_proxy_is_believed(redis_url: str, fake_upstream: FakeUpstream, redis_sync: redis.Redis,
                                   clean_signins: None) -> None:
    port = free_port()
    process = serve_process(_env(redis_url, fake_upstream, port, STRATA_TRUSTED_PROXIES="127.0.0.1"), port)
    try:
        assert _sign_in(f"http://127.0.0.1:{port}", ADMIN_TOKEN, forwarded=FORGED).status_code in (302, 303)
        assert _last_sign_in(redis_sync) == f"console:admin@{FORGED}"
    finally:
        stop_process(process)
