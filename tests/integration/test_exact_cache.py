"""L1 exact cache through the real HTTP API, real Redis Stack and a fake upstream."""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec
import openai
import pytest
import redis

from app.cache.storage.contract import CacheQuery
from app.cache.storage.exact import ExactCache, exact_key
from app.cache.storage.keys import canonicalize
from app.cache.storage.version import StaleScope, StaleVersion
from app.policy import CategoryPolicy
from app.wire import ChatCompletionRequest
from tests.support import (
    ADMIN_TOKEN,
    MODEL,
    FakeUpstream,
    chat,
    eventually,
    every_keyspace,
    first_bucket,
    keyspace,
    scan,
    serve_strata,
    strata_settings,
)


def test_miss_then_exact_hit_calls_upstream_once(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    first = client.post("/v1/chat/completions", json=chat())
    second = client.post("/v1/chat/completions", json=chat())
    assert first.status_code == second.status_code == 200
    assert first.headers["x-cache"] == "miss"
    assert second.headers["x-cache"] == "exact-hit"
    assert len(fake_upstream.calls) == 1
    a, b = first.json(), second.json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["id"] != b["id"] and b["id"].startswith("chatcmpl-")
    assert b["object"] == "chat.completion" and b["created"] >= a["created"]


def test_json_key_order_and_whitespace_do_not_change_the_key(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    one = b'{"model": "fake-model", "temperature": 0, "messages": [{"role": "user", "content": "Refund?"}]}'
    two = b'{"messages": [{"content": "  Refund?\\n", "role": "user"}], "temperature": 0.0, "model": "fake-model"}'
    # Full-width question mark: NFKC folds it to "?".
    three = '{"messages": [{"content": "Refund\uff1f", "role": "user"}], "model": "fake-model", "temperature": 0}'
    headers = {"content-type": "application/json"}
    assert client.post("/v1/chat/completions", content=one, headers=headers).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", content=two, headers=headers).headers["x-cache"] == "exact-hit"
    assert client.post("/v1/chat/completions", content=three.encode(), headers=headers).headers["x-cache"] == "exact-hit"
    assert len(fake_upstream.calls) == 1


def test_output_parameters_are_part_of_the_key_and_user_is_not(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    assert client.post("/v1/chat/completions", json=chat(temperature=0)).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat(temperature=0.5)).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat(temperature=0, seed=7)).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat(temperature=0, top_k=3)).headers["x-cache"] == "miss"
    hit = client.post("/v1/chat/completions", json=chat(temperature=0, user="someone", request_id="r1"))
    assert hit.headers["x-cache"] == "exact-hit"
    assert len(fake_upstream.calls) == 4


