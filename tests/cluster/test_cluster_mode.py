"""Strata on a real 3-master Redis Cluster (``STRATA_REDIS_URL=redis+cluster://...``): two
workers, several tenants spread over the buckets, the fake upstream. Exact and semantic hits,
no leak across scopes, single flight across workers, every kind of invalidation, curated files,
the operator's tools, and a scan of the cluster: no key outside its bucket's slot."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from app.auth import add_key
from app.cache.storage.buckets import bucket_of
from app.cache.storage.keys import AUDIT_KEY, BUCKETS_KEY, NAMESPACE, RESPONSE_SECRET_KEY, verdict_key
from tests.support import ADMIN_TOKEN, MODEL, FakeUpstream, ask, run_cli, scan, serve_strata, strata_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Strata-Operator": "tests"}
TENANTS = tuple(f"shop-{i}" for i in range(8))
GENERAL = {"X-Cache-Category": "general"}
# Keys that belong to no bucket: single keys no script spans (app/cache/storage/keys.py).
GLOBAL_PREFIXES = (AUDIT_KEY, BUCKETS_KEY, f"{NAMESPACE}:meta:usage:", f"{NAMESPACE}:meta:layers:",
                   f"{NAMESPACE}:meta:tokens:", verdict_key(""), RESPONSE_SECRET_KEY)


@pytest.fixture(scope="module")
def cluster_url(cluster_ports: list[int]) -> Iterator[str]:
    client = RedisCluster(host="127.0.0.1", port=cluster_ports[0])
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    client.close()
    yield "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in cluster_ports[:2])


@pytest.fixture(scope="module")
def cluster(cluster_url: str, cluster_ports: list[int]) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster_ports[0])
    yield client
    client.close()


@pytest.fixture(scope="module")
def workers(cluster_url: str, upstream: FakeUpstream, use_encoder: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Two Strata workers on the cluster, and an API key per tenant."""
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    keys = {tenant: add_key(path, tenant)[0] for tenant in TENANTS}
    settings = strata_settings(cluster_url, upstream.url, semantic_enabled=True, keys_file=str(path))
    with serve_strata(settings, use_encoder) as one, serve_strata(settings, use_encoder) as two:
        yield one.url, two.url, keys


