"""Faults never take the service down: stampedes, a failing or saturated upstream, Redis that is
down, paused, full or killed, and a shutdown in the middle of a request."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from app.settings import PROJECT_ROOT
from tests.support import MODEL, FakeUpstream, every_keyspace, free_port, scan, serve_process, serve_strata, stop_process, strata_settings

LAUNCHER = str(PROJECT_ROOT / "redis-stack" / "redis-stack.sh")

# Why a test runs on one Redis only (the cluster pass skips it).
ONE_REDIS = ("stops, pauses, fills or kills one Redis process of its own; a killed master of a cluster: "
             "tests/cluster/test_cluster_failover.py")


def body(question: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}


async def burst(urls: list[str], count: int, question: str, stream_every: int = 0) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        async def one(i: int) -> httpx.Response:
            streaming = bool(stream_every) and i % stream_every == 0
            return await client.post(urls[i % len(urls)] + "/v1/chat/completions", json=body(question, stream=streaming))
        return await asyncio.gather(*[one(i) for i in range(count)])


def test_fifty_identical_misses_on_two_workers_make_one_upstream_call(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.delay = 0.5
    settings = strata_settings(redis_url, fake_upstream.url)
    with serve_strata(settings) as one, serve_strata(settings) as two:
        responses = asyncio.run(burst([one.url, two.url], 50, "stampede", stream_every=5))
    assert len(fake_upstream.calls) == 1
    assert all(r.status_code == 200 for r in responses)
    texts = set()
    for response in responses:
        if response.headers["content-type"].startswith("text/event-stream"):
            assert response.text.rstrip().endswith("data: [DONE]")
            texts.add("".join(part for part in response.text.split('"content":"')[1:]).split('"')[0] or "")
        else:
            texts.add(response.json()["choices"][0]["message"]["content"])
    assert "answer #8 to: stampede" in texts
    assert sum(r.headers.get("x-cache-coalesced") == "true" for r in responses) == 49


def test_a_failing_leader_shares_its_error_instead_of_a_retry_storm(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.delay, fake_upstream.status = 0.3, 500
    settings = strata_settings(redis_url, fake_upstream.url)
    with serve_strata(settings) as server:
        responses = asyncio.run(burst([server.url], 20, "fails"))
    assert [r.status_code for r in responses] == [500] * 20  # the model server's own error, shared
    assert len(fake_upstream.calls) == 1
    # The lease holds the failure for a moment (other workers' followers share it), then it is gone.
    leases = list(scan(redis_sync, "strata:v1:lease:*"))
    assert all(redis_sync.get(k) in (None,) or redis_sync.get(k).startswith(b"failed:") for k in leases)
    deadline = time.monotonic() + 10
    while list(scan(redis_sync, "strata:v1:lease:*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(scan(redis_sync, "strata:v1:lease:*"))


def test_the_upstream_concurrency_limit_answers_503(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    fake_upstream.delay = 1.0
    settings = strata_settings(redis_url, fake_upstream.url, upstream_timeout_s=5.0,
                               upstream_max_concurrency=1, upstream_queue_timeout_s=0.2)

    async def two_different(tag: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await asyncio.gather(*[
                client.post(server.url + "/v1/chat/completions", json=body(f"{tag} {i}")) for i in range(2)
            ])

    with serve_strata(settings) as server:
        responses = asyncio.run(two_different("first"))
    assert sorted(r.status_code for r in responses) == [200, 503]
    rejected = next(r for r in responses if r.status_code == 503)
    assert rejected.json()["error"]["type"] == "overloaded_error" and rejected.headers["retry-after"] == "1"


@dataclass
class OwnRedis:
    """A Redis Stack of one test's own, so it can be stopped, paused, filled and killed."""

    port: int
    env: dict[str, str]
    data: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run([LAUNCHER, "start"], env=self.env, check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([LAUNCHER, "stop"], env=self.env, check=True, capture_output=True)

    def kill9(self) -> None:
        pid = int(Path(self.data, "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        Path(self.data, "redis.pid").unlink(missing_ok=True)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    port = free_port()
    data = tempfile.mkdtemp(prefix="strata-fault-redis-")
    own = OwnRedis(port=port, env={**os.environ, "STACK_REDIS_PORT": str(port), "STACK_REDIS_DIR": data}, data=data)
    own.start()
    yield own
    subprocess.run([LAUNCHER, "stop"], env=own.env, capture_output=True)
    shutil.rmtree(data, ignore_errors=True)


def post(url: str, question: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body(question), timeout=15)


@pytest.mark.single_node(ONE_REDIS)
def test_redis_stopped_and_restarted_mid_run(own_redis: OwnRedis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    with serve_strata(strata_settings(own_redis.url, fake_upstream.url)) as server:
        post(server.url, "kept")
        assert post(server.url, "kept").headers["x-cache"] == "exact-hit"
        own_redis.stop()
        down = post(server.url, "kept")
        assert down.status_code == 200 and down.headers["x-cache"] == "bypass"
        assert httpx.get(server.url + "/health").json()["status"] == "degraded"
        own_redis.start()  # same data folder: the AOF brings the entry back
        deadline = time.monotonic() + 10
        while post(server.url, "kept").headers["x-cache"] != "exact-hit":
            assert time.monotonic() < deadline, "the client did not reconnect"
            time.sleep(0.2)
        assert httpx.get(server.url + "/health").json()["redis"]["status"] == "ok"


@pytest.mark.single_node(ONE_REDIS)
def test_a_paused_redis_costs_a_bounded_wait_not_an_outage(own_redis: OwnRedis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    settings = strata_settings(own_redis.url, fake_upstream.url, redis_timeout_s=0.2)
    with serve_strata(settings) as server:
        post(server.url, "paused")
        own_redis.client().execute_command("CLIENT", "PAUSE", "3000", "ALL")
        started = time.monotonic()
        response = post(server.url, "paused")
        elapsed = time.monotonic() - started
        assert response.status_code == 200 and response.headers["x-cache"] == "bypass"
        assert elapsed < 2.0  # bounded by the Redis timeout (and one retry), far below the pause
        assert "strata_cache_errors_total" in httpx.get(server.url + "/metrics").text


@pytest.mark.single_node(ONE_REDIS)
def test_redis_out_of_memory_skips_the_store_and_counts_it(own_redis: OwnRedis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    with serve_strata(strata_settings(own_redis.url, fake_upstream.url)) as server:
        post(server.url, "warm up")  # version key and connections exist
        admin = own_redis.client()
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")  # every write is now refused with OOM
        response = post(server.url, "no room")
        assert response.status_code == 200 and response.headers["x-cache"] == "miss"
        assert 'strata_cache_errors_total{layer="exact",operation="store"}' in httpx.get(server.url + "/metrics").text
        admin.config_set("maxmemory", "0")
        assert post(server.url, "no room").headers["x-cache"] == "miss"  # it was not stored
        assert post(server.url, "no room").headers["x-cache"] == "exact-hit"


@pytest.mark.single_node(ONE_REDIS)
def test_acknowledged_entries_survive_kill_9(own_redis: OwnRedis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    questions = [f"durable {i}" for i in range(20)]
    with serve_strata(strata_settings(own_redis.url, fake_upstream.url)) as server:
        for question in questions:
            assert post(server.url, question).status_code == 200
        time.sleep(1.5)  # appendfsync everysec: acknowledged more than a second ago
        own_redis.kill9()
        own_redis.start()
        # The first request after the restart may find only dead pooled connections (a bypass,
        # answered by the upstream); the client reconnects on its own within a few requests.
        deadline = time.monotonic() + 5
        while post(server.url, "reconnect probe").headers["x-cache"] == "bypass":
            assert time.monotonic() < deadline, "the client did not reconnect"
        assert [post(server.url, q).headers["x-cache"] for q in questions] == ["exact-hit"] * len(questions)
    assert [c["messages"][0]["content"] for c in fake_upstream.calls if c["messages"][0]["content"] in questions] == questions


def test_sigterm_lets_the_request_in_flight_finish_and_keeps_its_write(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.delay = 1.5
    port = free_port()
    env = {**os.environ, "STRATA_PORT": str(port), "STRATA_REDIS_URL": redis_url, "STRATA_SEMANTIC_ENABLED": "false",
           "STRATA_UPSTREAM_URL": fake_upstream.url + "/v1", "STRATA_LOG_LEVEL": "warning"}
    url = f"http://127.0.0.1:{port}"

    process = serve_process(env, port)
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", post(url, "in flight")))
    worker.start()
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    worker.join(timeout=20)
    # uvicorn shuts down gracefully, then re-raises the signal it caught: -SIGTERM, not a crash.
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert result["r"].status_code == 200 and result["r"].json()["choices"][0]["message"]["content"].endswith("in flight")
    fake_upstream.delay = 0
    process = serve_process(env, port)
    try:
        assert post(url, "in flight").headers["x-cache"] == "exact-hit"
    finally:
        stop_process(process)


def test_only_requests_that_never_reached_the_model_are_retried(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.status = 500
    settings = strata_settings(redis_url, fake_upstream.url, upstream_max_retries=3)
    with serve_strata(settings) as server:
        assert post(server.url, "server error").status_code == 500
        assert len(fake_upstream.calls) == 1  # a 5xx may have cost a generation: not repeated
    refused = strata_settings(redis_url, f"http://127.0.0.1:{free_port()}", upstream_max_retries=3)
    with serve_strata(refused) as server:
        started = time.monotonic()
        response = post(server.url, "nobody listens")
        assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]
        assert time.monotonic() - started < 2.0  # three jittered retries stay bounded


def test_an_invalidation_while_followers_wait_on_another_worker(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.delay = 0.6
    settings = strata_settings(redis_url, fake_upstream.url)

    async def scenario(one: str, two: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            leader = asyncio.create_task(client.post(one + "/v1/chat/completions", json=body("bumped")))
            await asyncio.sleep(0.2)
            follower = asyncio.create_task(client.post(two + "/v1/chat/completions", json=body("bumped")))
            await asyncio.sleep(0.2)
            for keys in every_keyspace(redis_sync):
                redis_sync.incr(keys.version_key)  # another worker's invalidation, mid-wait
            return [await leader, await follower]

    with serve_strata(settings) as one, serve_strata(settings) as two:
        responses = asyncio.run(scenario(one.url, two.url))
    assert [r.status_code for r in responses] == [200, 200]
