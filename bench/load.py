"""Load test: 16 concurrent clients, 60 s of mixed traffic against the `make up` stack (Redis
Stack on 6380, vLLM on 8000) served by Strata with 2 workers; writes docs/RELIABILITY.md.

Traffic: exact hits, paraphrases (semantic candidates), misses that reach the model, streaming
requests, and invalid requests, from the tenant `shop`. Afterwards every miss whose answer was
acknowledged (200 and finished with "stop") is asked again: it must come back as a cache hit (no
lost writes). Meanwhile a second tenant, `noisy`, floods the service with questions of 64k
characters (`--noisy-clients`), and the shop's exact hits are timed: one tenant's flood must not
stall another's hits.

    python -m bench.load [--clients 16] [--seconds 60] [--noisy-clients 2]

Only loopback addresses; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from app.auth import add_key
from bench.faults import BEGIN as FAULTS_BEGIN
from bench.run import ROOT, free_port, machine, peak_rss_mb, wait_for

REDIS_URL = "redis://127.0.0.1:6380/0"
VLLM_URL = "http://127.0.0.1:8000"
CATEGORY = {"X-Cache-Category": "faq"}
# The noisy tenant's question: about 64k characters of Chinese, the most a message may hold.
NOISY_QUESTION = ("请帮我查一下这笔长长的订单为什么还没有发货，" * 3300)[:65_000]
MAX_REQUESTS = 200_000  # a hard bound besides the time limit

# Questions SmolLM2-135M answers briefly (finish_reason "stop" within max_tokens), so they cache.
KNOWN = [
    "Answer in one word: what is the capital of France?", "Answer in one word: what color is the sky?",
    "Answer in one word: what is the capital of Japan?", "Answer in one word: what color is grass?",
    "What is 12 plus 1? Answer with a number only.", "What is 40 plus 2? Answer with a number only.",
]
PARAPHRASES = ["Answer in one word: which city is the capital of France?", "Answer in one word: what colour is the sky?",
               "Answer in one word: what is the capital city of Japan?", "What is 40 plus two? Answer with a number only."]
INVALID = [b'{"model": "m", "messages": [', b'{"messages": []}', b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}',
           b'{"model": "m", "messages": [{"role": "user", "content": ""}]}', b"[]"]


def chat(model: str, question: str, stream: bool = False, max_tokens: int = 64) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_tokens": max_tokens, "stream": stream}


def new_question() -> str:
    return f"What is {uuid.uuid4().int % 100000} plus 1? Answer with a number only."


async def client_loop(http: httpx.AsyncClient, url: str, model: str, known: list[str], deadline: float,
                      rng: random.Random, stats: Counter[str], acknowledged: list[dict[str, object]],
                      budget: list[int], hit_times: list[float]) -> None:
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        kind = rng.choices(["hit", "paraphrase", "miss", "stream", "invalid"], weights=[50, 15, 10, 15, 10])[0]
        try:
            if kind == "invalid":
                response = await http.post(url, content=rng.choice(INVALID), headers={"content-type": "application/json"})
                stats[f"{kind} {response.status_code}"] += 1
                continue
            if kind == "stream":
                question = rng.choice(known) if rng.random() < 0.5 else new_question()
                payload = chat(model, question, stream=True)
                async with http.stream("POST", url, json=payload, headers=CATEGORY) as response:
                    text = (await response.aread()).decode()
                stats[f"{kind} {response.status_code} {response.headers.get('x-cache')}"] += 1
                if response.status_code == 200 and text.rstrip().endswith("[DONE]") and '"finish_reason":"stop"' in text \
                        and response.headers.get("x-cache") == "miss":
                    acknowledged.append(payload)
                continue
            if kind == "hit":
                payload = chat(model, rng.choice(known))
            elif kind == "paraphrase":
                payload = chat(model, rng.choice(PARAPHRASES))
            else:
                payload = chat(model, new_question())
            started = time.perf_counter()
            response = await http.post(url, json=payload, headers=CATEGORY)
            if kind == "hit" and response.headers.get("x-cache") == "exact-hit":
                hit_times.append(time.perf_counter() - started)
            stats[f"{kind} {response.status_code} {response.headers.get('x-cache')}"] += 1
            if response.status_code == 200 and response.headers.get("x-cache") == "miss" \
                    and response.json()["choices"][0]["finish_reason"] == "stop":
                acknowledged.append(payload)
        except httpx.HTTPError as exc:
            stats[f"{kind} transport-error {type(exc).__name__}"] += 1


async def noisy_loop(url: str, model: str, key: str, deadline: float, stats: Counter[str], budget: list[int]) -> None:
    """The other tenant: one 64k-character question after another, each new."""
    async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {key}", **CATEGORY}) as http:
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            try:
                response = await http.post(url, json=chat(model, f"{uuid.uuid4().hex} {NOISY_QUESTION}"))
                stats[f"noisy {response.status_code} {response.headers.get('x-cache')}"] += 1
            except httpx.HTTPError as exc:
                stats[f"noisy transport-error {type(exc).__name__}"] += 1


async def run(url: str, model: str, clients: int, seconds: int, keys: dict[str, str],
              noisy_clients: int) -> tuple[Counter[str], list[dict[str, object]], float, list[str], list[float]]:
    stats: Counter[str] = Counter()
    acknowledged: list[dict[str, object]] = []
    hit_times: list[float] = []
    budget = [MAX_REQUESTS]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits, headers={"Authorization": f"Bearer {keys['shop']}"}) as http:
        known = []
        for question in KNOWN:  # warm the cache; keep the questions whose answer was cached
            warm = await http.post(url, json=chat(model, question), headers=CATEGORY)
            if warm.status_code == 200 and warm.json()["choices"][0]["finish_reason"] == "stop":
                known.append(question)
        if not known:
            raise RuntimeError("no warm-up answer finished within max_tokens; nothing can be cached")
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(*[
            client_loop(http, url, model, known, deadline, random.Random(seed), stats, acknowledged, budget, hit_times)
            for seed in range(clients)
        ], *[noisy_loop(url, model, keys["noisy"], deadline, stats, budget) for _ in range(noisy_clients)])
        elapsed = time.monotonic() - started
    return stats, acknowledged, elapsed, known, hit_times


async def lost_writes(url: str, acknowledged: list[dict[str, object]], key: str) -> tuple[int, int]:
    """(checked, lost): every acknowledged miss must now be a cache hit."""
    lost = 0
    async with httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        for payload in acknowledged:
            again = {**payload, "stream": False}
            response = await http.post(url, json=again, headers=CATEGORY)
            if response.headers.get("x-cache") not in ("exact-hit", "semantic-hit"):
                lost += 1
    return len(acknowledged), lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--noisy-clients", type=int, default=2, help="clients of the noisy tenant (64k-character questions)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "RELIABILITY.md"))
    args = parser.parse_args()
    try:
        model = httpx.get(VLLM_URL + "/v1/models", timeout=3).json()["data"][0]["id"]
        import redis

        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except Exception as exc:
        print(f"load: the make-up stack is not running ({exc!r}); run `make up` first", file=sys.stderr)
        return 2
    port = free_port()
    keys_dir = tempfile.mkdtemp(prefix="strata-load-keys-")
    keys_file = Path(keys_dir) / "keys.json"
    keys = {tenant: add_key(keys_file, tenant)[0] for tenant in ("shop", "noisy")}
    env = {**os.environ, "STRATA_PORT": str(port), "STRATA_WORKERS": "2", "STRATA_REDIS_URL": REDIS_URL,
           "STRATA_UPSTREAM_URL": VLLM_URL + "/v1", "STRATA_LOG_LEVEL": "warning", "STRATA_KEYS_FILE": str(keys_file)}
    strata = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/health", timeout=120)
        stats, acknowledged, elapsed, known, hit_times = asyncio.run(
            run(url + "/v1/chat/completions", model, args.clients, args.seconds, keys, args.noisy_clients))
        checked, lost = asyncio.run(lost_writes(url + "/v1/chat/completions", acknowledged, keys["shop"]))
        rss = peak_rss_mb(strata)
    finally:
        strata.terminate()
        strata.wait(timeout=60)
        keys_file.unlink(missing_ok=True)
        os.rmdir(keys_dir)
    hit_times.sort()
    p50 = statistics.median(hit_times) * 1000 if hit_times else float("nan")
    p99 = hit_times[min(len(hit_times) - 1, int(len(hit_times) * 0.99))] * 1000 if hit_times else float("nan")
    noisy = sum(n for key, n in stats.items() if key.startswith("noisy"))
    total = sum(stats.values())
    server_errors = sum(n for key, n in stats.items() if " 5" in key and not key.startswith("noisy"))
    transport = sum(n for key, n in stats.items() if "transport-error" in key)
    command = ("make bench" if (args.clients, args.seconds, args.noisy_clients) == (16, 60, 2)
               else f"python -m bench.load --clients {args.clients} --seconds {args.seconds} --noisy-clients {args.noisy_clients}")
    lines = [
        "# Reliability under load",
        "",
        "Written by the load test in `bench/load.py`; the numbers are measured, never typed in.",
        "",
        f"- Command: `{command}` (the load part; needs the `make up` stack: Redis Stack on 6380, vLLM on 8000)",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {machine()}",
        f"- Service: Strata with 2 uvicorn workers on loopback, in front of the `make up` vLLM ({model}, CPU) and Redis Stack",
        f"- Load: {args.clients} concurrent clients (httpx, a separate process) for {elapsed:.0f} s; mix per request: 50% known"
        " questions, 15% paraphrases, 10% new questions (misses that reach the model), 15% streaming (half new), 10% invalid",
        f"- Known questions cached by the warm-up: {len(known)} of {len(KNOWN)} (the others did not finish within max_tokens)",
        f"- Meanwhile a second tenant (`noisy`, {args.noisy_clients} clients) sent {noisy:,} questions of 65,000 Chinese"
        " characters each (served exact-only: longer than `STRATA_SEMANTIC_MAX_QUESTION_CHARS`; vLLM refuses them as"
        " longer than its context, and its 400 is passed on)",
        f"- The shop tenant's exact hits during the flood: {len(hit_times):,}, p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        f" (target: p99 under 1 s: {'met' if p99 < 1000 else 'MISSED'})",
        "",
        "| requests | req/s | 5xx | transport errors | acknowledged misses re-checked | lost writes | peak RSS (2 workers) |",
        "|---|---|---|---|---|---|---|",
        f"| {total:,} | {total / elapsed:,.0f} | {server_errors} | {transport} | {checked} | {lost} | {rss:.0f} MB |",
        "",
        "Outcomes (kind, status, X-Cache):",
        "",
        "| outcome | count |",
        "|---|---|",
        *[f"| {key} | {n:,} |" for key, n in sorted(stats.items())],
        "",
        "An acknowledged write is a miss answered 200 with `finish_reason: stop` (streams: ending in"
        " `[DONE]`); after the run each is asked again and must be served from the cache.",
        "",
    ]
    out = Path(args.out)
    # The faults section (bench.faults) is another command's: kept as it is.
    previous = out.read_text(encoding="utf-8") if out.exists() else ""
    faults = previous[previous.find(FAULTS_BEGIN):] if FAULTS_BEGIN in previous else ""
    out.write_text("\n".join(lines) + ("\n" + faults if faults else ""), encoding="utf-8")
    print("\n".join(lines))
    return 0 if server_errors == 0 and lost == 0 and transport == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
