"""Which embedder should a team's intent head read with (issue #46)? USE (the deployment's
default) against EmbeddingGemma-300M (`make reader-model`), offline, on the same team files and
streams as ``python -m bench.intents``.

    python -m bench.intent_embedders [--teams bank clinc] [--seeds 0 1]
    python -m bench.intent_embedders --cost     # what reading a question with EmbeddingGemma adds

Three arms: USE alone (the default); EmbeddingGemma alone (its own KNN too); and what
``STRATA_INTENT_EMBEDDER`` serves: the head reads EmbeddingGemma's vectors while the index (its
KNN and floor) stays on USE. For each: the head fitted on the team's train split and calibrated as ``strata intents
load`` does (app/cache/learning/intents.py: held-out folds, a tenth of the intents unknown, the
guards replayed, two fixed sequences at 95%), then the intent rule alone replayed on the test
stream: a question not asked before is served when it and one of its 8 nearest earlier questions
(by the index's vectors, at the floor or above, past the guards) are read as one intent at the threshold; wrong when that
question's label differs or the asker is out of scope. Captured: right ones over what a perfect
cache serves semantically. Only the rule: the other rules and the cache's aliases are not in it.
Vectors are kept in ``.run/vectors`` (by embedder and file) so that a second run embeds nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from app.cache.decision.verify import load_verifier
from app.cache.learning.intents import SoftmaxHead, calibrate
from app.cache.readers.embedder import INTENT_PROMPTS, LocalModelVectors
from app.embed import Encoder, load_encoder
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / ".run" / "replay"
GEMMA = ROOT / ".run" / "models" / "embeddinggemma-300m"
FLOOR = 0.60  # the shipped faq's floor
NEAREST = 8


VECTORS = ROOT / ".run" / "vectors"


def embed(encoder: Encoder | LocalModelVectors, texts: list[str], saved: str) -> tuple[np.ndarray, float]:
    """The texts' vectors (from ``.run/vectors`` when embedded before) and the seconds spent."""
    name = getattr(encoder, "fingerprint", encoder.name)
    path = VECTORS / f"{name.replace('/', '_').replace(':', '_')}-{saved}-{len(texts)}.npy"
    if path.exists():
        return np.load(path), 0.0
    started = time.monotonic()
    vectors = np.concatenate([encoder.encode(texts[i:i + 64]) for i in range(0, len(texts), 64)])
    VECTORS.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors, time.monotonic() - started


def first_askings(asked: list[str], truth: list[str]) -> tuple[np.ndarray, int]:
    """The indices of a stream's questions not asked before (word for word), and how many of them
    a perfect cache serves semantically (their label asked before, not out of scope)."""
    seen_texts: set[str] = set()
    seen_labels: set[str] = set()
    fresh, perfect = [], 0
    for i, (text, tag) in enumerate(zip(asked, truth, strict=True)):
        if text in seen_texts:
            continue
        fresh.append(i)
        perfect += tag in seen_labels and not tag.startswith("oos:")
        seen_texts.add(text)
        seen_labels.add(tag)
    return np.array(fresh), perfect


