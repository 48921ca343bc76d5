"""Targeted invalidation against real Redis Stack, two workers and the fake upstream: by category,
tenant, key, question and curated file; bad input changes nothing; the audit stream is capped."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import add_key
from tests.support import ADMIN_TOKEN, FakeUpstream, ask, every_keyspace, keyspace, run_cli, scan, serve_strata, strata_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Strata-Operator": "tests"}
CATEGORIES = ("business", "general")
QUESTIONS = ("how do i get a refund", "where is my parcel")


@pytest.fixture(scope="module")
def workers(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Two workers on one Redis, and an API key per tenant."""
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    keys = {tenant: add_key(path, tenant)[0] for tenant in ("shop-a", "shop-b")}
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, keys_file=str(path))
    with serve_strata(settings, use_encoder) as one, serve_strata(settings, use_encoder) as two:
        yield one.url, two.url, keys


def ask_all(url: str, keys: dict[str, str]) -> dict[tuple[str, str, str], str]:
    """Every question in every category for every tenant: the X-Cache of each."""
    return {(tenant, category, question): ask(url, question, key=key, headers={"X-Cache-Category": category}).headers["x-cache"]
            for tenant, key in keys.items() for category in CATEGORIES for question in QUESTIONS}


def invalidate(url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + "/admin/cache/invalidate", json=body, headers=ADMIN if headers is None else headers)


def scopes_and_versions(redis_sync: redis.Redis) -> list[Any]:
    """Every keyspace's scope counters and version (one on a single Redis, one per bucket on a cluster)."""
    return [(redis_sync.hgetall(keys.scopes_key), redis_sync.get(keys.version_key)) for keys in every_keyspace(redis_sync)]


def entry_keys(redis_sync: redis.Redis) -> set[bytes]:
    return {k for k in scan(redis_sync, "strata:v*:*") if b":exact:" in k or b":sem:" in k}


@pytest.fixture
def warmed(workers: tuple[str, str, dict[str, str]], redis_sync: redis.Redis,
           fake_upstream: FakeUpstream) -> tuple[str, str, dict[str, str]]:
    fake_upstream.reset()
    one, _, keys = workers
    invalidate(one)  # start from an empty cache
    first = ask_all(one, keys)
    assert set(first.values()) == {"miss"}
    return workers


def test_a_category_of_one_tenant_is_invalidated_and_nothing_else(warmed: tuple[str, str, dict[str, str]],
                                                                  redis_sync: redis.Redis) -> None:
    one, two, keys = warmed
    assert set(ask_all(two, keys).values()) == {"exact-hit"}
    response = invalidate(one, {"category": "business", "tenant": "shop-a"})
    assert response.status_code == 200, response.text
    assert response.json()["generation_field"] == "category:business|tenant:shop-a"
    assert redis_sync.hget(keyspace(redis_sync, "shop-a", "business").scopes_key, "category:business|tenant:shop-a") == b"1"
    # The other worker sees it on its very next request; every other scope still hits.
    after = ask_all(two, keys)
    gone = {k for k, v in after.items() if v == "miss"}
    assert gone == {("shop-a", "business", q) for q in QUESTIONS}
    assert all(v == "exact-hit" for k, v in after.items() if k not in gone)
    # The unreachable entries are swept in the background; the new answers are kept.
    assert ask_all(one, keys) == {k: "exact-hit" for k in after}


def test_a_tenant_and_a_category_across_tenants(warmed: tuple[str, str, dict[str, str]]) -> None:
    one, two, keys = warmed
    assert invalidate(one, {"tenant": "shop-b"}).status_code == 200
    after = ask_all(two, keys)
    assert {k for k, v in after.items() if v == "miss"} == {k for k in after if k[0] == "shop-b"}
    assert invalidate(two, {"category": "general"}).status_code == 200
    after = ask_all(one, keys)
    assert {k for k, v in after.items() if v == "miss"} == {k for k in after if k[1] == "general"}


def test_the_sweep_deletes_what_a_scope_invalidation_made_unreachable(warmed: tuple[str, str, dict[str, str]],
                                                                      redis_sync: redis.Redis) -> None:
    one, _, _ = warmed
    def of_scope() -> set[bytes]:
        return {k for k in entry_keys(redis_sync)
                if redis_sync.hmget(k, ["category", "tenant"]) == [b"business", b"shop-a"]}
    before = of_scope()
    assert len(before) == 2 * len(QUESTIONS)  # exact and semantic
    invalidate(one, {"category": "business", "tenant": "shop-a"})
    deadline = time.monotonic() + 10
    while of_scope() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not of_scope()
    assert len(entry_keys(redis_sync)) == 2 * len(QUESTIONS) * (2 * len(CATEGORIES) - 1)


