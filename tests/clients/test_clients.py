"""Client conformance: each client library's calls made twice against Strata over HTTP (a miss,
then a hit), the client-visible results of the hit compared with the miss's field by field, and
where it tells more, with what the model server gives the same client directly (ids and creation
times aside). The scenarios run in the interpreter that has the library (tests/clients/scenarios)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import FakeUpstream

SCENARIOS = Path(__file__).parent / "scenarios"
# Cases whose answer is not cached, by design: several choices (n > 1), errors, pass-through.
UNCACHED = {"n_2": ["bypass", "bypass"]}


def run(python: Path, scenario: str, strata: str, direct: str) -> dict[str, Any]:
    done = subprocess.run([str(python), str(SCENARIOS / scenario), strata, direct], cwd=SCENARIOS,
                          capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "NO_PROXY": "*",
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr[-4000:]}"
    cases = json.loads(done.stdout.strip().splitlines()[-1])["cases"]
    if os.environ.get("STRATA_CLIENT_CASES"):  # a folder to read what each scenario saw
        Path(os.environ["STRATA_CLIENT_CASES"], f"{python.parent.parent.name}-{scenario}.json").write_text(
            json.dumps(cases, indent=1))
    return cases


def mismatches(cases: dict[str, Any]) -> list[str]:
    """Every way a hit was not what the client would have got, one line each."""
    found = []
    for name, case in cases.items():
        if "error" in case:
            found.append(f"{name}: {case['error']}")
            continue
        if "value" in case:
            continue
        if "miss" in case and case["hit"] != case["miss"]:
            found.append(f"{name}: hit != miss\n  miss {case['miss']}\n  hit  {case['hit']}")
        reference = case.get("miss", case["hit"])
        if "direct" in case and reference != case["direct"] and not name.startswith("error_"):
            found.append(f"{name}: through Strata != direct\n  strata {reference}\n  direct {case['direct']}")
        if name.startswith("error_"):
            if case["hit"] != case["direct"]:
                found.append(f"{name}: error through Strata != direct\n  strata {case['hit']}\n  direct {case['direct']}")
            continue
        expected = UNCACHED.get(name, ["miss", "exact-hit"])
        headers = case.get("headers") or []
        if name == "stream_then_create":
            expected = ["miss", "exact-hit"]
        if any(h is not None for h in headers) and headers != expected:
            found.append(f"{name}: X-Cache {headers}, expected {expected}")
    return found


@pytest.mark.parametrize("interpreter", ["this_python", "clients_python"])
def test_the_openai_sdk_gets_from_a_hit_what_it_got_from_the_model(
    interpreter: str, request: pytest.FixtureRequest, client_strata: str, vllm_fake: FakeUpstream,
    redis_sync: redis.Redis,
) -> None:
    python = request.getfixturevalue(interpreter)
    vllm_fake.reset()
    vllm_fake.tool_calls = True
    cases = run(python, "openai_sdk.py", client_strata, vllm_fake.url)
    problems = mismatches(cases)
    assert not problems, "\n".join(problems)
    concurrent = cases["async_20_concurrent"]["value"]
    assert len(concurrent["contents"]) == 1 and concurrent["caches"].count("miss") == 1
    asked = [c for c in vllm_fake.calls if c["messages"][-1].get("content") == "Twenty at once?"]
    assert len(asked) == 1  # 20 concurrent identical calls, one upstream call


def exact_hits(strata: str) -> float:
    import re

    import httpx

    text = httpx.get(strata + "/metrics").text
    found = re.search(r'^strata_requests_total\{outcome="exact-hit"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize(("scenario", "hits"), [
    ("langchain.py", 11), ("litellm_client.py", 3), ("llamaindex.py", 3), ("instructor_client.py", 2),
])
def test_client_libraries_get_from_a_hit_what_they_got_from_the_model(
    scenario: str, hits: int, clients_python: Path, client_strata: str, vllm_fake: FakeUpstream,
    redis_sync: redis.Redis,
) -> None:
    vllm_fake.reset()
    vllm_fake.tool_calls = True
    before = exact_hits(client_strata)
    cases = run(clients_python, scenario, client_strata, vllm_fake.url)
    problems = mismatches(cases)
    assert not problems, "\n".join(problems)
    # Each case's second call was answered by the cache (the libraries hide response headers).
    assert exact_hits(client_strata) - before >= hits


@pytest.mark.parametrize("interpreter", ["this_python", "clients_python"])
def test_the_openai_sdks_responses_api_gets_from_a_hit_what_it_got_from_the_model(
    interpreter: str, request: pytest.FixtureRequest, client_strata: str, vllm_fake: FakeUpstream,
    redis_sync: redis.Redis,
) -> None:
    python = request.getfixturevalue(interpreter)
    vllm_fake.reset()
    cases = run(python, "openai_responses.py", client_strata, vllm_fake.url)
    problems = mismatches(cases)
    assert not problems, "\n".join(problems)
    streamed = cases["responses_stream_helper"]["hit"]
    assert streamed["events"][0] == "response.created" and streamed["events"][-1] == "response.completed"
    assert streamed["output_text"] and streamed["usage"]["input_tokens"] > 0
    assert cases["responses_parse"]["hit"]["parsed"]["city"]
    call = cases["responses_named_tool"]["hit"]["output"][0]
    assert call["type"] == "function_call" and call["name"] == "track" and "parcel" in call["arguments"]
    missing = cases["value_error_missing-model"]["value"]
    assert missing["class"] == "NotFoundError" and missing["status"] == 404
    assert cases["value_error_limited-model"]["value"]["class"] == "RateLimitError"
    asked = [c for c in vllm_fake.calls if c["messages"][-1].get("role") == "tool"]
    assert asked and asked[0]["messages"][1]["tool_calls"][0]["id"] == "call_7"


def test_the_anthropic_sdk_gets_from_a_hit_what_it_got_from_the_model(
    clients_python: Path, client_strata: str, vllm_fake: FakeUpstream, redis_sync: redis.Redis,
) -> None:
    vllm_fake.reset()
    cases = run(clients_python, "anthropic_client.py", client_strata, vllm_fake.url)
    problems = mismatches(cases)
    assert not problems, "\n".join(problems)
    streamed = cases["messages_stream_helper"]["hit"]
    assert streamed["events"] == ["message_start", "content_block_start", "content_block_delta", "text",
                                  "content_block_stop", "message_delta", "message_stop"]
    assert streamed["stop_reason"] == "end_turn" and streamed["usage"]["output_tokens"] > 0
    tool = cases["messages_named_tool"]["hit"]["content"][0]
    assert tool["type"] == "tool_use" and tool["name"] == "track" and "parcel" in tool["input"]
    assert cases["messages_named_tool"]["hit"]["stop_reason"] == "tool_use"
    missing = cases["value_error_missing-model"]["value"]
    assert missing["class"] == "NotFoundError" and missing["body"]["type"] == "error"
    assert missing["body"]["error"]["type"] == "not_found_error"
    assert cases["value_error_limited-model"]["value"]["class"] == "RateLimitError"
    assert not vllm_fake.other_calls  # nothing passed through: served by the chat layers
