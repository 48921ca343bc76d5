"""A real Strata (uvicorn in a thread) over the test Redis and a fake upstream."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support import MODEL, FakeUpstream, ServerThread, serve_strata

ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream()
    with ServerThread(upstream.app()) as server:
        upstream.url = server.url
        yield upstream


def strata_settings(redis_url: str, upstream_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": redis_url,
        "upstream_url": upstream_url + "/v1",
        "upstream_timeout_s": 1.0,
        "upstream_max_retries": 0,
        "admin_token": ADMIN_TOKEN,
        "policy_file": "tests/fixtures/policy.yaml",
        "default_max_tokens": 64,
        "max_tokens_cap": 128,
        "semantic_enabled": False,
    }
    values.update(overrides)
    return Settings.from_flat(values)


@pytest.fixture(scope="module")
def strata(redis_url: str, fake_upstream: FakeUpstream) -> Iterator[str]:
    """Strata with the exact layer only, serving on a free port."""
    with serve_strata(strata_settings(redis_url, fake_upstream.url)) as server:
        yield server.url


@pytest.fixture
def client(strata: str, redis_sync: object, fake_upstream: FakeUpstream) -> Iterator[httpx.Client]:
    fake_upstream.reset()
    with httpx.Client(base_url=strata, timeout=10) as http:
        yield http


def chat(question: str = "How do I get a refund?", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}
