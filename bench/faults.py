"""Faults injected into a running Strata, and what its clients saw: a worker killed mid-stream, a
hanging model server, hostile bodies, a broken model server, a Redis that refuses writes.

Its own Redis Stack on a free port, a fault-injecting upstream in this process, Strata as
production runs it (``python -m app.serve``, separate processes, so one can be killed). Writes the
"Faults" section of docs/RELIABILITY.md (between its markers; `bench.load` keeps it).

    python -m bench.faults

Only loopback addresses; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import redis
from litestar import Litestar, Request, Response, post
from litestar.response import Stream

from app.replay.simulate import ServerThread, free_port, own_redis_stack
from bench.run import ROOT, machine, wait_for

BEGIN, END = "<!-- faults: written by python -m bench.faults -->", "<!-- /faults -->"


class FaultyUpstream:
    """An OpenAI-shaped upstream whose fault the benchmark sets: ``slow_stream`` (seconds between
    chunks), ``delay`` (before answering), ``garbage`` (a stream that is no SSE), ``body`` (a 200
    body as given); it counts the calls per question."""

    def __init__(self) -> None:
        self.slow_stream = 0.0
        self.delay = 0.0
        self.garbage = False
        self.body: bytes | None = None
        self.calls: dict[str, int] = {}

    def app(self) -> Litestar:
        upstream = self

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request[Any, Any, Any]) -> Response[bytes] | Stream:
            data = msgspec.json.decode(await request.body())
            question = str(data["messages"][-1].get("content"))
            upstream.calls[question] = upstream.calls.get(question, 0) + 1
            if upstream.delay:
                await asyncio.sleep(upstream.delay)
            if upstream.body is not None:
                return Response(upstream.body, media_type="application/json")
            answer = f"answer to: {question}"
            head = {"id": "chatcmpl-fault", "created": 1700000000, "model": data["model"]}
            if data.get("stream"):
                if upstream.garbage:
                    async def garbage() -> Any:
                        yield b"<html>502 from a proxy</html>\n\n"
                    return Stream(garbage(), media_type="text/event-stream")

                async def chunks() -> Any:
                    for piece, finish in (({"role": "assistant", "content": ""}, None), ({"content": answer}, None), ({}, "stop")):
                        chunk = {**head, "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": piece, "logprobs": None, "finish_reason": finish}]}
                        yield b"data: " + msgspec.json.encode(chunk) + b"\n\n"
                        if upstream.slow_stream:
                            await asyncio.sleep(upstream.slow_stream)
                    yield b"data: [DONE]\n\n"
                return Stream(chunks(), media_type="text/event-stream")
            completion = {**head, "object": "chat.completion", "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "logprobs": None,
                                       "finish_reason": "stop"}]}
            return Response(msgspec.json.encode(completion), media_type="application/json")

        return Litestar([chat])


def strata(redis_url: str, upstream_url: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    environment = {**os.environ, "STRATA_PORT": str(port), "STRATA_REDIS_URL": redis_url, "STRATA_UPSTREAM_URL": upstream_url + "/v1",
                   "STRATA_SEMANTIC_ENABLED": "false", "STRATA_UPSTREAM_MAX_RETRIES": "0", "STRATA_LOG_LEVEL": "warning",
                   "STRATA_POLICY_FILE": str(ROOT / "bench" / "policy.yaml"), **env}
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=ROOT, env=environment)
    url = f"http://127.0.0.1:{port}"
    wait_for(url + "/health", timeout=120)
    return process, url


def stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)


def body(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "stub-model", "messages": [{"role": "user", "content": question}], **extra}


def killed_mid_stream(redis_url: str, upstream: FaultyUpstream, upstream_url: str) -> list[str]:
    upstream.slow_stream = 5.0
    first, first_url = strata(redis_url, upstream_url)
    second, second_url = strata(redis_url, upstream_url)
    try:
        with httpx.stream("POST", first_url + "/v1/chat/completions", json=body("killed", stream=True), timeout=30) as response:
            next(line for line in response.iter_lines() if line.startswith("data:"))
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        upstream.slow_stream = 0.0
        started = time.monotonic()
        answer = httpx.post(second_url + "/v1/chat/completions", json=body("killed"), timeout=60)
        took = time.monotonic() - started
    finally:
        stop(first, second)
    return ["a worker killed (`kill -9`) while it streamed a miss; the same question asked at another worker",
            f"{answer.status_code} `{answer.headers.get('x-cache')}` after {took:.2f} s (lease of 2 s, no longer renewed)",
            f"nothing: the killed stream was never stored; {upstream.calls.get('killed', 0)} model calls in all"]


def hanging_upstream(redis_url: str, upstream: FaultyUpstream, upstream_url: str) -> list[str]:
    upstream.delay = 6.0
    env = {"STRATA_UPSTREAM_TIMEOUT_S": "2"}
    first, first_url = strata(redis_url, upstream_url, **env)
    second, second_url = strata(redis_url, upstream_url, **env)
    results: dict[str, tuple[int, float]] = {}

    async def both() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            async def ask(name: str, url: str, after: float) -> None:
                await asyncio.sleep(after)
                started = time.monotonic()
                response = await http.post(url + "/v1/chat/completions", json=body("hangs"))
                results[name] = (response.status_code, time.monotonic() - started)
            await asyncio.gather(ask("leader", first_url, 0.0), ask("follower", second_url, 0.3))

    try:
        asyncio.run(both())
    finally:
        upstream.delay = 0.0
        stop(first, second)
    (lead_status, lead_s), (follow_status, follow_s) = results["leader"], results["follower"]
    return ["the model server hangs (6 s) past Strata's upstream timeout (2 s); the same question at two workers",
            f"leader {lead_status} after {lead_s:.1f} s, follower (other worker) {follow_status} after {follow_s:.1f} s",
            f"nothing; {upstream.calls.get('hangs', 0)} model call (the follower shared the leader's timeout)"]


def hostile_bodies(url: str) -> list[list[str]]:
    nested = "[" * 965 + "]" * 965
    statuses = []
    for path, fields in (("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi"}]'),
                         ("/v1/completions", '"prompt": "hi"'), ("/v1/embeddings", '"input": "hi"')):
        payload = f'{{"model": "stub-model", {fields}, "extra": {nested}}}'
        response = httpx.post(url + path, content=payload, headers={"Content-Type": "application/json"}, timeout=30)
        statuses.append(f"{path} {response.status_code} `{response.json()['error']['code']}`")
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 500\r\n\r\n{\"model\":")
        started = time.monotonic()
        reply = connection.recv(4096).split(b"\r\n", 1)[0].decode()
        waited = time.monotonic() - started
    return [["JSON nested 965 levels deep (inside a field passed through)", "; ".join(statuses), "nothing (nothing sent upstream)"],
            ["a body declared (500 bytes) and never sent", f"`{reply}` after {waited:.1f} s (`STRATA_BODY_TIMEOUT_S`, 10)", "nothing"]]


def broken_upstream(url: str, upstream: FaultyUpstream) -> list[list[str]]:
    rows = []
    upstream.garbage = True
    streamed = httpx.post(url + "/v1/chat/completions", json=body("garbage", stream=True), timeout=30)
    upstream.garbage = False
    rows.append(["a stream of lines that are no server-sent events", f"{streamed.status_code} `{streamed.json()['error']['type']}`",
                 "nothing cached"])
    upstream.body = b'{"id": "x", "object": "chat.completion", "choices": "nope"}'
    shapeless = httpx.post(url + "/v1/chat/completions", json=body("shapeless"), timeout=30)
    upstream.body = (b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
                     b'"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}')
    empty = [httpx.post(url + "/v1/chat/completions", json=body("empty"), timeout=30) for _ in range(2)]
    upstream.body = None
    again = httpx.post(url + "/v1/chat/completions", json=body("shapeless"), timeout=30)
    rows.append(["a 200 whose `choices` is not a list", f"{shapeless.status_code} `{shapeless.json()['error']['type']}`",
                 f"nothing cached (asked again: `{again.headers.get('x-cache')}`)"])
    rows.append(["an empty answer (200, content \"\")", f"200 `{empty[0].headers.get('x-cache')}`",
                 f"not cached (asked again: `{empty[1].headers.get('x-cache')}`)"])
    return rows


def refused_writes(redis_url: str, url: str) -> list[str]:
    admin = redis.Redis.from_url(redis_url)
    httpx.post(url + "/v1/chat/completions", json=body("warm"), timeout=30)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    try:
        response = httpx.post(url + "/v1/chat/completions", json=body("no room"), timeout=30)
        deadline = time.monotonic() + 10
        health: dict[str, Any] = {}
        while time.monotonic() < deadline:  # the write-back follows the response
            health = httpx.get(url + "/health", timeout=10).json()
            if health["redis"]["status"] != "ok":
                break
            time.sleep(0.1)
        gauge = re.search(r"^strata_cache_writes_failing (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.MULTILINE)
    finally:
        admin.config_set("maxmemory", "0")
        admin.config_set("maxmemory-policy", "volatile-lru")
    return ["Redis refuses every write (`maxmemory` 1 byte, `noeviction`)",
            f"{response.status_code} `{response.headers.get('x-cache')}`; `/health` `{health.get('status')}`, redis"
            f" `{health.get('redis', {}).get('status')}`; `strata_cache_writes_failing` {gauge.group(1) if gauge else '?'}"
            " (alert StrataCacheWritesFailing)",
            "the answers of that time are not cached; entries stored before are kept"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "RELIABILITY.md"))
    args = parser.parse_args()
    upstream = FaultyUpstream()
    rows: list[list[str]] = []
    with own_redis_stack() as redis_url, ServerThread(upstream.app()) as server:
        rows.append(killed_mid_stream(redis_url, upstream, server.url))
        rows.append(hanging_upstream(redis_url, upstream, server.url))
        process, url = strata(redis_url, server.url)
        try:
            rows += hostile_bodies(url)
            rows += broken_upstream(url, upstream)
            rows.append(refused_writes(redis_url, url))
        finally:
            stop(process)
    section = [
        BEGIN, "## Faults", "",
        f"Measured by `python -m bench.faults` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} ({machine()}):"
        " its own Redis Stack, a fault-injecting upstream, Strata as `python -m app.serve` processes. The noisy"
        " tenant's flood is measured by the load test above.", "",
        "| fault injected | what clients saw | what was lost |", "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows], "", END,
    ]
    out = Path(args.out)
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    kept = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), "", text, flags=re.DOTALL).rstrip()
    out.write_text(kept + "\n\n" + "\n".join(section) + "\n", encoding="utf-8")
    print("\n".join(section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
