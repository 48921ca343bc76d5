"""Shared fixtures: a Redis Stack of the test session's own (never the `make up` one on 6380), the
session's fake upstream, the embedding model. Helpers that are not fixtures are in tests/support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.replay.simulate import own_redis_stack
from tests.support import FakeUpstream, fake_upstream_served

ROOT = Path(__file__).resolve().parent.parent
# Every head reads the index's vectors unless a test names the English reader: what a test loads
# must not depend on whether `make up` exported one into .run/ (the CLI and servers it starts too).
os.environ.setdefault("STRATA_INTENT_READER_EN", "off")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--redis-cluster", action="store_true",
                     help="run the tests on a 3-master Redis Cluster of their own (cluster mode) instead of one Redis")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--redis-cluster"):
        return
    for item in items:
        marker = item.get_closest_marker("single_node")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"single node only: {marker.args[0] if marker.args else ''}"))


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    """The session's fake OpenAI-compatible upstream (tests ``reset()`` it before they count)."""
    with fake_upstream_served() as upstream:
        yield upstream


@pytest.fixture(scope="session")
def on_cluster(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--redis-cluster"))


@pytest.fixture(scope="session")
def redis_url(on_cluster: bool) -> Iterator[str]:
    """Start Redis Stack on a free port with its own data folder (with ``--redis-cluster``, a
    3-master cluster of them); stop it after the session."""
    if on_cluster:
        from tests.cluster.conftest import local_cluster

        with local_cluster() as cluster:
            yield "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in cluster.ports)
        return
    port = int(os.environ.get("STRATA_TEST_REDIS_PORT") or 0) or None
    with own_redis_stack(port) as url:
        yield url


@pytest.fixture
def redis_sync(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the test Redis, emptied before each test (it is the tests' own server);
    on a cluster, a cluster client (every master emptied)."""
    if redis_url.startswith("redis+cluster://"):
        from redis.cluster import RedisCluster

        host, port = redis_url.removeprefix("redis+cluster://").split(",")[0].split(":")
        from app.cache.storage.keys import BUCKETS_KEY

        cluster = RedisCluster(host=host, port=int(port))
        # Strata servers of a module outlive a test: their bucket tags stay (they would be the same).
        tags = cluster.get(BUCKETS_KEY)
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        if tags is not None:
            cluster.set(BUCKETS_KEY, tags)
        yield cluster  # type: ignore[misc]
        cluster.close()
        return
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def use_encoder():
    """The default embedder (USE multilingual v3, int8 ONNX), loaded once for the session."""
    from app.embed import load_encoder

    return load_encoder("use-multilingual")
