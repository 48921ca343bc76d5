"""The rest of the OpenAI surface through the official SDK, against Strata and the fake upstream:
legacy completions through the cache layers, embeddings exact-cached, other /v1/ paths passed
through; /docs and the OpenAPI document cover them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.support import FakeUpstream, scan, serve_strata, strata_settings


@pytest.fixture(scope="module")
def surface(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    with serve_strata(strata_settings(redis_url, fake_upstream.url, semantic_enabled=True), use_encoder) as server:
        yield server.url


@pytest.fixture
def sdk(surface: str, fake_upstream: FakeUpstream) -> openai.OpenAI:
    fake_upstream.reset()
    return openai.OpenAI(base_url=surface + "/v1", api_key="unused", max_retries=0)


def cached(response: Any) -> str:
    return response.headers.get("x-cache", "")


def test_legacy_completions_are_cached_exactly_and_semantically(sdk: openai.OpenAI, fake_upstream: FakeUpstream) -> None:
    headers = {"X-Cache-Category": "general"}
    first = sdk.completions.with_raw_response.create(model="fake-model", prompt="How do I reset my password?",
                                                     extra_headers=headers)
    assert cached(first) == "miss"
    completion = first.parse()
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text == " completes: How do I reset my password?"
    again = sdk.completions.with_raw_response.create(model="fake-model", prompt="How do I reset my password?",
                                                     extra_headers=headers)
    assert cached(again) == "exact-hit" and again.parse().choices[0].text == completion.choices[0].text
    similar = sdk.completions.with_raw_response.create(model="fake-model", prompt="How can I reset my password?",
                                                       extra_headers=headers)
    assert cached(similar) == "semantic-hit"
    assert len(fake_upstream.completion_calls) == 1 and not fake_upstream.calls  # legacy endpoint, once
    assert "strata_legacy_completion" not in fake_upstream.completion_calls[0]


def test_a_chat_question_never_gets_a_legacy_answer(sdk: openai.OpenAI, fake_upstream: FakeUpstream) -> None:
    sdk.completions.create(model="fake-model", prompt="What are your opening hours?")
    chat = sdk.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "What are your opening hours?"}])
    assert cached(chat) == "miss" and len(fake_upstream.calls) == 1


def test_legacy_streams_and_several_choices_are_passed_through(sdk: openai.OpenAI, fake_upstream: FakeUpstream) -> None:
    text = "".join(c.choices[0].text for c in sdk.completions.create(model="fake-model", prompt="Stream it", stream=True))
    assert text == " completes: Stream it"
    response = sdk.completions.with_raw_response.create(model="fake-model", prompt="Echo it", echo=True)
    assert cached(response) == "bypass"
    sdk.completions.create(model="fake-model", prompt="Echo it", echo=True)
    assert len(fake_upstream.completion_calls) == 3  # never cached


def test_embeddings_are_exact_cached_per_input_model_and_options(sdk: openai.OpenAI, fake_upstream: FakeUpstream,
                                                                 redis_sync: redis.Redis) -> None:
    first = sdk.embeddings.with_raw_response.create(model="fake-embed", input=["refund", "invoice"])
    assert cached(first) == "miss"
    vectors = [d.embedding for d in first.parse().data]
    again = sdk.embeddings.with_raw_response.create(model="fake-embed", input=["refund", "invoice"])
    assert cached(again) == "exact-hit" and [d.embedding for d in again.parse().data] == vectors
    other = sdk.embeddings.with_raw_response.create(model="fake-embed", input=["invoice", "refund"])
    assert cached(other) == "miss"  # order matters: another request
    assert cached(sdk.embeddings.with_raw_response.create(model="fake-embed", input=["refund", "invoice"],
                                                          dimensions=2)) == "miss"
    assert len(fake_upstream.embedding_calls) == 3
    # The SDK asks for base64 and gets it; a client naming no format gets floats, as OpenAI sends.
    assert fake_upstream.embedding_calls[0]["encoding_format"] == "base64"
    plain = httpx.post(str(sdk.base_url) + "embeddings", json={"model": "fake-embed", "input": "refund"})
    assert plain.status_code == 200 and plain.headers["x-cache"] == "miss"
    assert fake_upstream.embedding_calls[-1]["encoding_format"] == "float"
    keys = list(scan(redis_sync, "strata:v*:emb:*"))
    assert len(keys) == 4 and all(0 < redis_sync.ttl(k) <= 86_400 for k in keys)


def test_other_paths_pass_through_untouched(sdk: openai.OpenAI, fake_upstream: FakeUpstream) -> None:
    model = sdk.models.retrieve("fake-model")
    assert model.id == "fake-model"
    moderation = sdk.moderations.create(input="is this fine?")
    assert moderation.results[0].flagged is False
    assert [c[:2] for c in fake_upstream.other_calls] == [("GET", "/v1/models/fake-model"), ("POST", "/v1/moderations")]
    assert b"is this fine?" in fake_upstream.other_calls[1][2]
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")  # the upstream's own 404, passed on


def test_bad_input_gets_an_openai_error(surface: str) -> None:
    for path, body in (("/v1/completions", {"model": "fake-model"}), ("/v1/completions", {"model": "m", "prompt": ""}),
                       ("/v1/embeddings", {"model": "fake-embed"}), ("/v1/embeddings", {"model": "m", "input": 3}),
                       ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "strata_legacy_completion": True})):
        response = httpx.post(surface + path, json=body)
        assert response.status_code == 400, (path, body, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(surface + "/v1/embeddings", content=b"{not json").status_code == 400


def test_docs_page_and_openapi_cover_the_surface(surface: str) -> None:
    page = httpx.get(surface + "/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "/v1/embeddings" in page.text
    paths = httpx.get(surface + "/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/{path}",
                 "/admin/cache/invalidate", "/admin/cache/audit"):
        assert path in paths, path
