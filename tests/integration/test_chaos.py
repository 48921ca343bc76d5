"""Abuse and faults: a noisy tenant's flood, a worker killed mid-stream, a hanging upstream, hostile
bodies, a broken upstream, malformed tool fields. Each reported failure as a regression test on a
real Redis Stack, real worker processes where a process must die, and a fault-injecting upstream.
Tests check behaviour (a status, an answer within a generous bound); docs/RELIABILITY.md carries
the measured figures (`make load`)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import add_key
from tests.support import MODEL, FakeUpstream, free_port, scan, serve_process, serve_strata, stop_process, strata_settings


def body(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}


def strata_process(redis_url: str, fake: FakeUpstream, **env: str) -> tuple[Any, str]:
    port = free_port()
    environment = {**os.environ, "STRATA_PORT": str(port), "STRATA_REDIS_URL": redis_url,
                   "STRATA_UPSTREAM_URL": fake.url + "/v1", "STRATA_SEMANTIC_ENABLED": "false",
                   "STRATA_UPSTREAM_MAX_RETRIES": "0", "STRATA_LOG_LEVEL": "warning", **env}
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return serve_process(environment, port), f"http://127.0.0.1:{port}"


# --- a noisy tenant -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    path = tmp_path_factory.mktemp("chaos") / "keys.json"
    quiet, _ = add_key(path, "quiet")
    noisy, _ = add_key(path, "noisy")
    return path, quiet, noisy


def test_a_noisy_tenants_flood_of_long_questions_does_not_stall_another_tenants_hits(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any, two_tenants: tuple[Path, str, str]
) -> None:
    fake_upstream.reset()
    path, quiet, noisy = two_tenants
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, keys_file=str(path),
                               max_content_chars=65_536)
    faq = {"X-Cache-Category": "faq"}
    with serve_strata(settings, use_encoder) as server:
        quiet_headers = {**faq, "Authorization": f"Bearer {quiet}"}
        noisy_headers = {**faq, "Authorization": f"Bearer {noisy}"}
        assert httpx.post(server.url + "/v1/chat/completions", json=body("营业时间是几点"), headers=quiet_headers).status_code == 200
        stop = threading.Event()
        sent: list[int] = []

        def flood(seed: int) -> None:
            with httpx.Client(timeout=60) as client:
                n = 0
                while not stop.is_set():
                    question = f"{seed}-{n} " + "请帮我查一下这笔长长的订单为什么还没有发货" * 3200  # ~64k characters
                    client.post(server.url + "/v1/chat/completions", json=body(question[:65_536]), headers=noisy_headers)
                    sent.append(1)
                    n += 1

        flooders = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(2)]
        for thread in flooders:
            thread.start()
        try:
            deadline = time.monotonic() + 60
            while len(sent) < 4 and time.monotonic() < deadline:  # the flood is on
                time.sleep(0.05)
            slowest = 0.0
            with httpx.Client(timeout=30) as client:
                for _ in range(40):
                    started = time.monotonic()
                    response = client.post(server.url + "/v1/chat/completions", json=body("营业时间是几点"), headers=quiet_headers)
                    slowest = max(slowest, time.monotonic() - started)
                    assert response.headers["x-cache"] == "exact-hit"
        finally:
            stop.set()
            for thread in flooders:
                thread.join(timeout=60)
        assert len(sent) >= 4
        # How fast is not asserted here (a wall-clock bound fails on a loaded machine: 1.3 s under
        # four CPU burners): bench/load.py measures it (docs/RELIABILITY.md). Here every hit is served.
        print(f"the quiet tenant's slowest exact hit during the flood: {slowest:.3f} s")


def test_a_question_longer_than_the_semantic_layer_takes_is_served_exactly(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    fake_upstream.reset()
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, max_content_chars=65_536)
    long_question = ("请问这个问题为什么这么长 " * 6000)[:65_536]
    with serve_strata(settings, use_encoder) as server:
        faq = {"X-Cache-Category": "faq"}
        first = httpx.post(server.url + "/v1/chat/completions", json=body(long_question), headers=faq, timeout=30)
        second = httpx.post(server.url + "/v1/chat/completions", json=body(long_question), headers=faq, timeout=30)
        assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "exact-hit")
        metrics = httpx.get(server.url + "/metrics").text
        assert 'reason="question_too_long"' in metrics
        assert not scan(redis_sync, "strata:v1:sem:*")  # never embedded, never indexed


# --- single flight under faults -------------------------------------------------------------------


@pytest.mark.single_node("kills one Strata process; its lease lives in the one Redis")
def test_a_worker_killed_mid_stream_leaves_no_lease_that_blocks_the_question(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.chunk_delay = 5.0  # the first worker is mid-stream for long
    first, first_url = strata_process(redis_url, fake_upstream)
    second, second_url = strata_process(redis_url, fake_upstream)
    try:
        with httpx.stream("POST", first_url + "/v1/chat/completions", json=body("killed mid-stream", stream=True),
                          timeout=30) as streaming:
            lines = streaming.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # the stream has begun
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        fake_upstream.chunk_delay = 0.0
        started = time.monotonic()
        answer = httpx.post(second_url + "/v1/chat/completions", json=body("killed mid-stream"), timeout=30)
        assert answer.status_code == 200 and "killed mid-stream" in answer.json()["choices"][0]["message"]["content"]
        assert time.monotonic() - started < 5.0  # the dead leader's lease is gone within its 2 s
        streamed = httpx.post(second_url + "/v1/chat/completions", json=body("killed mid-stream", stream=True), timeout=30)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    finally:
        for process in (first, second):
            stop_process(process)


def test_a_hanging_upstream_costs_each_request_one_timeout_not_two(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    fake_upstream.delay = 3.0  # longer than the 1 s upstream timeout
    settings = strata_settings(redis_url, fake_upstream.url)
    results: dict[str, tuple[int, float]] = {}
    with serve_strata(settings) as one, serve_strata(settings) as other:  # two workers' worth of single flight

        def ask(name: str, url: str) -> None:
            started = time.monotonic()
            response = httpx.post(url + "/v1/chat/completions", json=body("hangs"), timeout=30)
            results[name] = (response.status_code, time.monotonic() - started)

        leader = threading.Thread(target=ask, args=("leader", one.url))
        leader.start()
        deadline = time.monotonic() + 10
        while not fake_upstream.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        follower = threading.Thread(target=ask, args=("follower", other.url))
        follower.start()
        leader.join(20)
        follower.join(20)
    assert results["leader"][0] == results["follower"][0] == 504
    assert len(fake_upstream.calls) == 1  # the follower shared the leader's timeout, it did not call again


# --- hostile bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_json_nested_deeper_than_the_limit_is_a_400(path: str, client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    nested = "[" * 965 + "]" * 965
    payload = {"/v1/chat/completions": '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": %s}',
               "/v1/completions": '{"model": "m", "prompt": "hi", "extra": %s}',
               "/v1/embeddings": '{"model": "m", "input": "hi", "extra": %s}'}[path] % nested
    response = client.post(path, content=payload, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "too_deep" and "64" in response.json()["error"]["message"]
    assert fake_upstream.calls == [] and fake_upstream.completion_calls == []


def test_a_body_declared_and_never_sent_is_a_408(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    with serve_strata(strata_settings(redis_url, fake_upstream.url, body_timeout_s=1.0)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 200\r\n\r\n{\"model\":")
            started = time.monotonic()
            reply = connection.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 8


@pytest.mark.parametrize(("field", "value", "param"), [
    ("tools", "get the weather", "tools"),
    ("tools", [{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
    ("tools", [{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": "object"}}], "tools[0].function.parameters"),
    ("tool_choice", "sometimes", "tool_choice"),
    ("tool_choice", {"type": "function", "function": {"name": "absent"}}, "tool_choice"),
    ("response_format", {"type": "yaml"}, "response_format"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema"),
    ("logit_bias", {"hello": 5}, "logit_bias.hello"),
    ("logit_bias", {"50256": 500}, "logit_bias.50256"),
])
def test_malformed_tool_and_format_fields_are_a_400_naming_them(
    client: httpx.Client, fake_upstream: FakeUpstream, field: str, value: Any, param: str
) -> None:
    extra: dict[str, Any] = {field: value}
    if field == "tool_choice" and isinstance(value, dict):
        extra["tools"] = [{"type": "function", "function": {"name": "present"}}]
    response = client.post("/v1/chat/completions", json=body("tools?", **extra))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake_upstream.calls == []


# --- a broken upstream ----------------------------------------------------------------------------


def test_a_broken_upstream_is_a_502_never_an_empty_success(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    fake_upstream.garbage_stream = True
    streamed = client.post("/v1/chat/completions", json=body("garbage please", stream=True))
    assert streamed.status_code == 502 and streamed.json()["error"]["type"] == "upstream_error"
    fake_upstream.garbage_stream = False
    fake_upstream.bad_body = b'{"id": "x", "object": "chat.completion", "choices": "nope"}'
    shapeless = client.post("/v1/chat/completions", json=body("shapeless"))
    assert shapeless.status_code == 502 and shapeless.json()["error"]["type"] == "upstream_error"
    fake_upstream.bad_body = b"not json at all"
    assert client.post("/v1/chat/completions", json=body("not json")).status_code == 502
    fake_upstream.bad_body = None
    # Nothing of it was stored: asked again, each is a miss.
    assert client.post("/v1/chat/completions", json=body("shapeless")).headers["x-cache"] == "miss"


def test_a_stream_cut_before_its_finish_is_an_error_event_and_not_cached(client: httpx.Client, fake_upstream: FakeUpstream) -> None:
    fake_upstream.fail_mid_stream = True
    cut = client.post("/v1/chat/completions", json=body("cut short", stream=True))
    assert cut.status_code == 200 and '"error"' in cut.text and "[DONE]" not in cut.text
    fake_upstream.fail_mid_stream = False
    assert client.post("/v1/chat/completions", json=body("cut short")).headers["x-cache"] == "miss"


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_answer_is_never_cached(client: httpx.Client, fake_upstream: FakeUpstream, stream: bool) -> None:
    fake_upstream.answers["say nothing"] = ""
    first = client.post("/v1/chat/completions", json=body("say nothing", stream=stream))
    assert first.status_code == 200
    assert client.post("/v1/chat/completions", json=body("say nothing")).headers["x-cache"] == "miss"
    assert len(fake_upstream.calls) == 2
