"""What any rule on similarity and margin could serve on a stream, with hindsight.

    python -m bench.semantic_ceiling --stream .run/replay/clinc3000.jsonl [--bound 0.01]

Embeds every question of a replay stream once (the service's embedder), replays an idealised
cache in memory (every question asked before is cached, with its label), and for each request
that is not an exact repeat finds the nearest cached question, its similarity and its margin over
the nearest question of another label among the 8 nearest. Then, knowing which would be right:

- the best single threshold on a score (similarity, or similarity plus half the margin, as
  `app/cache/learning/learner.py` scores), chosen on the stream itself: the most requests served with at
  most ``--bound`` of them wrong;
- the best threshold per label of the nearest question (per entry, as vCache learns them),
  also chosen with hindsight; then with each question counted with its repeats (a question
  served semantically is served so again), and serving only once the nearest label had been
  met ``--evidence`` times (no rule learnt per entry can serve before it has observations).

Both are ceilings, not policies: no deployment knows the labels in advance. They say how much
reach a learning rule could buy over a fixed threshold on this embedder and stream.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from app.embed import load_encoder
from app.replay.streams import read_stream

NEIGHBOURS = 8
FLOOR = 0.6


def best_threshold(scores: np.ndarray, right: np.ndarray, bound: float, weights: np.ndarray | None = None) -> int:
    """Most items served (highest scores first) with the wrong share at most ``bound``; with
    ``weights``, items count that many times (a question and its repeats)."""
    order = np.argsort(-scores)
    weight = np.ones(len(order)) if weights is None else weights[order]
    wrong = np.cumsum((1 - right[order]) * weight)
    served = np.cumsum(weight)
    within = np.nonzero(wrong <= bound * served)[0]
    return round(float(served[within.max()])) if len(within) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--bound", type=float, default=0.01)
    parser.add_argument("--evidence", type=int, default=5,
                        help="questions met before a per-label threshold may serve (faq's entry_confirmations)")
    parser.add_argument("--embedder", default="use-multilingual")
    args = parser.parse_args()
    stream = read_stream(Path(args.stream))
    texts = sorted({r.text for r in stream})
    encoder = load_encoder(args.embedder)
    vectors = np.concatenate([encoder.encode(texts[i:i + 64]) for i in range(0, len(texts), 64)])
    row = {t: i for i, t in enumerate(texts)}
    cached: list[int] = []
    labels: list[str] = []
    seen: set[str] = set()
    similarity, margin, right, nearest_label = [], [], [], []
    fresh_texts: list[str] = []
    # How many earlier questions had a question of this label as their nearest: the most
    # observations an entry of that label could have had when this one arrived.
    met_before: list[int] = []
    met: dict[str, int] = defaultdict(int)
    exact = 0
    for request in stream:
        if request.text in seen:
            exact += 1
            continue
        if cached:
            sims = vectors[cached] @ vectors[row[request.text]]
            order = np.argsort(-sims)[:NEIGHBOURS]
            first = order[0]
            others = [sims[j] for j in order if labels[j] != labels[first]]
            similarity.append(float(sims[first]))
            margin.append(float(sims[first] - max(max(others) if others else FLOOR, FLOOR)))
            right.append(labels[first] == request.label)
            nearest_label.append(labels[first])
            fresh_texts.append(request.text)
            met_before.append(met[labels[first]])
            met[labels[first]] += 1
        seen.add(request.text)
        cached.append(row[request.text])
        labels.append(request.label)
    sim, gap, ok = np.array(similarity), np.maximum(np.array(margin), 0), np.array(right, dtype=float)
    total = len(stream)
    print(f"{args.stream}: {total} requests, {exact} exact repeats, {len(ok)} with a nearest cached question, "
          f"{int(ok.sum())} of them of the same label (a perfect semantic cache: {ok.sum() / total:.1%} of requests)")
    for name, score in (("similarity", sim), ("similarity + half the margin", sim + 0.5 * gap)):
        served = best_threshold(score, ok, args.bound)
        print(f"  best single threshold on {name}: {served} served, {served / total:.1%} of requests")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, label in enumerate(nearest_label):
        groups[label].append(i)
    score = sim + 0.5 * gap
    per_label = sum(best_threshold(score[idx], ok[idx], args.bound) for idx in map(np.array, groups.values()))
    print(f"  best threshold per label of the nearest question: {per_label} served, {per_label / total:.1%} of requests")
    # A question served semantically is served the same way when it is asked again (its repeats
    # are semantic hits too), so each first asking counts with its repeats.
    asked = Counter(request.text for request in stream)
    weights = np.array([asked[text] for text in fresh_texts], dtype=float)
    repeated = sum(best_threshold(score[idx], ok[idx], args.bound, weights[idx]) for idx in map(np.array, groups.values()))
    print(f"  the same, each question counted with its repeats: {repeated} served, {repeated / total:.1%} of requests")
    perfect = int((weights * ok).sum())
    print(f"  a perfect semantic cache, each question counted with its repeats: {perfect}, {perfect / total:.1%} of requests")
    # A rule that learns per entry cannot serve before the entry has been met: the same
    # ceiling, serving only questions whose nearest label had been met --evidence times before.
    informed = np.array(met_before) >= args.evidence
    learnt = 0
    for idx in map(np.array, groups.values()):
        keep = idx[informed[idx]]
        if len(keep):
            learnt += best_threshold(score[keep], ok[keep], args.bound, weights[keep])
    print(f"  the same, only once the nearest label had been met {args.evidence} times before: "
          f"{learnt} served, {learnt / total:.1%} of requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