def test_unknown_fields_pass_through_and_max_tokens_is_capped(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    client.post("/v1/chat/completions", json=chat("a", top_k=5, repetition_penalty=1.1, max_tokens=100000))
    client.post("/v1/chat/completions", json=chat("b"))
    client.post("/v1/chat/completions", json=chat("c", max_completion_tokens=10))
    sent = fake_upstream.calls
    assert sent[0]["top_k"] == 5 and sent[0]["repetition_penalty"] == 1.1
    assert sent[0]["max_tokens"] == 128  # the cap
    assert sent[1]["max_tokens"] == 64  # the default
    assert sent[2]["max_tokens"] == 10 and "max_completion_tokens" not in sent[2]


def test_no_cache_skips_lookup_and_stores_only_for_an_operator_and_no_store_does_neither(
    client: httpx.Client, fake_upstream: FakeUpstream
) -> None:
    assert client.post("/v1/chat/completions", json=chat("q1"), headers={"Cache-Control": "no-store"}).headers["x-cache"] == "bypass"
    assert client.post("/v1/chat/completions", json=chat("q1")).headers["x-cache"] == "miss"  # nothing was stored
    # A client's no-cache skips the lookup and leaves the shared entry alone (nothing stored).
    assert client.post("/v1/chat/completions", json=chat("q2"), headers={"Cache-Control": "no-cache"}).headers["x-cache"] == "bypass"
    assert client.post("/v1/chat/completions", json=chat("q2")).headers["x-cache"] == "miss"
    # An operator's no-cache (the admin token) rewrites it.
    operator = {"Cache-Control": "no-cache", "X-Strata-Admin-Token": ADMIN_TOKEN}
    assert client.post("/v1/chat/completions", json=chat("q3"), headers=operator).headers["x-cache"] == "bypass"
    assert client.post("/v1/chat/completions", json=chat("q3")).headers["x-cache"] == "exact-hit"
    assert client.post("/v1/chat/completions", json=chat("q3"), headers={"Cache-Control": "no-cache"}).headers["x-cache"] == "bypass"
    assert len(fake_upstream.calls) == 6


def test_entries_expire_with_their_category_ttl(
    client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis
) -> None:
    short = {"X-Cache-Category": "short"}
    client.post("/v1/chat/completions", json=chat("ttl"), headers=short)
    keys = eventually(lambda: list(scan(redis_sync, "strata:v1:exact:*")))
    assert len(keys) == 1 and 0 < redis_sync.pttl(keys[0]) <= 1000
    # Waited for the entry's expiry, not slept on: on a busy machine a second ask may come after it.
    assert eventually(lambda: not redis_sync.exists(keys[0]))
    assert client.post("/v1/chat/completions", json=chat("ttl"), headers=short).headers["x-cache"] == "miss"
    timed = {"X-Cache-Category": "timed"}
    client.post("/v1/chat/completions", json=chat("ttl"), headers=timed)
    assert client.post("/v1/chat/completions", json=chat("ttl"), headers=timed).headers["x-cache"] == "exact-hit"
    # Another category is another entry: an answer never outlives the TTL of the category it serves.
    assert client.post("/v1/chat/completions", json=chat("ttl"), headers={"X-Cache-Category": "general"}).headers["x-cache"] == "miss"
    # The default category keeps it far longer.
    client.post("/v1/chat/completions", json=chat("long"))
    long_key = next(k for k in scan(redis_sync, "strata:v1:exact:*") if redis_sync.hget(k, "category") == b"business")
    assert 890 < redis_sync.ttl(long_key) <= 900


def test_unknown_category_is_rejected(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    response = client.post("/v1/chat/completions", json=chat(), headers={"X-Cache-Category": "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Cache-Category"
    assert fake_upstream.calls == []


def test_upstream_errors_are_not_cached(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    fake_upstream.status = 500
    failed = client.post("/v1/chat/completions", json=chat("err"))
    # The model server's own error, as it sent it (status, type, message).
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "InternalServerError"
    fake_upstream.status = 400
    rejected = client.post("/v1/chat/completions", json=chat("err"))
    assert rejected.status_code == 400 and "fake upstream failure" in rejected.json()["error"]["message"]
    fake_upstream.status = 200
    assert client.post("/v1/chat/completions", json=chat("err")).headers["x-cache"] == "miss"


def test_upstream_timeout_is_504(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    fake_upstream.delay = 1.5  # Strata's upstream timeout in these tests is 1 s
    response = client.post("/v1/chat/completions", json=chat("slow"))
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "upstream_timeout"


def test_truncated_answers_are_not_cached(client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis) -> None:
    fake_upstream.finish_reason = "length"
    assert client.post("/v1/chat/completions", json=chat("long")).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat("long")).headers["x-cache"] == "miss"
    assert list(scan(redis_sync, "strata:v1:exact:*")) == []


def test_invalidation_bumps_the_version_and_sweeps_old_entries(
    client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis
) -> None:
    client.post("/v1/chat/completions", json=chat("inv"))
    assert client.post("/v1/chat/completions", json=chat("inv")).headers["x-cache"] == "exact-hit"
    assert client.post("/admin/cache/invalidate").status_code == 401
    assert client.post("/admin/cache/invalidate", headers={"Authorization": "Bearer wrong"}).status_code == 401
    bumped = client.post("/admin/cache/invalidate", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert bumped.status_code == 200 and bumped.json() == {"previous_version": "v1", "version": "v2"}
    assert redis_sync.get(keyspace(redis_sync).version_key) == b"2"
    assert client.post("/v1/chat/completions", json=chat("inv")).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat("inv")).headers["x-cache"] == "exact-hit"
    deadline = time.monotonic() + 5
    while list(scan(redis_sync, "strata:v1:*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(scan(redis_sync, "strata:v1:*")) == []
    assert len(list(scan(redis_sync, "strata:v2:exact:*"))) == 1


def test_a_bump_by_another_process_takes_effect_at_once(
    client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis
) -> None:
    client.post("/v1/chat/completions", json=chat("other"))
    for keys in every_keyspace(redis_sync):
        redis_sync.incr(keys.version_key)  # as another worker's /admin/cache/invalidate would
    assert client.post("/v1/chat/completions", json=chat("other")).headers["x-cache"] == "miss"
    assert len(fake_upstream.calls) == 2


def test_entries_are_readable_hashes(client: httpx.Client, redis_sync: redis.Redis) -> None:
    client.post("/v1/chat/completions", json=chat("怎么退货"), headers={"X-Cache-Category": "faq"})
    client.post("/v1/chat/completions", json=chat("怎么退货"), headers={"X-Cache-Category": "faq"})
    [key] = scan(redis_sync, "strata:v1:exact:*")
    assert len(key.decode().rsplit(":", 1)[1]) == 64
    entry = {k.decode(): v.decode() for k, v in redis_sync.hgetall(key).items()}
    assert entry["question"] == "怎么退货" and entry["category"] == "faq" and entry["model"] == MODEL
    assert entry["hits"] == "1" and entry["tenant"] == "default"
    assert '"content":"answer' in entry["answer"]
    assert int(entry["expires_at"]) - int(entry["created_at"]) == 21600


@pytest.mark.parametrize("stream_options", [None, {"include_usage": True}])
def test_streaming_miss_and_replayed_hit_through_the_openai_sdk(
    strata: str, client: httpx.Client, fake_upstream: FakeUpstream, stream_options: dict[str, bool] | None
) -> None:
    sdk = openai.OpenAI(base_url=strata + "/v1", api_key="unused", max_retries=0)
    texts, caches, usages = [], [], []
    for _ in range(2):
        extra = {"stream_options": stream_options} if stream_options else {}
        with sdk.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "stream me"}], stream=True, **extra
        ) as response:
            caches.append(response.headers["x-cache"])
            text, usage = "", None
            for chunk in response.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                usage = chunk.usage or usage
            texts.append(text)
            usages.append(usage)
    assert caches == ["miss", "exact-hit"]
    assert texts[0] == texts[1] == "answer #9 to: stream me"
    assert len(fake_upstream.calls) == 1
    if stream_options:
        assert usages[0] is not None and usages[1] is not None and usages[1].total_tokens == 12


def test_a_stream_that_breaks_is_not_stored(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    fake_upstream.fail_mid_stream = True
    with client.stream("POST", "/v1/chat/completions", json=chat("broken", stream=True)) as response:
        body = b"".join(response.iter_bytes())
    assert b"[DONE]" not in body and b'"error"' in body
    fake_upstream.fail_mid_stream = False
    assert client.post("/v1/chat/completions", json=chat("broken")).headers["x-cache"] == "miss"


def test_non_streaming_hit_for_a_streamed_miss(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    with client.stream("POST", "/v1/chat/completions", json=chat("both", stream=True)) as response:
        assert b"[DONE]" in b"".join(response.iter_bytes())
    hit = client.post("/v1/chat/completions", json=chat("both"))
    assert hit.headers["x-cache"] == "exact-hit"
    assert hit.json()["choices"][0]["message"]["content"] == "answer #4 to: both"


def test_models_pass_through_and_health(client: httpx.Client) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "fake-model"
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["redis"]["status"] == "ok" and health["upstream"]["status"] == "ok"


def test_metrics_count_requests_per_outcome(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json=chat("m"))
    client.post("/v1/chat/completions", json=chat("m"))
    text = client.get("/metrics").text
    assert 'strata_requests_total{outcome="exact-hit"}' in text
    assert 'strata_cache_lookups_total{layer="exact",result="hit"}' in text
    assert "strata_request_duration_seconds_bucket" in text
    assert 'strata_upstream_tokens_total{kind="completion"}' in text


def test_a_corrupt_entry_is_a_counted_miss_and_gets_overwritten(
    client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis
) -> None:
    client.post("/v1/chat/completions", json=chat("corrupt"))
    [key] = scan(redis_sync, "strata:v1:exact:*")
    redis_sync.hset(key, "answer", "not json at all")  # an operator's hand edit
    response = client.post("/v1/chat/completions", json=chat("corrupt"))
    assert response.status_code == 200 and response.headers["x-cache"] == "miss"
    assert 'strata_cache_errors_total{layer="exact",operation="lookup"}' in client.get("/metrics").text
    assert client.post("/v1/chat/completions", json=chat("corrupt")).headers["x-cache"] == "exact-hit"


def test_a_malformed_upstream_chunk_ends_the_stream_with_an_error_event(
    client: httpx.Client, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.malformed_chunk = True
    with client.stream("POST", "/v1/chat/completions", json=chat("malformed", stream=True)) as response:
        text = b"".join(response.iter_bytes()).decode()
    assert response.status_code == 200 and '"type":"upstream_error"' in text and "[DONE]" not in text
    fake_upstream.malformed_chunk = False
    assert client.post("/v1/chat/completions", json=chat("malformed")).headers["x-cache"] == "miss"  # nothing stored


def test_answers_cut_by_the_clients_own_limit_are_exact_hits_but_never_semantic(
        client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis) -> None:
    fake_upstream.finish_reason = "length"
    assert client.post("/v1/chat/completions", json=chat("long story", max_tokens=5)).headers["x-cache"] == "miss"
    assert client.post("/v1/chat/completions", json=chat("long story", max_tokens=5)).headers["x-cache"] == "exact-hit"
    assert client.post("/v1/chat/completions", json=chat("long story", max_tokens=6)).headers["x-cache"] == "miss"
    assert list(scan(redis_sync, "strata:v1:sem:*")) == []
    assert len(fake_upstream.calls) == 2


def test_learned_max_tokens_replace_the_default_once_answers_are_known(
        redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()  # the fake answers with completion_tokens 5
    settings = strata_settings(redis_url, fake_upstream.url, learned_cap_min_answers=3)
    with serve_strata(settings) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        for i in range(4):
            http.post("/v1/chat/completions", json=chat(f"question {i}"))
        sent = [c["max_tokens"] for c in fake_upstream.calls]
        named = http.post("/v1/chat/completions", json=chat("named", max_tokens=40))
        metrics = http.get("/metrics").text
    assert sent == [64, 64, 64, 16]  # the default (64 here) until 3 answers, then 2 x p95 (8), at least 16
    assert named.status_code == 200 and fake_upstream.calls[-1]["max_tokens"] == 40  # a client's own limit stands
    assert 'strata_learned_max_tokens{category="business"} 16.0' in metrics
    stats = scan(redis_sync, "strata:meta:tokens:business:*")
    assert len(stats) == 1 and redis_sync.hget(stats[0], "n") == b"5" and redis_sync.ttl(stats[0]) > 0


def test_an_answer_is_stored_only_under_the_version_and_generation_it_was_asked_under(
        redis_url: str, redis_sync: redis.Redis) -> None:
    """The write-back checks both in the script that writes (app/cache/storage/entry.py): an answer the
    model generated while the cache was invalidated is never stored, under any version."""
    raw = {"model": MODEL, "messages": [{"role": "user", "content": "asked before the bump"}]}
    canonical = canonicalize(msgspec.convert(raw, ChatCompletionRequest), raw, tenant="t", category="faq", max_tokens=None)
    category = CategoryPolicy(name="faq", ttl_seconds=60)

    async def scenario() -> None:
        client, keys = await first_bucket(redis_url)
        exact = ExactCache(client, keys)
        try:
            await client.set(keys.version_key, 2)  # bumped while the model was answering under v1
            old = CacheQuery(canonical=canonical, category=category, version="v1")
            with pytest.raises(StaleVersion):
                await exact.store(old, b'{"stale": true}')
            assert not await client.exists(exact_key(old, keys))
            current = CacheQuery(canonical=canonical, category=category, version="v2")
            await exact.store(current, b'{"fresh": true}')
            assert await client.hget(exact_key(current, keys), "answer") == b'{"fresh": true}'
            assert 0 < await client.ttl(exact_key(current, keys)) <= 60
            await client.hincrby(keys.scopes_key, "category:faq", 1)  # a targeted invalidation
            with pytest.raises(StaleScope):
                await exact.store(current, b'{"stale": true}')
            assert await client.hget(exact_key(current, keys), "answer") == b'{"fresh": true}'
        finally:
            await client.aclose()

    asyncio.run(scenario())
