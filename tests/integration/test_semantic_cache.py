"""L2 semantic cache through the HTTP API: real Redis Stack, the real default embedder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support import (
    ADMIN_TOKEN,
    FAQ,
    MODEL,
    FakeUpstream,
    ask,
    eventually,
    indexes,
    keyspace,
    node_of,
    scan,
    serve_strata,
    strata_settings,
)


@pytest.fixture(scope="module")
def semantic_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True,
                               judge_timeout_s=0.5)
    with serve_strata(settings, use_encoder) as server:
        yield server.url


@pytest.fixture
def client(semantic_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> Iterator[httpx.Client]:
    fake_upstream.reset()
    with httpx.Client(base_url=semantic_strata, timeout=10) as http:
        yield http


def content(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def test_a_paraphrase_hits_and_an_unrelated_question_does_not(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    assert ask(client, "怎么申请退款").headers["x-cache"] == "miss"
    hit = ask(client, "退款怎么申请")
    assert hit.headers["x-cache"] == "semantic-hit"
    similarity = hit.headers["x-cache-similarity"]
    assert len(similarity.split(".")[1]) == 3 and 0.80 <= float(similarity) <= 1.0
    assert content(hit) == "answer #6 to: 怎么申请退款"
    assert hit.json()["id"].startswith("chatcmpl-")
    invoice = ask(client, "怎么开发票")
    assert invoice.headers["x-cache"] == "miss" and content(invoice).endswith("怎么开发票")
    assert len(fake_upstream.calls) == 2


def test_policies_are_per_category(client: httpx.Client) -> None:
    # "退款怎么申请" is 0.98 from "怎么申请退款": above faq's accept_above (0.97), so served there;
    # business sends every candidate through the learned verifier (min_probability 0.985).
    business = {"X-Cache-Category": "business"}
    ask(client, "怎么申请退款", headers=business)
    rejected = ask(client, "退款怎么申请", headers=business)
    assert rejected.headers["x-cache"] == "miss"
    ask(client, "怎么申请退款")
    assert ask(client, "退款怎么申请").headers["x-cache"] == "semantic-hit"
    # Another category never serves it: categories are part of the filter.
    assert ask(client, "退款怎么申请", headers={"X-Cache-Category": "general"}).headers["x-cache"] == "miss"
    metrics = client.get("/metrics").text
    assert 'strata_semantic_verifications_total{decision="reject",reason="verifier_rejected"}' in metrics
    assert 'strata_semantic_verifications_total{decision="accept",reason="above_band"}' in metrics


def test_the_llm_judge_confirms_or_vetoes_what_the_verifier_accepted(
    client: httpx.Client, fake_upstream: FakeUpstream
) -> None:
    judged = {"X-Cache-Category": "judged"}
    for reply, system in (("no", "veto"), ("yes", "confirm")):
        fake_upstream.judge_reply = reply
        ask(client, "How do I reset my password?", system=system, headers=judged)
        answer = ask(client, "How can I reset my password?", system=system, headers=judged)
        assert fake_upstream.judge_calls[-1] == ("How do I reset my password?", "How can I reset my password?")
        if reply == "no":
            # A veto is a miss: the model answers the question itself.
            assert answer.headers["x-cache"] == "miss" and "to: How can I reset my password?" in content(answer)
        else:
            assert answer.headers["x-cache"] == "semantic-hit"
            assert answer.headers["x-cache-verdict"] == "judge_accepted"
    # A judge that does not answer in time is a veto too, never an error.
    fake_upstream.judge_delay = 1.0
    ask(client, "How do I reset my password?", system="slow", headers=judged)
    slow = ask(client, "How can I reset my password?", system="slow", headers=judged)
    assert slow.status_code == 200 and slow.headers["x-cache"] == "miss"
    # Other categories never ask the judge.
    calls = len(fake_upstream.judge_calls)
    ask(client, "怎么申请退款")
    assert ask(client, "退款怎么申请").headers["x-cache"] == "semantic-hit" and len(fake_upstream.judge_calls) == calls
    metrics = client.get("/metrics").text
    for decision, reason in (("reject", "judge_rejected"), ("accept", "judge_accepted"), ("reject", "judge_failed")):
        assert f'strata_semantic_verifications_total{{decision="{decision}",reason="{reason}"}} 1.0' in metrics


def test_a_hit_says_why_it_was_accepted(client: httpx.Client) -> None:
    ask(client, "怎么申请退款")
    hit = ask(client, "退款怎么申请")
    assert hit.headers["x-cache-verdict"] == "above_band"


@pytest.mark.parametrize("variant", ["model", "system", "history", "temperature", "max_tokens"])
def test_the_same_question_in_another_scope_never_hits(client: httpx.Client, variant: str) -> None:
    base: dict[str, Any] = {"system": "You are the support bot of Shop A.", "temperature": 0}
    ask(client, "How do I reset my password?", **base)
    assert ask(client, "How can I reset my password?", **base).headers["x-cache"] == "semantic-hit"
    changed = dict(base)
    if variant == "model":
        changed["model"] = "another-model"
    elif variant == "system":
        changed["system"] = "You are the support bot of Shop B."
    elif variant == "history":
        changed["history"] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    elif variant == "temperature":
        changed["temperature"] = 0.7
    else:
        changed["max_tokens"] = 5
    assert ask(client, "How can I reset my password?", **changed).headers["x-cache"] == "miss"


def test_a_follow_up_after_different_earlier_turns_never_hits(client: httpx.Client) -> None:
    obama = [{"role": "user", "content": "Who was Barack Obama?"}, {"role": "assistant", "content": "A US president."}]
    messi = [{"role": "user", "content": "Who is Lionel Messi?"}, {"role": "assistant", "content": "A footballer."}]
    ask(client, "How old is he?", history=obama)
    assert ask(client, "How old is he?", history=obama).headers["x-cache"] == "exact-hit"
    about_obama = ask(client, "how old is he?", history=obama)
    assert about_obama.headers["x-cache"] == "semantic-hit" and "Obama" in content(about_obama)
    about_messi = ask(client, "How old is he?", history=messi)
    assert about_messi.headers["x-cache"] == "miss" and "Messi" in content(about_messi)
    again = ask(client, "how old is he?", history=messi)
    assert again.headers["x-cache"] == "semantic-hit" and "Messi" in content(again) and "Obama" not in content(again)


def test_entries_are_readable_and_counted(client: httpx.Client, redis_sync: redis.Redis) -> None:
    ask(client, "怎么申请退款")
    ask(client, "退款怎么申请")
    [key] = scan(redis_sync, "strata:v1:sem:*")
    entry = redis_sync.hgetall(key)
    assert entry[b"question"].decode() == "怎么申请退款" and entry[b"category"] == b"faq"
    assert entry[b"tenant"] == b"default" and entry[b"model"] == MODEL.encode()
    # Semantic hits are added to the entry in a batch every second (app/cache/storage/usage.py); a count
    # pending for an entry of the same key from an earlier test may land in the same batch.
    hits = eventually(lambda: int(redis_sync.hget(key, "hits") or 0))
    assert hits >= 1
    assert ask(client, "退款怎么申请").headers["x-cache"] == "semantic-hit"
    assert eventually(lambda: int(redis_sync.hget(key, "hits") or 0) > hits)
    assert len(entry[b"scope"]) == 64 and len(entry[b"embedding"]) == 512 * 4
    index = keyspace(redis_sync, "default", "faq").semantic_index_name("v1")
    assert int(node_of(redis_sync, index).ft(index).info()["num_docs"]) == 1
    found = node_of(redis_sync, index).ft(index).search("@category:{faq}")
    assert found.total == 1 and found.docs[0].question == "怎么申请退款"


def test_ttl_is_absolute_from_insertion(client: httpx.Client, redis_sync: redis.Redis) -> None:
    timed = {"X-Cache-Category": "timed"}
    ask(client, "how do I cancel my order", headers=timed)
    [key] = eventually(lambda: [k for k in scan(redis_sync, "strata:v1:sem:*") if redis_sync.hget(k, "category") == b"timed"])
    left = redis_sync.pttl(key)
    assert 0 < left <= 600_000
    assert ask(client, "how can I cancel my order", headers=timed).headers["x-cache"] == "semantic-hit"
    # A hit (and the hit count batched onto the entry after it) never extends the entry's life.
    assert eventually(lambda: int(redis_sync.hget(key, "hits") or 0)) >= 1
    assert 0 < redis_sync.pttl(key) <= left
    # Once the entry expires, its row leaves the index with it: the next paraphrase is a miss, not a
    # hit on a dangling row, and the late hit count creates no key without a TTL.
    redis_sync.pexpire(key, 1)
    assert eventually(lambda: not redis_sync.exists(key))
    assert ask(client, "how can I cancel an order", headers=timed).headers["x-cache"] == "miss"
    assert all(redis_sync.ttl(k) > 0 for k in scan(redis_sync, "strata:v1:sem:*"))


def test_a_version_bump_creates_a_new_index_and_drops_the_old_one(client: httpx.Client, redis_sync: redis.Redis) -> None:
    ask(client, "怎么申请退款")
    keys = keyspace(redis_sync, "default", "faq")
    assert keys.semantic_index_name("v1") in indexes(redis_sync)
    bumped = client.post("/admin/cache/invalidate", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert bumped.json()["version"] == "v2"
    assert ask(client, "退款怎么申请").headers["x-cache"] == "miss"
    deadline = time.monotonic() + 5
    while keys.semantic_index_name("v1") in indexes(redis_sync) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = indexes(redis_sync)
    assert keys.semantic_index_name("v1") not in found and keys.semantic_index_name("v2") in found
    assert list(scan(redis_sync, "strata:v1:*")) == []
    assert ask(client, "怎么申请退款").headers["x-cache"] == "semantic-hit"


def test_concurrent_lookups_are_embedded_in_batches(semantic_strata: str, redis_sync: redis.Redis) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=semantic_strata, timeout=20) as http:
            return await asyncio.gather(*[
                http.post("/v1/chat/completions", headers=FAQ,
                          json={"model": MODEL, "messages": [{"role": "user", "content": f"question number {i}"}]})
                for i in range(24)
            ])

    before = batches(semantic_strata)
    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    used = batches(semantic_strata) - before
    assert 0 < used < 24  # 24 lookups took fewer encoder runs than requests


def batches(url: str) -> int:
    """Encoder runs so far, read from the app's metrics (lookups share batches)."""
    text = httpx.get(url + "/metrics").text
    for line in text.splitlines():
        if line.startswith("strata_embed_batches_total"):
            return int(float(line.split()[-1]))
    raise AssertionError("no strata_embed_batches_total metric")
