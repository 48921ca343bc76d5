"""How fast the model server answers: latency, TTFT and decode rate, one request at a time or many.

    python -m bench.upstream_speed [--url http://127.0.0.1:8000/v1] [--max-tokens 64] [--concurrency N]

Streams a few customer-service questions straight to the server (no Strata), one after the other,
and prints the medians. The model is the server's first one. Used to compare the servers a
profile could run on (docs/OPERATIONS.md, `make up MODEL=...`). With ``--concurrency N`` it then
sends N at once, ``--rounds`` times, and prints their medians and the completion tokens per second
of all of them together: what a KV setting changes in the requests served side by side (issue #34).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import openai

SYSTEM_PROMPT = "You are a helpful customer-service assistant for an online shop. Answer in two sentences."
QUESTIONS = (
    "How do I reset my password?",
    "Where is my parcel?",
    "Can I change my delivery address?",
    "How do I cancel my order?",
    "Do you ship abroad?",
)


def measure(client: openai.OpenAI, model: str, question: str, max_tokens: int) -> tuple[float, float, float, int]:
    """One streamed answer: (latency s, time to first token s, decode tokens/s after the first,
    completion tokens)."""
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    stream = client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    ended = time.perf_counter()
    if first is None or tokens < 2:
        raise SystemExit(f"{question!r}: the server streamed no answer")
    return ended - started, first - started, (tokens - 1) / (ended - first), tokens


def side_by_side(client: openai.OpenAI, model: str, max_tokens: int, concurrency: int, rounds: int) -> str:
    """``concurrency`` requests at once, ``rounds`` times: medians per request, tokens/s of all."""
    runs: list[tuple[float, float, float, int]] = []
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for _ in range(rounds):
            questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(concurrency)]
            runs += pool.map(lambda q: measure(client, model, q, max_tokens), questions)
    wall = time.perf_counter() - started
    latency, ttft, rate = (statistics.median(r[i] for r in runs) for i in range(3))
    return (f"{concurrency} at once, {rounds} rounds ({len(runs)} requests): latency median {latency:.2f} s, "
            f"TTFT median {ttft:.2f} s, decode median {rate:.1f} tokens/s per request, "
            f"{sum(r[3] for r in runs) / wall:.1f} completion tokens/s together")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=0, help="then this many requests at once (0: not)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    runs = [measure(client, model, q, args.max_tokens) for q in QUESTIONS]
    latency, ttft, rate = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"{model} at {args.url}: {len(runs)} requests, max_tokens {args.max_tokens}: latency median "
          f"{latency:.2f} s, TTFT median {ttft:.2f} s, decode median {rate:.1f} tokens/s")
    if args.concurrency > 0:
        print(side_by_side(client, model, args.max_tokens, args.concurrency, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
