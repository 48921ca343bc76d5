"""How fast the model server answers one request at a time: latency, TTFT and decode rate.

    python -m bench.upstream_speed [--url http://127.0.0.1:8000/v1] [--max-tokens 64]

Streams a few customer-service questions, one after the other, straight to the server (no
Strata), and prints the medians. The model is the server's first one. Used to compare the
servers a profile could run on (docs/OPERATIONS.md, `make up MODEL=...`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

SYSTEM_PROMPT = "You are a helpful customer-service assistant for an online shop. Answer in two sentences."
QUESTIONS = (
    "How do I reset my password?",
    "Where is my parcel?",
    "Can I change my delivery address?",
    "How do I cancel my order?",
    "Do you ship abroad?",
)


def measure(client: openai.OpenAI, model: str, question: str, max_tokens: int) -> tuple[float, float, float]:
    """One streamed answer: (latency s, time to first token s, decode tokens/s after the first)."""
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
    return ended - started, first - started, (tokens - 1) / (ended - first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    runs = [measure(client, model, q, args.max_tokens) for q in QUESTIONS]
    latency, ttft, rate = (statistics.median(values) for values in zip(*runs, strict=True))
    print(f"{model} at {args.url}: {len(runs)} requests, max_tokens {args.max_tokens}: latency median "
          f"{latency:.2f} s, TTFT median {ttft:.2f} s, decode median {rate:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
