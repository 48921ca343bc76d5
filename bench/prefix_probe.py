"""L3 probe: does the model server's prefix cache reuse a stable system prompt?

Sends requests that share one system prompt of about N tokens (different questions) and prints
each one's latency with the server's prefix-cache counters before and after.

    python -m bench.prefix_probe [--url http://127.0.0.1:8000] [--words 150] [--requests 3]
"""

from __future__ import annotations

import argparse
import time

import httpx

from app.upstream_metrics import PREFIX_CACHE_NAMES, read_prefix_cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--words", type=int, default=150, help="size of the shared system prompt, in words")
    parser.add_argument("--requests", type=int, default=3)
    args = parser.parse_args()
    with httpx.Client(base_url=args.url, timeout=120) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        system = " ".join(f"rule{i % 50} applies to every answer;" for i in range(args.words // 5))
        for i in range(args.requests):
            before = read_prefix_cache(client.get("/metrics").text)
            started = time.perf_counter()
            body = {"model": model, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}?"}]}
            usage = client.post("/v1/chat/completions", json=body).json()["usage"]
            seconds = time.perf_counter() - started
            after = read_prefix_cache(client.get("/metrics").text)
            hits = after.hits - before.hits if after and before else None
            queried = after.queries - before.queries if after and before else None
            print(f"request {i}: {seconds:.3f} s, prompt tokens {usage['prompt_tokens']}, "
                  f"prefix-cache hits {hits} of {queried} queried tokens")
        found = read_prefix_cache(client.get("/metrics").text)
        print(f"metric names: {found.names if found else 'none of ' + str(PREFIX_CACHE_NAMES)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
