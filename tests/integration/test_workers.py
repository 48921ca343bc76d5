"""Strata as it runs in production: `python -m app.serve` with 2 worker processes."""

from __future__ import annotations

import os
import re

import httpx
import redis

from tests.support import MODEL, FakeUpstream, free_port, serve_process, stop_process


def test_metrics_add_up_over_two_workers(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    port = free_port()
    env = {**os.environ, "STRATA_PORT": str(port), "STRATA_WORKERS": "2", "STRATA_REDIS_URL": redis_url,
           "STRATA_UPSTREAM_URL": fake_upstream.url + "/v1", "STRATA_SEMANTIC_ENABLED": "false",
           "STRATA_LOG_LEVEL": "warning"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = serve_process(env, port)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=10) as client:  # new connections spread over the workers
            for i in range(40):
                with httpx.Client(base_url=url, timeout=10) as fresh:
                    fresh.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": f"w{i % 10}"}]})
            totals = set()
            for _ in range(6):
                with httpx.Client(base_url=url, timeout=10) as fresh:
                    text = fresh.get("/metrics").text
                counts = [float(v) for v in re.findall(r'^strata_requests_total\{outcome="[^"]+"\} ([0-9.e+]+)$', text, re.MULTILINE)]
                totals.add(sum(counts))
            assert totals == {40.0}, totals  # every scrape, whichever worker answers, sees all 40
            assert client.get("/health").json()["status"] == "ok"
    finally:
        stop_process(process)
