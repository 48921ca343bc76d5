"""A cluster's life under a running Strata. A master killed: its replica is promoted, the buckets
it held follow their slots to the new master, and their entries are served again; meanwhile
requests are answered (misses or bypasses, never errors and never another scope's answer). A
cluster that comes up only after Strata started: bypasses until it answers, then the cache."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from app.auth import add_key
from app.cache.storage.buckets import bucket_of
from app.cache.storage.keys import BUCKETS_KEY
from tests.cluster.conftest import LocalCluster, local_cluster
from tests.support import FakeUpstream, ask, free_port, serve_strata, strata_settings

TENANTS = tuple(f"shop-{i}" for i in range(8))
GENERAL = {"X-Cache-Category": "general"}


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    with local_cluster(replicas=True) as cluster:
        yield cluster


def content(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def test_a_killed_masters_buckets_are_served_from_its_promoted_replica(
        replicated: LocalCluster, upstream: FakeUpstream, use_encoder: Any, tmp_path: Any) -> None:
    url = f"redis+cluster://127.0.0.1:{replicated.ports[0]}"
    path = tmp_path / "keys.json"
    keys = {tenant: add_key(path, tenant)[0] for tenant in TENANTS}
    settings = strata_settings(url, upstream.url, semantic_enabled=True, keys_file=str(path),
                               redis_cluster_refresh_s=0.5)
    cluster = RedisCluster(host="127.0.0.1", port=replicated.ports[0])
    with serve_strata(settings, use_encoder) as strata:
        answers = {t: content(ask(strata.url, "怎么申请退款", key=keys[t], headers=GENERAL)) for t in TENANTS}
        assert all(ask(strata.url, "怎么申请退款", key=keys[t], headers=GENERAL).headers["x-cache"] == "exact-hit"
                   for t in TENANTS)
        tags = cluster.get(BUCKETS_KEY).decode().split(",")
        # The master of the first tenant's bucket: make sure its replica has every write, then kill it.
        victim_tag = tags[bucket_of(TENANTS[0], "general", len(tags))]
        victim = cluster.get_node_from_key(f"{{{victim_tag}}}").port
        on_victim = [t for t in TENANTS
                     if cluster.get_node_from_key(f"{{{tags[bucket_of(t, 'general', len(tags))]}}}").port == victim]
        master = redis.Redis(host="127.0.0.1", port=victim)
        assert master.execute_command("WAIT", 1, 5000) == 1
        master.close()
        os.kill(replicated.pid(victim), signal.SIGKILL)
        # Until the replica is promoted and followed, /health names the buckets that do not answer.
        down = httpx.get(strata.url + "/health", timeout=10).json()
        assert down["status"] == "degraded" and all(f":{victim}" in b for b in down["redis"]["buckets_down"])

        outcomes: list[str] = []
        deadline = time.monotonic() + 45
        while True:
            response = ask(strata.url, "怎么申请退款", key=keys[TENANTS[0]], headers=GENERAL)
            assert response.status_code == 200
            assert content(response) == answers[TENANTS[0]]  # a miss is answered afresh: same fake answer text
            outcomes.append(response.headers["x-cache"])
            if outcomes[-1] == "exact-hit" and len(outcomes) > 1:
                break
            assert time.monotonic() < deadline, f"no hit from the promoted replica: {outcomes[-5:]}"
            time.sleep(0.3)
        assert set(outcomes[:-1]) <= {"exact-hit", "miss", "bypass"}
        for tenant in on_victim:
            assert ask(strata.url, "怎么申请退款", key=keys[tenant], headers=GENERAL).headers["x-cache"] == "exact-hit"
            paraphrase = ask(strata.url, "退款怎么申请", key=keys[tenant], headers=GENERAL)
            assert paraphrase.headers["x-cache"] == "semantic-hit", tenant  # its index came along
            assert content(paraphrase) == answers[tenant]
        health = httpx.get(strata.url + "/health", timeout=10).json()
        assert health["status"] == "ok" and health["redis"]["masters"] == 3, health
    promoted = RedisCluster(host="127.0.0.1", port=replicated.replica_ports[0])
    owner = promoted.get_node_from_key(f"{{{victim_tag}}}").port
    assert owner in replicated.replica_ports
    promoted.close()
    cluster.close()


def test_a_cluster_that_comes_up_after_strata_is_used_once_it_answers(
        upstream: FakeUpstream, use_encoder: Any) -> None:
    ports = [free_port() for _ in range(3)]
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports)
    settings = strata_settings(url, upstream.url, semantic_enabled=True, redis_cluster_refresh_s=0.5)
    with serve_strata(settings, use_encoder) as strata:
        before = ask(strata.url, "怎么申请退款", headers=GENERAL)
        assert before.status_code == 200 and before.headers["x-cache"] == "bypass"
        assert httpx.get(strata.url + "/health", timeout=10).json()["redis"]["status"] == "down"
        assert httpx.post(strata.url + "/admin/cache/invalidate", json={}, timeout=10,
                          headers={"Authorization": "Bearer test-admin-token"}).status_code == 503
        with local_cluster(ports=ports):
            deadline = time.monotonic() + 30
            while ask(strata.url, "怎么申请退款", headers=GENERAL).headers["x-cache"] != "exact-hit":
                assert time.monotonic() < deadline, "the cache never came on"
                time.sleep(0.3)
            assert ask(strata.url, "退款怎么申请", headers=GENERAL).headers["x-cache"] == "semantic-hit"
            health = httpx.get(strata.url + "/health", timeout=10).json()
            assert health["status"] == "ok" and health["redis"]["buckets"] == 9
