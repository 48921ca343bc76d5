"""Tenants and access: API keys, isolation of every layer, rate limits, injection-proof filters."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.auth import add_key, read_keys
from app.cache.storage.contract import CacheQuery
from app.cache.storage.exact import ExactCache
from app.cache.storage.keys import canonicalize
from app.policy import CategoryPolicy
from app.settings import PROJECT_ROOT
from app.wire import ChatCompletionRequest
from tests.support import MODEL, FakeUpstream, ask, first_bucket, scan, serve_strata, strata_settings


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    key_a, _ = add_key(path, "acme")
    key_b, _ = add_key(path, 'evil"} | @tenant:{*')
    return path, key_a, key_b


@pytest.fixture(scope="module")
def keyed_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, keys: tuple[Path, str, str]) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, keys_file=str(keys[0]))
    with serve_strata(settings, use_encoder) as server:
        yield server.url


def test_keys_are_stored_as_salted_hashes(keys: tuple[Path, str, str]) -> None:
    path, key_a, _ = keys
    text = path.read_text()
    # The secret is all after "sk-strata-<id>-" (it may hold dashes itself: token_urlsafe).
    secret = key_a.removeprefix("sk-strata-").split("-", 1)[1]
    assert key_a not in text and secret not in text
    records = read_keys(path).keys
    assert len({r.salt for r in records}) == 2 and all(len(r.sha256) == 64 for r in records)
    assert oct(path.stat().st_mode)[-3:] == "600"


def test_missing_or_unknown_keys_are_401(keyed_strata: str, redis_sync: redis.Redis, keys: tuple[Path, str, str]) -> None:
    _, key_a, _ = keys
    for key in (None, "sk-strata-nope-nope", key_a[:-1] + ("x" if key_a[-1] != "x" else "y"), "Basic abc"):
        response = ask(keyed_strata, "hi", key=key)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(keyed_strata + "/v1/models").status_code == 401


def test_tenants_never_see_each_others_answers(
    keyed_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, keys: tuple[Path, str, str]
) -> None:
    _, key_a, key_b = keys
    fake_upstream.reset()
    assert ask(keyed_strata, "怎么申请退款", key=key_a).headers["x-cache"] == "miss"
    assert ask(keyed_strata, "怎么申请退款", key=key_a).headers["x-cache"] == "exact-hit"
    assert ask(keyed_strata, "退款怎么申请", key=key_a).headers["x-cache"] == "semantic-hit"
    # The other tenant: the identical question (same vector) and the paraphrase both miss.
    assert ask(keyed_strata, "怎么申请退款", key=key_b).headers["x-cache"] == "miss"
    assert ask(keyed_strata, "退款怎么申请", key=key_b).headers["x-cache"] == "semantic-hit"  # its own entry
    assert len(fake_upstream.calls) == 2
    tenants = {redis_sync.hget(k, "tenant") for k in scan(redis_sync, "strata:v1:exact:*")}
    assert tenants == {b"acme", b'evil"} | @tenant:{*'}


def test_a_revoked_key_stops_working_without_a_restart(keyed_strata: str, redis_sync: redis.Redis, keys: tuple[Path, str, str]) -> None:
    path = keys[0]
    key, record = add_key(path, "short-lived")
    time.sleep(1.1)  # the resolver looks at the file at most once a second
    assert ask(keyed_strata, "hello", key=key).status_code == 200
    result = subprocess.run([sys.executable, "-m", "app.cli", "keys", "--file", str(path), "revoke", record.id],
                            cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    time.sleep(1.1)
    assert ask(keyed_strata, "hello", key=key).status_code == 401


def test_the_keys_cli(tmp_path: Path) -> None:
    path = tmp_path / "k.json"

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "app.cli", "keys", "--file", str(path), *a],
                              cwd=PROJECT_ROOT, capture_output=True, text=True)

    added = run("add", "--tenant", "shop-a")
    assert added.returncode == 0 and added.stdout.strip().splitlines()[-1].startswith("sk-strata-")
    listed = run("list")
    assert "shop-a" in listed.stdout and "active" in listed.stdout and "sk-strata-" not in listed.stdout
    assert run("revoke", "nosuchid").returncode == 2


# Text as JSON can carry it: no lone surrogates (a client's JSON with one is refused at decoding).
TENANTS = st.text(alphabet=st.sampled_from(list("|*-{}@ \"'\\,.:;()[]<>~^$%&!?/=+#退款é\u3000"))
                  | st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tenant_a=TENANTS, tenant_b=TENANTS, question=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30))
def test_the_exact_layer_never_crosses_tenants(redis_url: str, redis_sync: redis.Redis, tenant_a: str, tenant_b: str,
                                               question: str) -> None:
    if tenant_a == tenant_b or not question.strip():
        return

    async def scenario() -> tuple[bytes | None, bytes | None]:
        client, keys = await first_bucket(redis_url)
        try:
            exact = ExactCache(client, keys)
            await client.flushall()  # each example starts from an empty cache
            await client.set(keys.version_key, 1)
            raw = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
            request = msgspec.convert(raw, ChatCompletionRequest)
            category = CategoryPolicy(name="faq", ttl_seconds=60)

            def query(tenant: str) -> CacheQuery:
                canonical = canonicalize(request, raw, tenant=tenant, category="faq", max_tokens=64)
                return CacheQuery(canonical=canonical, category=category, version="v1")

            await exact.store(query(tenant_a), b'{"answer": "a"}')
            own, other = await exact.lookup(query(tenant_a)), await exact.lookup(query(tenant_b))
            return (own.completion if own else None), (other.completion if other else None)
        finally:
            await client.aclose()

    own, other = asyncio.run(scenario())
    assert own == b'{"answer": "a"}' and other is None


@pytest.mark.parametrize("special", ['"} | @scope:{*}', "*", "-@tenant:{x}", "a|b", "{", "\\", "@category:{faq}", "' OR 1=1"])
def test_client_text_never_breaks_the_query(keyed_strata: str, redis_sync: redis.Redis, keys: tuple[Path, str, str], special: str) -> None:
    _, key_a, _ = keys
    first = ask(keyed_strata, f"refund {special}", key=key_a, model=f"model {special}")
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    again = ask(keyed_strata, f"refund {special}", key=key_a, model=f"model {special}")
    assert again.headers["x-cache"] == "exact-hit"
    other_model = ask(keyed_strata, f"refund {special}", key=key_a, model=MODEL)
    assert other_model.headers["x-cache"] == "miss"
    bad_category = httpx.post(keyed_strata + "/v1/chat/completions", timeout=10,
                              json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                              headers={"Authorization": f"Bearer {key_a}", "X-Cache-Category": special})
    assert bad_category.status_code == 400
    metrics = httpx.get(keyed_strata + "/metrics").text
    assert 'strata_cache_errors_total{layer="semantic"' not in metrics


def test_rate_limit_per_tenant(redis_url: str, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key_a, _ = add_key(path, "a")
    key_b, _ = add_key(path, "b")
    settings = strata_settings(redis_url, fake_upstream.url, keys_file=str(path), tenant_rps=1, tenant_burst=3)
    with serve_strata(settings) as server:
        statuses = [ask(server.url, "q", key=key_a).status_code for _ in range(5)]
        assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429]
        limited = ask(server.url, "q", key=key_a)
        assert limited.json()["error"]["type"] == "rate_limit_error" and int(limited.headers["retry-after"]) >= 1
        assert ask(server.url, "q", key=key_b).status_code == 200  # another tenant's budget is its own
