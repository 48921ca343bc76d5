"""Shared fixtures: a Redis Stack of the test session's own (never the `make up` one on 6380)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.replay.simulate import own_redis_stack

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Start Redis Stack on a free port with its own data folder; stop it after the session."""
    port = int(os.environ.get("STRATA_TEST_REDIS_PORT") or 0) or None
    with own_redis_stack(port) as url:
        yield url


@pytest.fixture
def redis_sync(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the test Redis, emptied before each test (it is the tests' own server)."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def use_encoder():
    """The default embedder (USE multilingual v3, int8 ONNX), loaded once for the session."""
    from app.embed import load_encoder

    return load_encoder("use-multilingual")
