"""The Responses API and Anthropic's Messages API through the chat layers (issue #25): a miss then
a hit in each protocol, streamed and not, one cache entry shared by the protocols that ask the
same question, none shared where they differ, stored conversations passed through, errors in the
asker's shape, and the prefix-cache salt per tenant; against real Redis Stack and the fake upstream
(the SDKs' own helpers are tried in tests/clients, the real model in tests/e2e)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from app.auth import add_key
from app.hygiene import prefix_salt
from tests.support import MODEL, FakeUpstream, ask, serve_strata, strata_settings

SYSTEM = "You are the support bot of a shop. Answer in one sentence."


class Keys:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.acme, _ = add_key(path, "acme")
        self.globex, _ = add_key(path, "globex")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("protocols") / "keys.json")


@pytest.fixture(scope="module")
def protocols_strata(redis_url: str, fake_upstream: FakeUpstream, keys: Keys) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, keys_file=str(keys.path))
    with serve_strata(settings) as server:
        yield server.url


@pytest.fixture
def strata(protocols_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return protocols_strata


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def respond(strata: str, key: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(strata + "/v1/responses", json={"model": MODEL, **body}, headers={**bearer(key), **(headers or {})},
                      timeout=10)


def message(strata: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(strata + "/v1/messages", json={"model": MODEL, "max_tokens": 64, **body},
                      headers={"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout=10)


def events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of an SSE body."""
    found = []
    for block in response.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        found.append((lines["event"], json.loads(lines["data"])))
    return found