def invalidate(url: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(url + "/admin/cache/invalidate", json=body, headers=ADMIN, timeout=30)


def strata_keys(cluster: RedisCluster) -> list[str]:
    return [k.decode() for k in cluster.scan_iter(match=f"{NAMESPACE}:*", target_nodes=RedisCluster.PRIMARIES)]


def bucket_tags(cluster: RedisCluster) -> list[str]:
    return cluster.get(BUCKETS_KEY).decode().split(",")


@pytest.fixture
def warmed(workers: tuple[str, str, dict[str, str]], upstream: FakeUpstream) -> tuple[str, str, dict[str, str]]:
    """An empty cache, then one question per tenant asked on the first worker (all misses)."""
    one, _, keys = workers
    assert invalidate(one).status_code == 200
    upstream.reset()
    for tenant, key in keys.items():
        assert ask(one, "how do i get a refund", key=key, headers=GENERAL).headers["x-cache"] == "miss", tenant
    return workers


def test_buckets_are_spread_over_every_master(workers: tuple[str, str, dict[str, str]], cluster: RedisCluster) -> None:
    tags = bucket_tags(cluster)
    assert len(tags) == 9 and len(set(tags)) == 9  # 3 x masters
    owners = Counter(cluster.get_node_from_key(f"{{{tag}}}").port for tag in tags)
    assert sorted(owners.values()) == [3, 3, 3]
    health = httpx.get(workers[0] + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["redis"]["buckets"] == 9 and health["redis"]["masters"] == 3


def test_exact_and_semantic_hits_in_every_tenants_bucket_and_no_leak(
        warmed: tuple[str, str, dict[str, str]], upstream: FakeUpstream, cluster: RedisCluster) -> None:
    one, two, keys = warmed
    tags = bucket_tags(cluster)
    used = {tags[bucket_of(tenant, "general", len(tags))] for tenant in TENANTS}
    masters = {cluster.get_node_from_key(f"{{{tag}}}").port for tag in used}
    assert len(used) >= 3 and len(masters) >= 2  # the tenants really are spread
    for tenant, key in keys.items():
        exact = ask(two, "how do i get a refund", key=key, headers=GENERAL)
        assert exact.headers["x-cache"] == "exact-hit", tenant
        assert exact.json()["choices"][0]["message"]["content"].endswith("how do i get a refund")
    assert len(upstream.calls) == len(TENANTS)  # one per tenant: no tenant was served another's
    first = keys[TENANTS[0]]
    assert ask(one, "怎么申请退款", key=first).headers["x-cache"] == "miss"
    # The worker writes its answer back after the response: ask the other worker once it is stored
    # (on a loaded machine the paraphrase could otherwise arrive first and be a miss).
    assert stored_semantically(cluster, "怎么申请退款")
    paraphrase = ask(two, "退款怎么申请", key=first)
    assert paraphrase.headers["x-cache"] == "semantic-hit"
    assert paraphrase.json()["choices"][0]["message"]["content"].endswith("怎么申请退款")
    assert ask(two, "退款怎么申请", key=keys[TENANTS[1]]).headers["x-cache"] == "miss"  # another tenant's scope
    assert ask(one, "怎么开发票", key=first).headers["x-cache"] == "miss"


def stored_semantically(cluster: RedisCluster, question: str, timeout: float = 15.0) -> bool:
    """Wait until a semantic entry of ``question`` exists in some bucket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key in scan(cluster, "strata:v*:sem:*"):  # whichever version the module's tests left
            if cluster.hget(key, "question") == question.encode():
                return True
        time.sleep(0.05)
    return False


def test_fifty_identical_misses_on_two_workers_make_one_upstream_call(
        workers: tuple[str, str, dict[str, str]], upstream: FakeUpstream) -> None:
    one, two, keys = workers
    upstream.reset()
    upstream.delay = 0.5
    body = {"model": MODEL, "messages": [{"role": "user", "content": "stampede on a cluster"}]}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(
                client.post((one, two)[i % 2] + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {keys[TENANTS[2]]}"}) for i in range(50)))

    try:
        responses = asyncio.run(burst())
    finally:
        upstream.delay = 0.0
    assert all(r.status_code == 200 for r in responses)
    assert len(upstream.calls) == 1
    assert sum(r.headers.get("x-cache-coalesced") == "true" for r in responses) == 49


def test_a_version_bump_empties_every_bucket(warmed: tuple[str, str, dict[str, str]], cluster: RedisCluster) -> None:
    one, two, keys = warmed
    done = invalidate(one)
    assert done.status_code == 200
    assert all(ask(two, "how do i get a refund", key=key, headers=GENERAL).headers["x-cache"] == "miss"
               for key in keys.values())
    versions = {cluster.get(f"{NAMESPACE}:{{{tag}}}:meta:version") for tag in bucket_tags(cluster)}
    assert versions == {done.json()["version"][1:].encode()}  # every bucket's copy moved


def test_scope_key_and_question_invalidations_hit_only_their_target(
        warmed: tuple[str, str, dict[str, str]], cluster: RedisCluster) -> None:
    one, two, keys = warmed
    first, second, third = TENANTS[:3]
    assert invalidate(one, {"tenant": first}).status_code == 200
    asked = {t: ask(two, "how do i get a refund", key=keys[t], headers=GENERAL).headers["x-cache"] for t in TENANTS}
    assert asked == {t: "miss" if t == first else "exact-hit" for t in TENANTS}
    hit = ask(two, "how do i get a refund", key=keys[second], headers=GENERAL)
    key = next(k for k in strata_keys(cluster) if ":exact:" in k
               and cluster.hget(k, "tenant") == second.encode() and cluster.hget(k, "category") == b"general")
    assert hit.headers["x-cache"] == "exact-hit"
    by_key = invalidate(one, {"key": key})
    assert by_key.status_code == 200 and by_key.json()["deleted"] == 1 and not cluster.exists(key)
    # The exact entry is gone; the question's semantic entry (another key) still serves it.
    assert ask(one, "how do i get a refund", key=keys[second], headers=GENERAL).headers["x-cache"] == "semantic-hit"
    by_question = invalidate(one, {"question": "how do i get a refund", "model": MODEL, "category": "general",
                                   "tenant": third})
    assert by_question.status_code == 200, by_question.text
    assert not cluster.exists(by_question.json()["target"])
    assert ask(one, "how do i get a refund", key=keys[third], headers=GENERAL).headers["x-cache"] != "exact-hit"
    assert ask(one, "how do i get a refund", key=keys[TENANTS[3]], headers=GENERAL).headers["x-cache"] == "exact-hit"
    assert invalidate(one, {"key": "strata:{zz}:v1:exact:" + "0" * 64}).status_code in (400, 404)
    assert cluster.xlen(AUDIT_KEY) >= 3


def test_curated_answers_load_into_their_tenants_buckets_and_go_by_name(
        warmed: tuple[str, str, dict[str, str]], cluster_url: str, tmp_path: Path) -> None:
    one, _, keys = warmed
    faq = tmp_path / "returns.yaml"
    faq.write_text("".join(f"- {{category: general, tenant: {t}, question: how do i send a parcel back, "
                           f"answer: Use the label of {t}.}}\n" for t in TENANTS[:4]))
    env = {"STRATA_REDIS_URL": cluster_url}
    loaded = run_cli("faq", "load", str(faq), env=env)
    assert loaded.returncode == 0, loaded.stderr
    for tenant in TENANTS[:4]:
        asked = ask(one, "how do i send a parcel back", key=keys[tenant], headers=GENERAL)
        assert asked.headers.get("x-cache-source") == "faq", tenant
        assert asked.json()["choices"][0]["message"]["content"] == f"Use the label of {tenant}."
    stats = run_cli("cache", "stats", "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    curated = {row["tenant"]: row["curated"] for row in json.loads(stats.stdout)["entries"]}
    assert all(curated.get(t) == 1 for t in TENANTS[:4])
    gone = invalidate(one, {"faq": "returns"})
    assert gone.status_code == 200 and gone.json()["deleted"] == 4
    assert not [k for k in strata_keys(_cluster_of(cluster_url)) if ":sem:faq-" in k]
    assert invalidate(one, {"faq": "returns"}).status_code == 404


def _cluster_of(url: str) -> RedisCluster:
    host, port = url.removeprefix("redis+cluster://").split(",")[0].split(":")
    return RedisCluster(host=host, port=int(port))


def test_the_cli_invalidates_and_inspects_on_the_cluster(warmed: tuple[str, str, dict[str, str]],
                                                         cluster_url: str, cluster: RedisCluster) -> None:
    one, _, keys = warmed
    env = {"STRATA_REDIS_URL": cluster_url}
    key = next(k for k in strata_keys(cluster) if ":exact:" in k)
    inspected = run_cli("cache", "inspect", key, "--json", env=env)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["key"] == key
    done = run_cli("cache", "invalidate", "--category", "general", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"] == "category:general"
    assert all(ask(one, "how do i get a refund", key=k, headers=GENERAL).headers["x-cache"] == "miss"
               for k in keys.values())


def test_no_key_lands_outside_its_buckets_slot(warmed: tuple[str, str, dict[str, str]], cluster: RedisCluster,
                                               cluster_ports: list[int]) -> None:
    one, _, keys = warmed
    for key in keys.values():  # semantic entries, aliases, observations as well as exact ones
        ask(one, "怎么申请退款", key=key)
        ask(one, "退款怎么申请", key=key)
    tags = set(bucket_tags(cluster))
    found = strata_keys(cluster)
    assert any(":sem:" in k for k in found) and any(":lease:" not in k and ":exact:" in k for k in found)
    for key in found:
        if key.startswith(f"{NAMESPACE}:{{"):
            tag = key[len(NAMESPACE) + 2:key.index("}")]
            assert tag in tags, key
            assert cluster.keyslot(key) == cluster.keyslot(f"{{{tag}}}"), key
        else:
            assert key.startswith(GLOBAL_PREFIXES), f"{key} is in no bucket"
    for port in cluster_ports:
        node = redis.Redis(host="127.0.0.1", port=port, protocol=2)
        try:
            for raw in node.execute_command("FT._LIST"):
                name = raw.decode()
                tag = name[len(NAMESPACE) + 2:name.index("}")]
                assert tag in tags and cluster.get_node_from_key(f"{{{tag}}}").port == port, name
        finally:
            node.close()


def test_a_slow_first_slot_map_read_at_start_up_is_tried_again(cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.exceptions import TimeoutError as RedisTimeout

    from app.cache.storage.buckets import open_buckets
    from app.settings import RedisSettings

    real = AsyncCluster.initialize
    tries: list[int] = []

    async def slow_once(self: AsyncCluster) -> AsyncCluster:
        tries.append(1)
        if len(tries) == 1:
            raise RedisTimeout("Timeout reading from socket")
        return await real(self)

    monkeypatch.setattr(AsyncCluster, "initialize", slow_once)

    async def opened() -> int:
        buckets = await open_buckets(RedisSettings(url=cluster_url))
        await buckets.aclose()
        return len(buckets.all)

    assert asyncio.run(opened()) == 9
    assert len(tries) == 2
