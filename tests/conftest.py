"""Shared fixtures: a Redis Stack of the test session's own (never the `make up` one on 6380)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Start Redis Stack on a free port with its own data folder; stop it after the session."""
    port = int(os.environ.get("STRATA_TEST_REDIS_PORT") or free_port())
    assert port != 6380, "tests must never use the make-up Redis on 6380"
    data = tempfile.mkdtemp(prefix="strata-test-redis-")
    env = {**os.environ, "STACK_REDIS_PORT": str(port), "STACK_REDIS_DIR": data, "STACK_REDIS_MAXMEMORY": "256mb"}
    launcher = str(ROOT / "redis-stack" / "redis-stack.sh")
    subprocess.run([launcher, "start"], check=True, env=env, capture_output=True, text=True)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([launcher, "stop"], env=env, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


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
