"""Bad input gets a clear OpenAI-shaped 4xx naming the field, never a 500, and stores nothing."""

from __future__ import annotations

import httpx
import pytest
import redis

from tests.support import FakeUpstream, scan

CASES = [
    (b'{"model": "m", "messages": [', None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "model", "invalid_value"),
    (b'{"model": "m"}', "messages", "invalid_value"),
    (b'{"model": "m", "messages": []}', "messages", "invalid_value"),
    (b'{"model": "m", "messages": "hi"}', "messages", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "robot", "content": "hi"}]}', "messages[0].role", "invalid_value"),
    (b'{"model": "m", "messages": [{"content": "hi"}]}', "messages[0].role", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "   "}]}', "messages[0].content", "empty_content"),
    (b'{"model": "m", "messages": [{"role": "user"}]}', "messages[0].content", "empty_content"),
    (b'{"model": "m", "messages": [{"role": "user", "content": 42}]}', "messages[0].content", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "user", "content": []}]}', "messages[0].content", "empty_content"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "temperature", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}', "temperature", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens", "invalid_value"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream", "invalid_value"),
    (b'{"model": 7, "messages": [{"role": "user", "content": "hi"}]}', "model", "invalid_value"),
]


@pytest.mark.parametrize(("body", "param", "code"), CASES)
def test_bad_requests_get_openai_shaped_400(
    client: httpx.Client, fake_upstream: FakeUpstream, redis_sync: redis.Redis, body: bytes, param: str | None, code: str
) -> None:
    response = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == code and error["param"] == param
    if param:
        assert param.split(".")[-1].split("[")[0] in error["message"]
    assert fake_upstream.calls == []
    assert list(scan(redis_sync, "strata:v*")) == []


def test_unknown_route_and_wrong_method_are_openai_shaped(client: httpx.Client) -> None:
    missing = client.get("/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    # Under /v1/ an unknown path is the model server's to answer: passed through, status kept.
    assert client.get("/v1/nothing").status_code == 404
    wrong = client.get("/v1/chat/completions")
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_admin_is_forbidden_without_a_configured_token(redis_url: str, fake_upstream: FakeUpstream) -> None:
    from tests.support import serve_strata, strata_settings

    with serve_strata(strata_settings(redis_url, fake_upstream.url, admin_token=None)) as server:
        response = httpx.post(server.url + "/admin/cache/invalidate", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"
