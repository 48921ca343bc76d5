"""The LLM judge on pairs of one stream (issue #33): 25 pairs of one intent and 25 of two of the
stream's intents, read by app/cache/readers/judge.py against an OpenAI-compatible endpoint.

    make judge-up
    python -m bench.judge_pairs [--stream .run/replay/bank3000-s0.jsonl] [--url http://127.0.0.1:8002/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

from app.cache.readers.base import ReadPair
from app.cache.readers.judge import LLMJudge

PAIRS = 25


def pairs(stream: str, seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(same-intent pairs, other-intent pairs) drawn from a stream's labelled questions."""
    by_label: dict[str, list[str]] = {}
    with open(stream, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            by_label.setdefault(row["label"], []).append(row["text"])
    draws = random.Random(seed)
    labels = sorted(label for label, texts in by_label.items() if len(set(texts)) > 1)
    same, other = [], []
    for _ in range(PAIRS):
        label = draws.choice(labels)
        first, second = draws.sample(sorted(set(by_label[label])), 2)
        same.append((first, second))
        another = draws.choice([x for x in labels if x != label])
        other.append((draws.choice(by_label[label]), draws.choice(by_label[another])))
    return same, other


async def judge(url: str, same: list[tuple[str, str]], other: list[tuple[str, str]]) -> None:
    reader = LLMJudge.on_endpoint(url, timeout_s=30)
    latencies: list[float] = []
    for kind, batch in (("same-intent", same), ("other-intent", other)):
        verdicts = []
        for asked, cached in batch:
            started = time.perf_counter()
            verdicts.append(await reader.read(ReadPair(asked=asked, cached=cached)))
            latencies.append(time.perf_counter() - started)
        print(f"{kind} pairs: yes {verdicts.count(True)}, no {verdicts.count(False)}, no verdict {verdicts.count(None)}")
    print(f"{reader.name}: latency p50 {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s, "
          f"{len(latencies)} pairs")
    await reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", default=".run/replay/bank3000-s0.jsonl")
    parser.add_argument("--url", default=os.environ.get("STRATA_JUDGE_URL", "http://127.0.0.1:8002/v1"))
    args = parser.parse_args()
    asyncio.run(judge(args.url, *pairs(args.stream)))


if __name__ == "__main__":
    main()