def test_a_response_is_a_miss_then_an_exact_hit_with_the_same_output(strata: str, keys: Keys,
                                                                       fake_upstream: FakeUpstream) -> None:
    body = {"instructions": SYSTEM, "input": "How do I return a parcel?", "max_output_tokens": 40}
    miss, hit = respond(strata, keys.acme, body), respond(strata, keys.acme, body)
    assert (miss.status_code, hit.status_code) == (200, 200), miss.text
    assert [miss.headers["x-cache"], hit.headers["x-cache"]] == ["miss", "exact-hit"]
    first, second = miss.json(), hit.json()
    assert first["object"] == "response" and first["status"] == "completed"
    assert first["output"][0]["content"][0]["text"] == second["output"][0]["content"][0]["text"]
    assert "How do I return a parcel?" in first["output"][0]["content"][0]["text"]
    assert first["usage"] == second["usage"] and first["usage"]["input_tokens"] == 7
    assert second["id"].startswith("resp_") and hit.headers["x-cache-response-id"] == second["id"]
    assert first["instructions"] == SYSTEM and first["max_output_tokens"] == 40
    asked = fake_upstream.calls[-1]
    assert len(fake_upstream.calls) == 1
    assert asked["messages"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I return a parcel?"}]
    assert asked["max_tokens"] == 40


def test_the_openai_sdk_streams_a_response_and_its_hit_alike(strata: str, keys: Keys) -> None:
    client = openai.OpenAI(base_url=strata + "/v1", api_key=keys.acme, max_retries=0)

    def streamed() -> tuple[str, list[str], dict[str, Any]]:
        with client.responses.stream(model=MODEL, instructions=SYSTEM, input="Where is my order?") as stream:
            kinds = []
            for event in stream:  # a hit replays its text in one delta, the model wrote it in several
                if not kinds or kinds[-1] != event.type:
                    kinds.append(event.type)
            final = stream.get_final_response()
        return final.output_text, kinds, final.usage.model_dump() if final.usage else {}

    miss, hit = streamed(), streamed()
    assert miss == hit and "Where is my order?" in miss[0]
    assert miss[1][:4] == ["response.created", "response.in_progress", "response.output_item.added",
                           "response.content_part.added"]
    assert miss[1][-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                            "response.completed"]
    created = client.responses.with_raw_response.create(model=MODEL, instructions=SYSTEM, input="Where is my order?")
    assert created.headers["x-cache"] == "exact-hit" and created.parse().output_text == miss[0]


def test_one_question_asked_in_three_protocols_is_one_entry(strata: str, keys: Keys, fake_upstream: FakeUpstream) -> None:
    question = "Can I change my delivery address?"
    chat = httpx.post(strata + "/v1/chat/completions", headers=bearer(keys.acme), timeout=10, json={
        "model": MODEL, "max_tokens": 64,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]})
    assert chat.headers["x-cache"] == "miss"
    text = chat.json()["choices"][0]["message"]["content"]
    response = respond(strata, keys.acme, {"instructions": SYSTEM, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": question}]}], "max_output_tokens": 64})
    assert response.headers["x-cache"] == "exact-hit"
    assert response.json()["output"][0]["content"][0]["text"] == text
    # Anthropic's system blocks with a cache_control marker: the same prompt, the same key.
    anthropic = message(strata, keys.acme, {"system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                                            "messages": [{"role": "user", "content": question}]})
    assert anthropic.status_code == 200, anthropic.text
    assert anthropic.headers["x-cache"] == "exact-hit"
    assert anthropic.json()["content"] == [{"type": "text", "text": text}]
    assert anthropic.json()["stop_reason"] == "end_turn" and anthropic.json()["id"].startswith("msg_")
    assert len(fake_upstream.calls) == 1


def test_what_differs_never_mixes(strata: str, keys: Keys, fake_upstream: FakeUpstream) -> None:
    question = "Do you ship to Norway?"
    assert respond(strata, keys.acme, {"instructions": SYSTEM, "input": question}).headers["x-cache"] == "miss"
    # Other instructions, another limit, another tenant: all misses.
    assert respond(strata, keys.acme, {"instructions": "Be brief.", "input": question}).headers["x-cache"] == "miss"
    assert respond(strata, keys.acme, {"instructions": SYSTEM, "input": question,
                                       "max_output_tokens": 9}).headers["x-cache"] == "miss"
    assert respond(strata, keys.globex, {"instructions": SYSTEM, "input": question}).headers["x-cache"] == "miss"
    # Anthropic names max_tokens always: not the same request as one that named none.
    assert message(strata, keys.acme, {"system": SYSTEM, "messages": [{"role": "user", "content": question}],
                                       "max_tokens": 10}).headers["x-cache"] == "miss"
    assert len(fake_upstream.calls) == 5


def test_a_stored_conversation_passes_through_salted(strata: str, keys: Keys, fake_upstream: FakeUpstream) -> None:
    for body in ({"input": "And then?", "previous_response_id": "resp_abc"}, {"input": "Remember this.", "store": True},
                 {"input": "Search the web", "tools": [{"type": "web_search"}]}):
        twice = [respond(strata, keys.acme, body) for _ in range(2)]
        assert [r.headers["x-cache"] for r in twice] == ["bypass", "bypass"], twice[0].text
        assert twice[0].json()["output"][0]["content"][0]["text"].startswith("stored answer to:")
    sent = [json.loads(body) for _, path, body in fake_upstream.other_calls if path == "/v1/responses"]
    assert len(sent) == 6 and {s["cache_salt"] for s in sent} == {prefix_salt("acme")}
    assert not fake_upstream.calls


def test_anthropic_streams_a_message_and_its_hit_alike(strata: str, keys: Keys) -> None:
    body = {"system": SYSTEM, "messages": [{"role": "user", "content": "Is there a warranty?"}], "stream": True}
    miss, hit = message(strata, keys.acme, body), message(strata, keys.acme, body)
    assert [miss.headers["x-cache"], hit.headers["x-cache"]] == ["miss", "exact-hit"]
    for response in (miss, hit):
        kinds = [kind for kind, _ in events(response)]
        assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * (len(kinds) - 5),
                         "content_block_stop", "message_delta", "message_stop"]
        assert len(kinds) > 5
    texts = ["".join(d["delta"]["text"] for k, d in events(r) if k == "content_block_delta") for r in (miss, hit)]
    assert texts[0] == texts[1] and "Is there a warranty?" in texts[0]
    closing = next(d for k, d in events(hit) if k == "message_delta")
    assert closing["delta"]["stop_reason"] == "end_turn" and closing["usage"]["output_tokens"] == 5


def test_anthropic_tool_use_round_trips_as_blocks(strata: str, keys: Keys, fake_upstream: FakeUpstream) -> None:
    tools = [{"name": "track", "description": "Track a parcel", "input_schema": {
        "type": "object", "properties": {"parcel": {"type": "string"}}, "required": ["parcel"]}}]
    body = {"messages": [{"role": "user", "content": "Track parcel 12"}], "tools": tools,
            "tool_choice": {"type": "tool", "name": "track"}}
    miss, hit = message(strata, keys.acme, body), message(strata, keys.acme, body)
    assert [miss.headers["x-cache"], hit.headers["x-cache"]] == ["miss", "exact-hit"], miss.text
    block = miss.json()["content"][0]
    assert block["type"] == "tool_use" and block["name"] == "track" and isinstance(block["input"], dict)
    assert miss.json()["stop_reason"] == "tool_use" and hit.json()["content"] == miss.json()["content"]
    sent = fake_upstream.calls[-1]
    assert sent["tools"][0]["function"]["parameters"] == tools[0]["input_schema"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "track"}}
    # The tool's result, sent back: a tool message after the assistant's call.
    follow = message(strata, keys.acme, {"tools": tools, "messages": [
        {"role": "user", "content": "Track parcel 12"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "track", "input": {"parcel": "12"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "in Oslo"}]}]})
    assert follow.status_code == 200, follow.text
    assert fake_upstream.calls[-1]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "track", "arguments": '{"parcel": "12"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "in Oslo"}]


def test_errors_come_in_the_askers_shape(strata: str, keys: Keys) -> None:
    no_limit = httpx.post(strata + "/v1/messages", headers={"x-api-key": keys.acme}, timeout=10,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert no_limit.status_code == 400
    assert no_limit.json()["type"] == "error" and no_limit.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_limit.json()["error"]["message"]
    unauthorized = httpx.post(strata + "/v1/messages", headers={"x-api-key": "sk-wrong"}, timeout=10,
                              json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["type"] == "authentication_error"
    bad = respond(strata, keys.acme, {"input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    not_json = httpx.post(strata + "/v1/responses", headers=bearer(keys.acme), content=b"{", timeout=10)
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"


def test_two_tenants_with_one_system_prompt_get_different_salts(strata: str, keys: Keys,
                                                                 fake_upstream: FakeUpstream) -> None:
    for key in (keys.acme, keys.acme, keys.globex):
        ask(strata, "What are your opening hours?", key=key, system=SYSTEM, headers={"Cache-Control": "no-store"})
    salts = [call["cache_salt"] for call in fake_upstream.calls]
    assert salts == [prefix_salt("acme"), prefix_salt("acme"), prefix_salt("globex")]
    assert salts[0] != salts[2]
    # A client's own salt cannot choose another tenant's blocks: Strata's replaces it.
    httpx.post(strata + "/v1/chat/completions", headers=bearer(keys.globex), timeout=10,
               json={"model": MODEL, "messages": [{"role": "user", "content": "hours?"}], "cache_salt": prefix_salt("acme")})
    assert fake_upstream.calls[-1]["cache_salt"] == prefix_salt("globex")


def test_the_salt_can_be_turned_off(redis_url: str, fake_upstream: FakeUpstream, redis_sync: redis.Redis) -> None:
    fake_upstream.reset()
    with serve_strata(strata_settings(redis_url, fake_upstream.url, cache_salt=False)) as server:
        ask(server.url, "Salt off?")
    assert "cache_salt" not in fake_upstream.calls[-1]


def test_the_endpoints_are_counted_per_outcome(strata: str, keys: Keys) -> None:
    respond(strata, keys.acme, {"input": "Counted?"})
    respond(strata, keys.acme, {"input": "Counted?"})
    text = httpx.get(strata + "/metrics").text
    assert 'strata_endpoint_requests_total{endpoint="responses",outcome="exact-hit"}' in text
    assert 'strata_endpoint_requests_total{endpoint="responses",outcome="miss"}' in text


def dynamic_counted(strata: str, tenant: str) -> float:
    text = httpx.get(strata + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("strata_prompt_dynamic_total{") and f'tenant="{tenant}"' in line)


def test_what_anthropic_marks_with_cache_control_is_the_prefix_l3_checks(strata: str, keys: Keys) -> None:
    before = dynamic_counted(strata, "acme")
    stamped = "Catalogue exported 2026-12-02T10:31:07Z. Item 1: a blue kettle."
    # The timestamp in the last, unmarked turn is where dynamic content belongs: not counted.
    message(strata, keys.acme, {"system": SYSTEM, "messages": [{"role": "user", "content": [
        {"type": "text", "text": stamped}, {"type": "text", "text": "Is the kettle blue?"}]}]})
    assert dynamic_counted(strata, "acme") == before
    # Inside the prefix the client marked for caching, it defeats that cache: counted.
    message(strata, keys.acme, {"system": SYSTEM, "messages": [{"role": "user", "content": [
        {"type": "text", "text": stamped, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Is the kettle blue?"}]}]})
    assert dynamic_counted(strata, "acme") == before + 1


def test_images_are_part_of_the_key_in_both_protocols(strata: str, keys: Keys, fake_upstream: FakeUpstream) -> None:
    one_pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nG{}AAAAABJRU5ErkJggg=="
    red = "data:image/png;base64," + one_pixel.format("P4z8DwHwAFAAH/iZk9HQ")
    blue = "data:image/png;base64," + one_pixel.format("NgYPj/HwADAgH/eL9GtQ")

    def anthropic_with(image: str) -> str:
        data = image.split(",", 1)[1]
        return message(strata, keys.acme, {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "What colour is this?"}]}]}).headers["x-cache"]

    def responses_with(image: str) -> str:
        return respond(strata, keys.acme, {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": image}, {"type": "input_text", "text": "What colour is this?"}]}]}
                       ).headers["x-cache"]

    assert [anthropic_with(red), anthropic_with(blue), anthropic_with(red)] == ["miss", "miss", "exact-hit"]
    assert [responses_with(red), responses_with(blue), responses_with(blue)] == ["miss", "miss", "exact-hit"]
    sent = fake_upstream.calls[0]["messages"][0]["content"]
    assert sent[0] == {"type": "image_url", "image_url": {"url": red}} and sent[1]["text"] == "What colour is this?"
