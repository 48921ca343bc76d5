"""L3 prompt hygiene through the API: counted per tenant in warn mode, refused with its span in reject mode."""

from __future__ import annotations

import httpx
import redis

from tests.support import FakeUpstream, ask, serve_strata, strata_settings

STAMPED = "You are Example Shop's assistant. Current time: 2026-12-01T09:30:15Z."
STABLE = "You are Example Shop's assistant. Answer politely."


def test_warn_counts_dynamic_system_prompts_and_answers(redis_url: str, redis_sync: redis.Redis,
                                                        fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    with serve_strata(strata_settings(redis_url, fake_upstream.url)) as server:
        assert ask(server.url, "hello", system=STAMPED).status_code == 200
        assert ask(server.url, "hello", system=STABLE).status_code == 200
        metrics = httpx.get(server.url + "/metrics").text
    assert 'strata_prompt_dynamic_total{kind="timestamp",tenant="default"} 1.0' in metrics
    assert 'kind="date"' not in metrics  # the timestamp's date is part of the timestamp span


def test_reject_answers_400_with_the_span_and_calls_nobody(redis_url: str, redis_sync: redis.Redis,
                                                          fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    with serve_strata(strata_settings(redis_url, fake_upstream.url, prompt_hygiene="reject")) as server:
        refused = ask(server.url, "hello", system=STAMPED)
        accepted = ask(server.url, "hello", system=STABLE)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["code"] == "dynamic_system_prompt" and error["param"] == "messages"
    assert "2026-12-01T09:30:15Z" in error["message"] and "timestamp" in error["message"]
    assert accepted.status_code == 200 and len(fake_upstream.calls) == 1


def test_the_upstream_prefix_cache_ratio_is_on_metrics_and_health(redis_url: str, fake_upstream: FakeUpstream) -> None:
    with serve_strata(strata_settings(redis_url, fake_upstream.url)) as server:
        metrics = httpx.get(server.url + "/metrics").text
        health = httpx.get(server.url + "/health").json()
    assert 'strata_upstream_prefix_cache{value="hit_ratio"} 0.75' in metrics
    assert 'strata_upstream_prefix_cache{value="queried_tokens"} 400.0' in metrics
    cache = health["upstream"]["prefix_cache"]
    assert cache["hit_ratio"] == 0.75 and cache["metrics"] == ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"]
