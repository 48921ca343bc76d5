"""Property-based API fuzzing with schemathesis against Strata's own OpenAPI document:
no generated request, valid or not, may get a 5xx. Seeded (derandomized), so repeatable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.support import FakeUpstream, serve_strata, strata_settings


@pytest.fixture(scope="module")
def fuzzed_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    fake_upstream.reset()
    app_settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, admin_token=None)
    with serve_strata(app_settings, use_encoder) as server:
        yield server.url


def test_no_request_gets_a_server_error(fuzzed_strata: str) -> None:
    # Through schemathesis' Hypothesis strategies: its pytest plugin does not load on pytest 9.
    loaded = schemathesis.openapi.from_url(fuzzed_strata + "/openapi.json")
    counts: dict[str, int] = {}
    operations = [result.ok() for result in loaded.get_all_operations()]
    # Schema-valid requests, then requests that break the schema on purpose.
    for mode, chat_budget in ((schemathesis.GenerationMode.POSITIVE, 1000), (schemathesis.GenerationMode.NEGATIVE, 500)):
        for operation in operations:
            chat = operation.path == "/v1/chat/completions"
            if mode is schemathesis.GenerationMode.NEGATIVE and not chat:
                continue  # nothing to break in an endpoint without parameters or body
            budget = chat_budget if chat else 50

            @settings(max_examples=budget, derandomize=True, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            # Called at once, inside this iteration: the loop variables it reads are this iteration's.
            def call(case: Any) -> None:
                response = case.call(base_url=fuzzed_strata, timeout=30)
                label = f"{mode.value} {operation.label}"  # noqa: B023
                counts[label] = counts.get(label, 0) + 1
                assert response.status_code < 500, f"{operation.label}: {response.status_code} {response.text[:300]}"  # noqa: B023
                if response.status_code >= 400:
                    assert set(response.json()["error"]) == {"message", "type", "param", "code"}

            call()
    assert counts.get("positive POST /v1/chat/completions", 0) >= 1000, counts
    assert counts.get("negative POST /v1/chat/completions", 0) >= 200, counts
    assert httpx.get(fuzzed_strata + "/health").json()["status"] == "ok"