def test_one_entry_by_key_and_by_question(warmed: tuple[str, str, dict[str, str]], redis_sync: redis.Redis) -> None:
    one, two, keys = warmed
    exact = next(k for k in entry_keys(redis_sync) if b":exact:" in k
                 and redis_sync.hmget(k, ["question", "tenant", "category"]) == [QUESTIONS[0].encode(), b"shop-a", b"general"])
    response = invalidate(one, {"key": exact.decode()})
    assert response.status_code == 200 and response.json()["deleted"] == 1
    assert ask(two, QUESTIONS[0], key=keys["shop-a"], headers={"X-Cache-Category": "general"}).headers["x-cache"] == "semantic-hit"
    # By question: the entry a lookup would serve (here the semantic one, its exact twin is gone).
    body = {"question": QUESTIONS[0] + "?", "model": "fake-model", "category": "general", "tenant": "shop-a"}
    response = invalidate(two, body)
    assert response.status_code == 200, response.text
    assert ":sem:" in response.json()["target"]
    again = ask(one, QUESTIONS[0] + "?", key=keys["shop-a"], headers={"X-Cache-Category": "general"})
    assert again.headers["x-cache"] == "miss"
    # Nothing serves it any more (the answer just stored is under another key): a 404 for a stale key.
    assert invalidate(one, {"key": exact.decode()}).status_code == 404


