"""The grey zone's reader (issue #33) against real Redis Stack, the real embedder and the fake
upstream as the judge's OpenAI-compatible endpoint: read after the response until its yes is
measured, then asked on the request path; the entry record trusted only where it was measured."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.integration.test_learning import REFUND, forget_question, pool_counts, pool_key
from tests.support import FakeUpstream, ask, eventually, keyspace, serve_strata, strata_settings

READ = {"X-Cache-Category": "learn_read"}


@pytest.fixture(scope="module")
def reading_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0,
                               judge_url=fake_upstream.url + "/v1", judge_timeout_s=10.0)
    with serve_strata(settings, use_encoder) as server:
        yield server.url


@pytest.fixture
def strata(reading_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return reading_strata


def category_key(redis_sync: redis.Redis, category: str) -> str:
    """The key of a category's figures over every tenant (what /health reads)."""
    return keyspace(redis_sync, "default", category).observations_key("v1", category)


def reader_fields(redis_sync: redis.Redis, category: str) -> dict[str, int]:
    return {k: v for k, v in pool_counts(redis_sync, category).items() if k.startswith("reader_")}


def test_an_untrusted_reader_reads_after_the_response_and_is_measured_against_the_answer(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.answers.update({q: REFUND for q in ("怎么申请退款", "退款怎么申请")})
    ask(strata, "怎么申请退款", headers=READ)
    # No evidence for the pool, none for the reader: the model answers; the reader reads after.
    assert ask(strata, "退款怎么申请", headers=READ).headers["x-cache"] == "miss"
    fields = eventually(lambda: reader_fields(redis_sync, "learn_read"))
    [(field, count)] = fields.items()
    assert field.startswith("reader_ok:") and count == 1  # it said yes, and the answers agreed
    assert fake_upstream.judge_calls == [("怎么申请退款", "退款怎么申请")]
    # Its no on a pair whose answers agree is reach it would have lost (reader_no_ok).
    fake_upstream.judge_reply = "no"
    fake_upstream.answers["如何申请退款"] = REFUND
    assert ask(strata, "如何申请退款", headers=READ).headers["x-cache"] == "miss"
    assert eventually(lambda: sum(count for field, count in reader_fields(redis_sync, "learn_read").items()
                                  if field.startswith("reader_no_ok:"))) == 1
    metrics = httpx.get(strata + "/metrics").text
    assert 'verdict="yes",when="after"}' in metrics and 'verdict="no",when="after"}' in metrics
    assert "strata_judge_pending 0.0" in metrics


def test_a_reader_measured_right_serves_on_its_yes_and_its_no_is_a_miss(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.answers.update({q: REFUND for q in ("怎么申请退款", "退款怎么申请", "如何申请退款")})
    ask(strata, "怎么申请退款", headers=READ)
    # Its yes measured right 1,000 times at every score: trusted everywhere in the band (the
    # tenant's pool decides; the category's figures, on /health, count every tenant's).
    trusted = {f"reader_ok:{b:03d}": 1000 for b in range(50, 160)}
    redis_sync.hset(pool_key(redis_sync, "learn_read"), mapping=trusted)
    redis_sync.hset(category_key(redis_sync, "learn_read"), mapping=trusted)
    served = ask(strata, "退款怎么申请", headers=READ)
    assert served.headers["x-cache"] == "semantic-hit" and served.headers["x-cache-verdict"] == "reader_accepted"
    assert len(fake_upstream.calls) - len(fake_upstream.judge_calls) == 1  # one answer from the model
    reader = httpx.get(strata + "/health").json()["semantic"]["learn_read"]["reader"]
    assert reader["status"] == "trusted" and reader["trusted_from"] == 0.5 and reader["mode"] == "serve"
    assert reader["name"].startswith("llm:")
    fake_upstream.judge_reply = "no"
    refused = ask(strata, "如何申请退款", headers=READ)
    assert refused.headers["x-cache"] == "miss"
    assert len(fake_upstream.judge_calls) == 2
    # One wrong yes among few: no longer trusted there, read after the response again.
    for key in (pool_key(redis_sync, "learn_read"), category_key(redis_sync, "learn_read")):
        redis_sync.delete(key)
        redis_sync.hset(key, mapping={"reader_ok:050": 10, "reader_wrong:050": 1})
    assert httpx.get(strata + "/health").json()["semantic"]["learn_read"]["reader"]["status"] == "measuring"
    fake_upstream.judge_reply = "yes"
    forget_question(redis_sync, "退款怎么申请")
    assert ask(strata, "退款怎么申请", headers=READ).headers["x-cache"] == "miss"
    metrics = httpx.get(strata + "/metrics").text
    assert 'strata_semantic_verifications_total{decision="accept",reason="reader_accepted"}' in metrics
    assert 'strata_semantic_verifications_total{decision="reject",reason="reader_rejected"}' in metrics

