"""The Responses API and Anthropic's Messages API through Strata in front of a real vLLM (issue #25):
what the model gives through Strata's translation is what vLLM's own endpoint gives (temperature 0),
the repeat is a hit, streamed through the SDK's helper; every call carries the tenant's salt, which
this vLLM accepts."""

from __future__ import annotations

import httpx
import openai
import pytest
import redis

pytestmark = pytest.mark.e2e
E2E_USER = {"X-Cache-User": "e2e-user"}  # business, the default category, is per user
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


def test_a_response_through_strata_is_vllms_own_and_its_repeat_a_streamed_hit(
    strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis
) -> None:
    url, model = vllm
    question = "What is the capital of Italy?"
    direct = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    own = direct.responses.create(model=model, instructions=INSTRUCTIONS, input=question, temperature=0,
                                  max_output_tokens=40, store=False)
    sdk = openai.OpenAI(base_url=strata_e2e + "/v1", api_key="unused", max_retries=0, default_headers=E2E_USER)
    miss = sdk.responses.with_raw_response.create(model=model, instructions=INSTRUCTIONS, input=question, temperature=0,
                                                  max_output_tokens=40)
    assert miss.headers["x-cache"] == "miss"
    assert miss.parse().output_text == own.output_text and own.output_text
    with sdk.responses.stream(model=model, instructions=INSTRUCTIONS, input=question, temperature=0,
                              max_output_tokens=40) as stream:
        for _event in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == own.output_text
    assert final.usage is not None and own.usage is not None
    assert final.usage.output_tokens == own.usage.output_tokens


def test_a_message_through_strata_is_vllms_own_and_its_repeat_a_hit(
    strata_e2e: str, vllm: tuple[str, str], redis_sync: redis.Redis
) -> None:
    url, model = vllm
    body = {"model": model, "max_tokens": 40, "temperature": 0,
            "system": [{"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "What is the capital of Spain?"}]}
    own = httpx.post(url + "/v1/messages", json=body, timeout=120)
    assert own.status_code == 200, own.text
    through = [httpx.post(strata_e2e + "/v1/messages", json=body, headers=E2E_USER, timeout=120) for _ in range(2)]
    assert [r.headers["x-cache"] for r in through] == ["miss", "exact-hit"], through[0].text
    texts = [r.json()["content"][0]["text"] for r in (own, *through)]
    assert texts[0] and texts[0] == texts[1] == texts[2]
    assert through[0].json()["stop_reason"] == own.json()["stop_reason"]
    streamed = httpx.post(strata_e2e + "/v1/messages", json={**body, "stream": True}, headers=E2E_USER, timeout=120)
    assert streamed.headers["x-cache"] == "exact-hit"
    assert "event: message_stop" in streamed.text
