"""Strata in front of a real vLLM (CPU build, SmolLM2-135M-Instruct here), through the openai SDK."""

from __future__ import annotations

import openai
import pytest
import redis

from tests.support import scan

pytestmark = pytest.mark.e2e
# The shipped default category, business, keeps each user's answers to that user: requests name one.
E2E_USER = {"X-Cache-User": "e2e-user"}


def test_miss_returns_the_model_answer_and_the_repeat_is_an_exact_hit(
    strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis
) -> None:
    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    first = sdk.chat.completions.with_raw_response.create(model=model, messages=question, temperature=0)
    second = sdk.chat.completions.with_raw_response.create(model=model, messages=question, temperature=0)
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "exact-hit"
    one, two = first.parse(), second.parse()
    assert one.choices[0].message.content and one.choices[0].message.content == two.choices[0].message.content
    assert one.usage is not None and one.usage.completion_tokens > 0
    assert one.id != two.id
    # Only complete answers are cached, so the model must have stopped on its own.
    assert one.choices[0].finish_reason == "stop"
    assert len(scan(redis_sync, "strata:v1:exact:*")) == 1


def test_streaming_through_the_sdk_miss_then_hit(strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis) -> None:
    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    texts, caches = [], []
    for _ in range(2):
        with sdk.chat.completions.with_streaming_response.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], temperature=0, stream=True, max_tokens=100
        ) as response:
            caches.append(response.headers["x-cache"])
            texts.append("".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices))
    # SmolLM2 at temperature 0 answers this in about 30 tokens and stops, so the answer is cached.
    assert caches == ["miss", "exact-hit"]
    assert texts[0] and texts[0] == texts[1]


def test_the_sdks_stream_helper_accepts_a_hit_as_it_accepts_the_model(
    strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis
) -> None:
    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    finals = []
    for _ in range(2):  # a miss relayed from vLLM, then a hit replayed by Strata
        with sdk.chat.completions.stream(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                         temperature=0, max_tokens=100, stream_options={"include_usage": True}) as stream:
            for _event in stream:
                pass
            finals.append(stream.get_final_completion())
    miss, hit = finals
    assert miss.choices[0].message.content and hit.choices[0].message.content == miss.choices[0].message.content
    assert hit.choices[0].finish_reason == miss.choices[0].finish_reason == "stop"
    assert hit.usage == miss.usage and miss.usage is not None  # the original counts, as the model reported them
    assert len(scan(redis_sync, "strata:v1:exact:*")) == 1


def test_answers_cut_by_the_clients_limit_are_exact_hits_and_cut_defaults_are_not_cached(
        strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis) -> None:
    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    question = [{"role": "user", "content": "Write a long story about a dragon."}]
    named, unnamed = [], []
    for _ in range(2):
        # The client's own limit is in the key: the cut answer is what this request gets (L1 only).
        response = sdk.chat.completions.with_raw_response.create(model=model, messages=question, temperature=0, max_tokens=8)
        assert response.parse().choices[0].finish_reason == "length"
        named.append((response.headers["x-cache"], response.parse().choices[0].message.content))
        # No limit named: Strata picked one (48 here), so a cut answer is not stored.
        response = sdk.chat.completions.with_raw_response.create(model=model, messages=question, temperature=0)
        assert response.parse().choices[0].finish_reason == "length"
        unnamed.append(response.headers["x-cache"])
    assert [c for c, _ in named] == ["miss", "exact-hit"] and named[0][1] == named[1][1]
    assert unnamed == ["miss", "miss"]


def test_models_list_passes_through(strata_e2e: str, vllm: tuple[str, str]) -> None:
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    assert vllm[1] in [m.id for m in sdk.models.list()]


def test_a_stable_system_prompt_is_served_from_vllms_prefix_cache(strata_e2e: str, vllm: tuple[str, str]) -> None:
    """L3: the launcher's block size lets the CPU build share full 32-token blocks of a prompt."""
    import httpx

    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    system = " ".join(f"Rule {i}: answer politely and briefly." for i in range(40))  # well over 32 tokens
    before = httpx.get(strata_e2e + "/health").json()["upstream"]["prefix_cache"]
    for question in ("What is two plus two?", "What colour is the sky?"):
        sdk.chat.completions.create(model=model, max_tokens=4, temperature=0, extra_headers={"Cache-Control": "no-store"},
                                    messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    after = httpx.get(strata_e2e + "/health").json()["upstream"]["prefix_cache"]
    assert after["metrics"] == ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"]
    assert after["hit_tokens"] - before["hit_tokens"] >= 32 * 5  # the second request reused the prompt's blocks


def test_legacy_completions_embeddings_and_pass_through_with_the_real_model(
        strata_e2e: str, vllm: tuple[str, str]) -> None:
    _, model = vllm
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    prompts = []
    for _ in range(2):
        response = sdk.completions.with_raw_response.create(model=model, prompt="The capital of France is",
                                                            temperature=0, max_tokens=8)
        prompts.append((response.headers["x-cache"], response.parse().choices[0].text))
    assert [c for c, _ in prompts] == ["miss", "exact-hit"] and prompts[0][1] and prompts[0][1] == prompts[1][1]
    # vLLM serving a generation model has neither GET /v1/models/{id} nor embeddings: its 404s come
    # back with their status, in OpenAI's shape ({"detail": "Not Found"} rewritten), never as a 5xx.
    with pytest.raises(openai.NotFoundError) as retrieved:
        sdk.models.retrieve(model)
    assert isinstance(retrieved.value.body, dict) and retrieved.value.body.get("message") == "Not Found"
    with pytest.raises(openai.NotFoundError) as embedded:
        sdk.embeddings.create(model=model, input="hello")
    assert isinstance(embedded.value.body, dict) and embedded.value.body.get("message")