@pytest.mark.parametrize("body", [
    {"category": "no-such-category"},
    {"key": "strata:v1:exact:not-a-digest"},
    {"key": "some:other:key"},
    {"faq": "../etc"},
    {"question": "", "model": "fake-model"},
    {"question": "refund?"},
    {"model": "fake-model"},
    {"key": "strata:v1:exact:" + "0" * 64, "category": "business"},
    {"colour": "blue"},
])
def test_bad_invalidations_are_4xx_and_change_nothing(warmed: tuple[str, str, dict[str, str]], redis_sync: redis.Redis,
                                                      body: dict[str, Any]) -> None:
    one, _, _ = warmed
    before = (entry_keys(redis_sync), scopes_and_versions(redis_sync))
    response = invalidate(one, body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_invalidation", response.text
    assert (entry_keys(redis_sync), scopes_and_versions(redis_sync)) == before


def test_an_invalidation_needs_the_admin_token(warmed: tuple[str, str, dict[str, str]], redis_sync: redis.Redis) -> None:
    one, _, _ = warmed
    scopes = scopes_and_versions(redis_sync)
    assert invalidate(one, {"category": "business"}, headers={}).status_code == 401
    assert invalidate(one, {"category": "business"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert scopes_and_versions(redis_sync) == scopes


def test_the_audit_stream_records_who_what_when_and_stays_capped(warmed: tuple[str, str, dict[str, str]],
                                                                  redis_sync: redis.Redis) -> None:
    one, _, _ = warmed
    invalidate(one, {"tenant": "shop-a"})
    latest = httpx.get(one + "/admin/cache/audit?count=1", headers=ADMIN).json()["data"][0]
    assert latest["who"].startswith("tests@") and latest["kind"] == "scope" and latest["target"] == "tenant:shop-a"
    assert abs(int(latest["at"]) - time.time()) < 30
    from app.cache.storage import invalidation
    pipe = redis_sync.pipeline()
    for i in range(invalidation.AUDIT_MAX_LEN + 500):
        pipe.xadd("strata:meta:audit", {"who": "load", "kind": "scope", "target": str(i)},
                  maxlen=invalidation.AUDIT_MAX_LEN, approximate=True)
    pipe.execute()
    invalidate(one, {"tenant": "shop-b"})
    assert redis_sync.xlen("strata:meta:audit") <= invalidation.AUDIT_MAX_LEN + 200  # approximate trimming
    assert httpx.get(one + "/admin/cache/audit?count=5000", headers=ADMIN).status_code == 400


def test_a_curated_file_is_invalidated_by_its_name(warmed: tuple[str, str, dict[str, str]], redis_sync: redis.Redis,
                                                   redis_url: str, tmp_path: Path) -> None:
    one, _, keys = warmed
    faq = tmp_path / "returns.yaml"
    faq.write_text("- {category: general, tenant: shop-a, question: how do i send a parcel back, answer: Use the label.}\n")
    loaded = run_cli("faq", "load", str(faq), env={"STRATA_REDIS_URL": redis_url})
    assert loaded.returncode == 0, loaded.stderr
    asked = ask(one, "how do i send a parcel back", key=keys["shop-a"], headers={"X-Cache-Category": "general"})
    assert asked.headers.get("x-cache-source") == "faq"
    response = invalidate(one, {"faq": "returns"})
    assert response.status_code == 200 and response.json()["deleted"] >= 1
    assert not list(scan(redis_sync, "strata:v*:sem:faq-*"))
    assert invalidate(one, {"faq": "returns"}).status_code == 404


def test_the_cli_mirrors_the_endpoint(warmed: tuple[str, str, dict[str, str]], redis_url: str,
                                      redis_sync: redis.Redis) -> None:
    _, two, keys = warmed
    env = {"STRATA_REDIS_URL": redis_url}
    done = run_cli("cache", "invalidate", "--category", "business", "--tenant", "shop-b", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"] == "category:business|tenant:shop-b"
    after = ask_all(two, keys)
    assert {k for k, v in after.items() if v == "miss"} == {("shop-b", "business", q) for q in QUESTIONS}
    scopes = scopes_and_versions(redis_sync)
    bad = run_cli("cache", "invalidate", "--category", "nope", env=env)
    assert bad.returncode == 2 and "unknown category" in bad.stderr
    assert run_cli("cache", "invalidate", env=env).returncode == 2
    assert scopes_and_versions(redis_sync) == scopes
    audit = run_cli("cache", "audit", "--count", "3", env=env)
    assert audit.returncode == 0 and "category:business|tenant:shop-b" in audit.stdout and "(cli)" in audit.stdout


def test_stats_and_inspect_show_entries_hits_and_aliases(warmed: tuple[str, str, dict[str, str]], redis_url: str,
                                                         redis_sync: redis.Redis) -> None:
    one, _, keys = warmed
    for _ in range(3):
        ask(one, QUESTIONS[1], key=keys["shop-b"], headers={"X-Cache-Category": "business"})
    env = {"STRATA_REDIS_URL": redis_url}
    deadline = time.monotonic() + 15  # usage counts reach Redis every few seconds
    while True:
        stats = run_cli("cache", "stats", "--json", env=env)
        assert stats.returncode == 0, stats.stderr
        data = json.loads(stats.stdout)
        requests = sum(row["requests"] for row in data["last_hour"])
        if requests >= len(QUESTIONS) * 4 + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert requests >= len(QUESTIONS) * 4 + 3
    groups = {(row["category"], row["tenant"]): row for row in data["entries"]}
    assert set(groups) == {(c, t) for c in CATEGORIES for t in keys}
    assert all(row["exact"] == row["semantic"] == len(QUESTIONS) and row["memory_bytes"] > 0 for row in groups.values())
    top = data["most_hit"][0]
    assert top["question"] == QUESTIONS[1] and top["hits"] >= 3
    table = run_cli("cache", "stats", env=env)
    assert table.returncode == 0 and "last hour" in table.stdout and "shop-b" in table.stdout
    inspected = run_cli("cache", "inspect", "--question", QUESTIONS[1], "--model", "fake-model",
                        "--category", "business", "--tenant", "shop-b", "--json", env=env)
    assert inspected.returncode == 0, inspected.stderr
    entry = json.loads(inspected.stdout)
    assert entry["question"] == QUESTIONS[1] and entry["ttl_s"] > 0 and int(entry["hits"]) >= 3
    assert entry["answer_text"] and "embedding" not in entry
    semantic_key = next(k.decode() for k in entry_keys(redis_sync) if b":sem:" in k
                        and redis_sync.hmget(k, ["question", "tenant", "category"]) == [QUESTIONS[1].encode(), b"shop-b", b"business"])
    readable = run_cli("cache", "inspect", semantic_key, env=env)
    assert readable.returncode == 0 and "documents of this entry (1)" in readable.stdout, readable.stdout + readable.stderr
    assert run_cli("cache", "inspect", "strata:v1:exact:nope", env=env).returncode == 2
    assert run_cli("cache", "inspect", "strata:v1:exact:" + "0" * 64, env=env).returncode == 1
