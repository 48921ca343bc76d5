"""Where Strata's time on a miss goes: each step of the request path timed in process.

    python -m bench.miss_breakdown [--requests 300] [--category verified]

Starts its own Redis Stack and the tests' fake upstream, serves Strata in process (ASGI, no
socket), sends questions nobody asked before (every one a miss), and prints the median time of
each step; nested steps are included in their parents (the semantic lookup holds the embedding,
the KNN query and the verification). The first 50 requests warm up and are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

from app.asgi import create_app
from app.cache import exact, layered, semantic
from app.replay.simulate import ServerThread, own_redis_stack
from app.settings import Settings
from app.singleflight import SingleFlight
from app.token_caps import TokenCaps
from app.upstream import Upstream
from bench.stub_upstream import stub_app

WARM_UP = 50
STEPS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (layered.LayeredCache, ("lookup", "store")),
    (exact.ExactCache, ("lookup", "store")),
    (semantic.SemanticCache, ("lookup", "vector", "candidates", "store")),
    (SingleFlight, ("coalesce",)),
    (TokenCaps, ("cap", "observe")),
    (Upstream, ("complete",)),
)


def timed(timings: dict[str, list[float]], owner: type, name: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            timings[f"{owner.__name__}.{name}"].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--category", default="verified", help="a category of bench/policy.yaml")
    parser.add_argument("--window-ms", type=float, default=None, help="STRATA_EMBED_BATCH_WINDOW_MS (default: the setting's)")
    args = parser.parse_args()
    timings: dict[str, list[float]] = collections.defaultdict(list)
    for owner, names in STEPS:
        for name in names:
            timed(timings, owner, name)
    words = ("refund invoice parcel order delivery account password card payment address return exchange price "
             "shipping store opening closing help phone email coupon warranty size colour stock").split()
    rng = random.Random(0)
    with own_redis_stack() as redis_url, ServerThread(stub_app()) as server:
        flat: dict[str, object] = {"redis_url": redis_url, "upstream_url": server.url + "/v1", "log_level": "warning",
                                   "policy_file": "bench/policy.yaml", "semantic_enabled": True}
        if args.window_ms is not None:
            flat["embed_batch_window_ms"] = args.window_ms
        settings = Settings.from_flat(flat)
        app = create_app(settings)

        async def go() -> list[float]:
            async with app.lifespan(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://strata") as client:
                totals = []
                for i in range(args.requests):
                    question = " ".join(rng.choice(words) for _ in range(7)) + f" ({i})?"
                    started = time.perf_counter()
                    response = await client.post("/v1/chat/completions", headers={"X-Cache-Category": args.category},
                                                 json={"model": "fake-model", "messages": [{"role": "user", "content": question}]})
                    totals.append(time.perf_counter() - started)
                    assert response.headers["x-cache"] == "miss", response.headers
                # The write-back worked: the last question asked again is an exact hit.
                again = await client.post("/v1/chat/completions", headers={"X-Cache-Category": args.category},
                                          json={"model": "fake-model", "messages": [{"role": "user", "content": question}]})
                assert again.headers["x-cache"] == "exact-hit", again.headers
                return totals

        totals = asyncio.run(go())
    counted = totals[WARM_UP:]
    upstream_s = timings["Upstream.complete"][WARM_UP:]
    own = [t - u for t, u in zip(counted, upstream_s, strict=True)]
    window = settings.semantic.embed_batch_window_ms
    print(f"{len(counted)} misses in category {args.category!r}, embedding batch window {window:g} ms; medians in ms")
    print(f"  {'whole request':38s} {statistics.median(counted) * 1000:6.2f}")
    print(f"  {'Strata outside the upstream call':38s} {statistics.median(own) * 1000:6.2f}")
    for name, values in sorted(timings.items(), key=lambda kv: -statistics.median(kv[1][WARM_UP:] or kv[1])):
        print(f"  {name:38s} {statistics.median(values[WARM_UP:] or values) * 1000:6.2f}   ({len(values)} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
