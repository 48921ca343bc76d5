"""Calibrate the second embedder's threshold (``STRATA_READER_THRESHOLD``) on the shared labelled
pairs, never on a replay stream: QQP with hard negatives (English, its train split) and AFQMC's
train file (Chinese), a deterministic sample of each. For each, and for the pairs USE puts in the
grey zone, it prints precision and recall of "the reader says yes" by threshold, and the lowest
threshold whose precision's Wilson lower bound (95%) reaches the target on both.

    python -m bench.reader_threshold --model .run/models/embeddinggemma-300m [--pairs 1500] [--target 0.95]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from pathlib import Path

import numpy as np

from app.cache.readers.embedder import EmbedderReader, LocalModelVectors
from app.calibrate.evaluate import similarities
from app.calibrate.pairs import Pair, read_pairs
from app.calibrate.qqp import qqp_hard
from app.embed import UniversalSentenceEncoderOnnx

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
GREY_ZONE = (0.70, 0.95)  # USE's scores where the adaptive decision refuses most candidates


def wilson_lower(hits: int, total: int, z: float = 1.96) -> float:
    if total == 0:
        return 0.0
    p = hits / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return (centre - spread) / (1 + z * z / total)


def table(name: str, scores: np.ndarray, labels: np.ndarray, thresholds: np.ndarray) -> dict[float, float]:
    print(f"\n{name}: {len(labels)} pairs, {int(labels.sum())} positive")
    print("| threshold | said yes | precision | Wilson lower | recall |\n|---|---|---|---|---|")
    lower = {}
    for t in thresholds:
        yes = scores >= t
        hits, right = int(yes.sum()), int((yes & (labels == 1)).sum())
        lower[float(t)] = wilson_lower(right, hits)
        if hits:
            print(f"| {t:.2f} | {hits} | {right / hits:.3f} | {lower[float(t)]:.3f} | {right / max(1, int(labels.sum())):.3f} |")
    return lower


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".run/models/embeddinggemma-300m")
    parser.add_argument("--pairs", type=int, default=1500, help="pairs sampled from each set (seed 0)")
    parser.add_argument("--target", type=float, default=0.95, help="precision the reader's yes must reach")
    args = parser.parse_args()
    sets: dict[str, list[Pair]] = {
        "QQP hard (train)": qqp_hard(SHARED / "qqp_similar.json", "train"),
        "AFQMC train": read_pairs(SHARED / "afqmc_train.csv"),
    }
    use = UniversalSentenceEncoderOnnx()
    source = LocalModelVectors(args.model)
    reader = EmbedderReader(source, threshold=1.0)
    thresholds = np.round(np.arange(0.60, 0.99, 0.02), 2)
    lowers: list[dict[float, float]] = []
    for name, pairs in sets.items():
        pairs = random.Random(0).sample(pairs, min(args.pairs, len(pairs)))
        labels = np.array([p.label for p in pairs])
        primary = similarities(pairs, use)
        started = time.perf_counter()
        rows = source.encode([text for p in pairs for text in (p.asked, p.cached)])
        per_text = (time.perf_counter() - started) / (2 * len(pairs))
        scores = np.sum(rows[0::2] * rows[1::2], axis=1)
        print(f"\n## {name} ({reader.name}, {per_text * 1000:.1f} ms a text in batches of 32)")
        table("all pairs", scores, labels, thresholds)
        zone = (primary >= GREY_ZONE[0]) & (primary < GREY_ZONE[1])
        lowers.append(table(f"pairs USE scores {GREY_ZONE[0]}-{GREY_ZONE[1]}", scores[zone], labels[zone], thresholds))
    both = [t for t in thresholds if all(lower.get(float(t), 0.0) >= args.target for lower in lowers)]
    print(f"\nlowest threshold at precision >= {args.target} (Wilson lower bound) in the grey zone of both sets: "
          f"{min(both) if both else 'none'}")
    asyncio.run(source.close())


if __name__ == "__main__":
    main()