def reading_cost(questions: int = 160, concurrency: int = 16) -> int:
    """What the head's reading adds to a lookup with EmbeddingGemma as ``STRATA_INTENT_EMBEDDER``
    serves it (batched, 1 torch thread): milliseconds for a question not read before, one at a
    time; then ``concurrency`` callers at once, each question's wait and the questions per second."""
    import asyncio

    from app.cache.readers.embedder import BatchedVectors
    from app.cache.storage.intents import HeadReader

    stream = [json.loads(line)["text"] for line in (REPLAY / "bank-test3000-s0.jsonl").read_text().splitlines()]
    asked = list(dict.fromkeys(stream))[:2 * questions + 10]
    reader = HeadReader(BatchedVectors(LocalModelVectors(str(GEMMA), threads=1, prompts=INTENT_PROMPTS)), "bench")
    unused = np.zeros(1, dtype=np.float32)

    async def timed(text: str) -> float:
        started = time.perf_counter()
        await reader.vector(text, unused)
        return (time.perf_counter() - started) * 1000

    async def measure() -> tuple[list[float], list[float], float]:
        for text in asked[:10]:  # the first calls warm the model
            await timed(text)
        alone = [await timed(text) for text in asked[10:10 + questions]]
        together: list[float] = []
        started = time.perf_counter()
        rest = asked[10 + questions:]
        for i in range(0, len(rest), concurrency):
            together += await asyncio.gather(*(timed(text) for text in rest[i:i + concurrency]))
        return alone, together, len(rest) / (time.perf_counter() - started)

    alone, together, rate = asyncio.run(measure())
    print(f"EmbeddingGemma-300M as the intent embedder, 1 torch thread: one at a time p50 {np.percentile(alone, 50):.1f} ms, "
          f"p90 {np.percentile(alone, 90):.1f} ms ({len(alone)} questions); {concurrency} at once p50 "
          f"{np.percentile(together, 50):.1f} ms, p90 {np.percentile(together, 90):.1f} ms, {rate:.0f} questions/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teams", nargs="+", default=["bank", "clinc"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--cost", action="store_true",
                        help="only time what the head's reading adds to a lookup: one question at a time, as served")
    args = parser.parse_args(argv)
    if not GEMMA.exists():
        print("bench: EmbeddingGemma is not assembled (make reader-model)", file=sys.stderr)
        return 2
    if args.cost:
        return reading_cost()
    verifier = load_verifier(Settings.from_env())
    use = load_encoder("use-multilingual")
    # EmbeddingGemma as STRATA_INTENT_EMBEDDER loads it: with its classification prompt.
    gemma = LocalModelVectors(str(GEMMA), threads=2, prompts=INTENT_PROMPTS)
    # (the head's embedder, the index's): the index's vectors find the neighbours and the floor.
    arms = {"USE multilingual v3": (use, use), "EmbeddingGemma-300M": (gemma, gemma),
            "EmbeddingGemma head, USE index": (gemma, use)}
    print("| team's data | embedder | held-out accuracy | threshold | held-out served (wrong) | stream seed | "
          "intent hits (wrong) | captured | embedding s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for team in args.teams:
        rows = list(csv.DictReader((REPLAY / f"{team}-train.csv").open(encoding="utf-8-sig")))
        texts = [r["text"] for r in rows]
        names = list(dict.fromkeys(r["intent"] for r in rows))
        labels = np.array([names.index(r["intent"]) for r in rows])
        for label, (encoder, index) in arms.items():
            vectors, spent = embed(encoder, texts, f"{team}-train")
            near_train = vectors if index is encoder else embed(index, texts, f"{team}-train")[0]
            calibration = calibrate(vectors, labels, len(names), 0.01, FLOOR, near=near_train,
                                    refused=lambda a, b, said=texts: verifier.guard(said[a], said[b]) is not None)
            head = SoftmaxHead(n_classes=len(names)).fit(vectors, labels)
            for seed in args.seeds:
                stream = [json.loads(line) for line in (REPLAY / f"{team}-test3000-s{seed}.jsonl").read_text().splitlines()]
                asked = [r["text"] for r in stream]
                truth = [r["label"] for r in stream]
                x, spent_stream = embed(encoder, asked, f"{team}-s{seed}")
                near = x if index is encoder else embed(index, asked, f"{team}-s{seed}")[0]
                read, sure = head.read(x)
                order, perfect = first_askings(asked, truth)
                served = wrong = right = 0
                t = calibration.threshold
                for i in order:
                    earlier = order[order < i]
                    if sure[i] < t or not len(earlier):
                        continue
                    similarity = near[earlier] @ near[i]
                    nearest = earlier[np.argsort(-similarity)[:NEAREST]]
                    match = [j for j in nearest if near[j] @ near[i] >= FLOOR and verifier.guard(asked[i], asked[j]) is None
                             and read[j] == read[i] and sure[j] >= t]
                    if not match:
                        continue
                    served += 1
                    if truth[match[0]] != truth[i] or truth[i].startswith("oos:"):
                        wrong += 1
                    else:
                        right += 1
                print(f"| {team} train ({len(texts):,}) | {label} | {calibration.accuracy:.1%} | {t:.3f} | "
                      f"{calibration.served_share:.1%} ({calibration.held_out_wrong:.2%}) | {seed} | {served} ({wrong}) | "
                      f"{right / max(1, perfect):.2f} | {spent:.0f} + {spent_stream:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
