"""Every stream and seed of issue #33 with each simulated reader, in one table.

    python -m bench.reader_matrix --streams clinc3000 bank3000 zh1500 --seeds 0 1 2 3 4 [--jobs 2]

Runs ``strata replay run --simulate`` on ``.run/replay/<stream>-s<seed>.jsonl`` (built with
``strata replay build`` when missing) with no reader, the oracle, and the oracle wrong on a share
of its pairs (``--judge-error``), each a process of its own with its own Redis Stack, keeps each
report as JSON in ``--out``, and prints a Markdown table: semantic hits and their wrong share,
the worst window of ``--window`` requests after the first ``--skip`` (issue #33's window target),
and the hits the reader served. Reports already in ``--out`` are read, not run again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

REPLAY = Path(".run/replay")
STRATA = [sys.executable, "-m", "app.cli"]
# How each stream is built (strata replay build), by its name's prefix.
BUILDS = {
    "clinc": ["--source", "clinc"],
    "bank": ["--source", "clinc", "--domain", "bank"],
    "zh": ["--source", "faqset", "--file", "bench/data/zh_shop_bank_faq.yaml"],
}
READER_VERDICT = "reader_accepted"


@dataclass(frozen=True)
class Arm:
    """One reader configuration of the replay."""

    name: str
    args: tuple[str, ...]


def arms(error: float) -> list[Arm]:
    return [Arm("none", ()), Arm("oracle", ("--judge", "oracle")),
            Arm(f"oracle wrong on {error:.0%}", ("--judge", "oracle", "--judge-error", str(error)))]


def stream_file(stream: str, seed: int) -> Path:
    path = REPLAY / f"{stream}-s{seed}.jsonl"
    if not path.exists():
        prefix = next(p for p in BUILDS if stream.startswith(p))
        requests = "".join(ch for ch in stream if ch.isdigit())
        subprocess.run([*STRATA, "replay", "build", *BUILDS[prefix], "--out", str(path), "--requests", requests,
                        "--seed", str(seed)], check=True, capture_output=True)
    return path


def run(stream: str, seed: int, arm: Arm, category: str, out: Path) -> dict[str, Any]:
    report = out / f"{stream}-s{seed}-{arm.name.replace(' ', '_').replace('%', 'pct')}.json"
    if not report.exists():
        env = {k: v for k, v in os.environ.items() if k not in ("STRATA_JUDGE_URL", "STRATA_READER_EMBEDDER")}
        subprocess.run([*STRATA, "replay", "run", "--simulate", "--stream", str(stream_file(stream, seed)),
                        "--category", category, "--json", str(report), *arm.args],
                       check=True, capture_output=True, env=env)
    result: dict[str, Any] = msgspec.json.decode(report.read_bytes())
    return result


def worst_window(report: dict[str, Any], window: int, skip: int) -> float:
    """The highest wrong share of semantic hits in a window of ``window`` requests after ``skip``."""
    wrong_at = [hit["index"] for hit in report["wrong_hits"] if hit["layer"] == "semantic-hit"]
    worst = 0.0
    for start, row in zip(range(0, report["requests"], window), report["windows"], strict=False):
        if start < skip:
            continue
        served = round(row["semantic"] * min(window, report["requests"] - start))
        wrong = sum(1 for i in wrong_at if start <= i < start + window)
        worst = max(worst, wrong / served if served else 0.0)
    return worst


def row(stream: str, seed: int, arm: Arm, report: dict[str, Any], window: int, skip: int) -> str:
    served = round(report["layers"]["semantic-hit"] * report["requests"])
    wrong = report["semantic_wrong"]
    reader = report["semantic_by_verdict"].get(READER_VERDICT, {"served": 0, "wrong": 0})
    return (f"| {stream} | {seed} | {arm.name} | {report['layers']['semantic-hit']:.1%} ({served}) | "
            f"{wrong} ({wrong / served if served else 0:.2%}) | {report['layers']['exact-hit']:.1%} | "
            f"{worst_window(report, window, skip):.2%} | {reader['served']} ({reader['wrong']}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", nargs="+", default=["clinc3000", "bank3000", "zh1500"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--category", default="faq")
    parser.add_argument("--error", type=float, default=0.2, help="the noisy oracle's share of wrong verdicts")
    parser.add_argument("--jobs", type=int, default=1, help="replays at once (each has its own Redis Stack)")
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--skip", type=int, default=1000, help="requests before the windows that count")
    parser.add_argument("--out", type=Path, default=REPLAY / "matrix")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(stream, seed, arm) for stream in args.streams for seed in args.seeds for arm in arms(args.error)]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        reports = list(pool.map(lambda r: run(*r, args.category, args.out), runs))
    print(f"| stream | seed | reader | semantic hits | wrong | exact | worst window of {args.window} after "
          f"{args.skip} | reader's hits (wrong) |")
    print("|---|---|---|---|---|---|---|---|")
    for (stream, seed, arm), report in zip(runs, reports, strict=True):
        print(row(stream, seed, arm, report, args.window, args.skip))


if __name__ == "__main__":
    main()
