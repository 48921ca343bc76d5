"""Strata's own time on a miss, this source tree against another one, side by side.

    python -m bench.miss_ab --other /tmp/base [--rounds 4] [--duration 5]

The machine's speed drifts by up to a factor of two within an hour, so two revisions are only
compared running at the same time: each arm (a Redis Stack, the stub upstream and one Strata
worker, all its own, Strata started from its source tree) serves misses in turns, ABBA, and
each turn reports the p50 of ``strata_miss_overhead_seconds`` over that turn alone (the time a
miss spends in Strata outside the upstream call, measured inside Strata) and wrk's end-to-end
p50 (the stub upstream's own time included). Category ``verified`` of bench/policy.yaml (exact
and semantic lookups, the embedding, the write-back), every request a question never asked.
Make the other tree with ``git worktree add /tmp/base <commit>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from bench.run import CATEGORIES, ROOT, free_port, own_redis, semantic_pairs, unique_questions, wait_for, wrk

METRIC = "strata_miss_overhead_seconds"


@contextmanager
def arm(tree: Path, redis_url: str) -> Iterator[str]:
    """The stub upstream and one Strata worker started from ``tree``; yields Strata's URL."""
    upstream_port, strata_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.stub_upstream", str(upstream_port)], cwd=ROOT)
    env = {**os.environ, "STRATA_PORT": str(strata_port), "STRATA_WORKERS": "1", "STRATA_REDIS_URL": redis_url,
           "STRATA_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}/v1", "STRATA_LOG_LEVEL": "warning",
           "STRATA_POLICY_FILE": str(ROOT / "bench" / "policy.yaml")}
    strata = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=tree, env=env)
    try:
        url = f"http://127.0.0.1:{strata_port}"
        wait_for(f"http://127.0.0.1:{upstream_port}/v1/models")
        wait_for(url + "/health")
        yield url
    finally:
        for process in (strata, upstream):
            process.terminate()
            process.wait(timeout=30)


def buckets(url: str) -> list[tuple[float, float]]:
    """The cumulative buckets (upper bound, count) of the overhead histogram."""
    rows = []
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(METRIC + "_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            rows.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
    return sorted(rows)


def p50_between(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The median (linear within a bucket) of the observations made between two readings."""
    counts = [(bound, a - b) for (bound, a), (_, b) in zip(after, before, strict=True)]
    rank, lower, below = counts[-1][1] / 2, 0.0, 0.0
    for bound, count in counts:
        if count >= rank:
            share = (rank - below) / (count - below) if count > below else 0.0
            return lower + share * ((bound if bound != float("inf") else lower) - lower)
        lower, below = bound, count
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, help="the other source tree (a git worktree)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=5, help="seconds per turn")
    args = parser.parse_args()
    pairs, _ = semantic_pairs(300)
    questions = unique_questions(pairs, 40_000)
    trees = {"this": ROOT, "other": Path(args.other).resolve()}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    with ExitStack() as stack:
        urls = {}
        for name, tree in trees.items():
            urls[name] = stack.enter_context(arm(tree, stack.enter_context(own_redis())))
            wrk(urls[name], questions[:500], 1, 2, "warm-up", CATEGORIES["semantic"])
        turn = 0
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                turn += 1
                before = buckets(urls[name])
                run = wrk(urls[name], questions[turn * 3000:(turn + 1) * 3000], 1, args.duration, "miss",
                          CATEGORIES["semantic"])
                own = p50_between(before, buckets(urls[name])) * 1000
                results[name].append((own, run.p50_ms))
                print(f"round {round_ + 1} {name:5s} ({trees[name]}): Strata's own p50 {own:.2f} ms, end to end p50 "
                      f"{run.p50_ms:.2f} ms, {run.requests:,} requests {run.outcomes}", flush=True)
    for name, rows in results.items():
        print(f"{name:5s} ({trees[name]}): median over turns: own {statistics.median(r[0] for r in rows):.2f} ms, "
              f"end to end {statistics.median(r[1] for r in rows):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
