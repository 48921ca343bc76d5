"""A real Strata (uvicorn in a thread) over the test Redis and the session's fake upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import FakeUpstream, serve_strata, strata_settings


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


@pytest.fixture(scope="module")
def learning_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    """Strata with the semantic layer (learning settles at once), serving on a free port."""
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0)
    with serve_strata(settings, use_encoder) as server:
        yield server.url
