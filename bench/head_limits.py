"""What limits the default (USE) intent head's reach (issue #46; docs/QUALITY.md, "What limits the
USE head's reach"). Offline, on the team files of ``python -m bench.intents`` (``.run/replay``),
vectors kept in ``.run/vectors`` as ``bench.intent_embedders`` keeps them.

    python -m bench.head_limits beyond [--teams bank clinc]       # the rule looking beyond the band
    python -m bench.head_limits sources [--teams clinc]            # where the held-out wrong readings come from
    python -m bench.head_limits confidences [--teams bank clinc] [--mlp]   # other confidences, out-of-scope gates
    python -m bench.head_limits pairs [--teams bank clinc]         # where a prior on similarity alone could start
    python -m bench.head_limits ceiling [--teams bank clinc]       # the most the head could capture, threshold in hindsight

``beyond``: each team file calibrated as ``strata intents load`` does, in the band only and beyond
it, then the intent rule alone replayed on the test streams (s0-s2), as ``bench.intent_embedders``
replays it. ``sources``: the load's held-out folds, per threshold, the wrong readings split into
phrasings of the hidden intents (standing for out-of-scope questions) and label mismatches.
``confidences``: the same folds, each phrasing read once (no neighbours), and for each way of
ranking the readings the largest share of phrasings served at 1% wrong in hindsight, an upper
bound on what any calibration of that ranking could certify. ``pairs``: among every pair of the
team's phrasings at a cosine of at least t, the share of two intents (no guards): where an
adaptive category's prior (``accept_above``) could start, read on the team's own file.
``ceiling``: the head fitted on the whole team file, the intent rule alone on the test streams
(s0-s2), each cached question's first hit checked as shipped, its threshold chosen on each stream
itself (a cheat no calibration can do): the most it
captures with at most 1% of its hits wrong, the rule looking in the band (8 nearest at the floor,
as served) or at every earlier question read as the intent (an intent-level cache, the most
generous), or as an intent-keyed cache whose cached side is read perfectly (the asked question's
reading alone decides: an upper bound on any rule), with the stream's out-of-scope questions and
without them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from collections.abc import Callable

import numpy as np

from app.cache.decision.verify import load_verifier
from app.cache.learning.intents import (
    EPOCHS,
    OF_INTENT,
    UNKNOWN_SHARE,
    SoftmaxHead,
    calibrate,
    folds_for,
    held_out_folds,
    rule_outcomes,
)
from app.embed import load_encoder
from app.settings import Settings
from bench.intent_embedders import FLOOR, NEAREST, REPLAY, embed, first_askings

BOUND = 0.01
SOURCES_THRESHOLDS = (0.8, 0.9, 0.95, 0.978, 0.99)
GATE_QUANTILES = (0.02, 0.05, 0.10)
PRIOR_STARTS = (0.85, 0.88, 0.90, 0.92, 0.95)
HEADERS = {
    "beyond": "| team | the rule looks at | threshold | held-out served (wrong) | captured, s0 / s1 / s2 |\n"
              "|---|---|---|---|---|",
    "sources": "| team | threshold | held-out served | wrong | of hidden intents | label mismatches (share of the rest) |\n"
               "|---|---|---|---|---|---|",
    "confidences": "| team | confidence | most served at 1% wrong (hindsight) |\n|---|---|---|",
    "ceiling": "| team | stream | out of scope in it | the rule looks at | captured at the load's threshold (wrong) | "
               "most captured at <= 1% wrong, threshold in hindsight (wrong) | threshold |\n|---|---|---|---|---|---|---|",
    "pairs": "| team's file | pairs at t = " + " | ".join(f"{t:.2f}" for t in (PRIOR_STARTS)) + " |\n|---|"
             + "---|" * len(PRIOR_STARTS),
}


def most_served(score: np.ndarray, misread: np.ndarray, unknown: np.ndarray, eligible: np.ndarray,
                bound: float = BOUND) -> float:
    """The largest share of all phrasings a threshold on ``score`` serves (among the ``eligible``)
    with at most ``bound`` of them wrong (misread, or of an intent the head did not know), in
    hindsight: the threshold is picked knowing the labels."""
    wrong = unknown | misread
    ranked = np.argsort(-np.where(eligible, score, -np.inf), kind="stable")
    ranked = ranked[eligible[ranked]]
    share = np.cumsum(wrong[ranked]) / np.arange(1, len(ranked) + 1)
    within = np.flatnonzero(share <= bound)
    return (within.max() + 1) / len(score) if len(within) else 0.0


def two_intent_shares(vectors: np.ndarray, labels: np.ndarray, starts: tuple[float, ...],
                      block: int = 1000) -> list[tuple[int, float]]:
    """For each start t: how many pairs of phrasings have a cosine of at least t, and the share of
    them whose two phrasings are of two intents. Each unordered pair counts once; in blocks, so
    15,000 phrasings never need their whole similarity matrix at once."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    found, mixed = np.zeros(len(starts), dtype=np.int64), np.zeros(len(starts), dtype=np.int64)
    for first in range(0, len(unit), block):
        similar = unit[first:first + block] @ unit.T
        rows = np.arange(similar.shape[0])
        similar[rows[:, None] + first >= np.arange(len(unit))[None, :]] = -np.inf  # each pair once
        for k, start in enumerate(starts):
            row, column = np.nonzero(similar >= start)
            found[k] += len(row)
            mixed[k] += int(np.count_nonzero(labels[first + row] != labels[column]))
    return [(int(n), float(m) / n if n else 0.0) for n, m in zip(found, mixed, strict=True)]


def pairs(team: Team) -> None:
    cells = " | ".join(f"{share:.2%} of {n:,}" for n, share in two_intent_shares(team.vectors, team.labels, PRIOR_STARTS))
    print(f"| {team.name} | {cells} |")


class Team:
    """A team file's phrasings, labels and USE vectors."""

    def __init__(self, name: str, encoder: object) -> None:
        rows = list(csv.DictReader((REPLAY / f"{name}-train.csv").open(encoding="utf-8-sig")))
        self.name = name
        self.texts = [r["text"] for r in rows]
        self.intents = list(dict.fromkeys(r["intent"] for r in rows))
        self.labels = np.array([self.intents.index(r["intent"]) for r in rows])
        self.vectors = embed(encoder, self.texts, f"{name}-train")[0]  # type: ignore[arg-type]


def beyond(team: Team, encoder: object, refused: Callable[[str, str], bool]) -> None:
    head = SoftmaxHead(n_classes=len(team.intents)).fit(team.vectors, team.labels)
    for beyond_band in (False, True):
        calibration = calibrate(team.vectors, team.labels, len(team.intents), BOUND, FLOOR, near=team.vectors,
                                beyond_band=beyond_band,
                                refused=lambda a, b: refused(team.texts[a], team.texts[b]))
        t = calibration.threshold
        captured = []
        for seed in (0, 1, 2):
            stream = [json.loads(line) for line in
                      (REPLAY / f"{team.name}-test3000-s{seed}.jsonl").read_text().splitlines()]
            asked, truth = [r["text"] for r in stream], [r["label"] for r in stream]
            x = embed(encoder, asked, f"{team.name}-s{seed}")[0]  # type: ignore[arg-type]
            read, sure = head.read(x)
            order, perfect = first_askings(asked, truth)
            right = 0
            for i in order:
                earlier = order[order < i]
                if sure[i] < t or not len(earlier):
                    continue
                nearest = earlier[np.argsort(-(x[earlier] @ x[i]))[:NEAREST]]
                match = [j for j in nearest if x[j] @ x[i] >= FLOOR and not refused(asked[i], asked[j])
                         and read[j] == read[i] and sure[j] >= t]
                if not match and beyond_band and not any(read[j] == read[i] and x[j] @ x[i] >= FLOOR for j in nearest):
                    same = earlier[(read[earlier] == read[i]) & (sure[earlier] >= t)]
                    ranked = same[np.argsort(-(x[same] @ x[i]))[:OF_INTENT]]
                    match = [j for j in ranked if not refused(asked[i], asked[j])]
                if match and truth[match[0]] == truth[i] and not truth[i].startswith("oos:"):
                    right += 1
            captured.append(right / max(1, perfect))
        print(f"| {team.name} | {'beyond the band' if beyond_band else 'the band'} | {t:.3f} | "
              f"{calibration.served_share:.1%} ({calibration.held_out_wrong:.2%}) | "
              f"{' / '.join(f'{c:.2f}' for c in captured)} |", flush=True)


def sources(team: Team, refused: Callable[[str, str], bool]) -> None:
    fold = held_out_folds(team.vectors, team.labels, len(team.intents), FLOOR,
                          refused=lambda a, b: refused(team.texts[a], team.texts[b]))[0]
    for t in SOURCES_THRESHOLDS:
        served, wrong = rule_outcomes(fold, t)
        hidden = int((served & fold.unknown).sum())
        mismatched = int((wrong & ~fold.unknown).sum())
        print(f"| {team.name} | {t} | {served.mean():.1%} | {int(wrong.sum())} ({wrong.sum() / max(1, served.sum()):.2%}) | "
              f"{hidden} | {mismatched} ({mismatched / max(1, int(served.sum()) - hidden):.2%}) |", flush=True)


def confidences(team: Team, mlp: bool) -> None:
    """The load's folds (as ``held_out_folds`` cuts them), each phrasing read once."""
    x, labels, classes = team.vectors, team.labels, len(team.intents)
    folds, rng = folds_for(len(labels)), np.random.default_rng(0)
    fold_of = np.empty(len(labels), dtype=int)
    for label in range(classes):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        fold_of[members] = (np.arange(len(members)) + rng.integers(folds)) % folds
    order, held = rng.permutation(classes), math.floor(UNKNOWN_SHARE * classes)
    n = len(labels)
    scores: dict[str, np.ndarray] = {}
    reads: dict[str, np.ndarray] = {}
    unknown = np.zeros(n, dtype=bool)

    def put(name: str, rows: np.ndarray, read: np.ndarray, score: np.ndarray) -> None:
        scores.setdefault(name, np.zeros(n))[rows] = score
        reads.setdefault(name, np.zeros(n, dtype=int))[rows] = read

    fitting = 0.0
    for fold in range(folds):
        start = (fold * held) % classes
        hidden = np.isin(labels, order[start:start + held])
        train, test = (fold_of != fold) & ~hidden, np.flatnonzero(fold_of == fold)
        unknown[test] = hidden[test]
        head = SoftmaxHead(n_classes=classes, epochs=EPOCHS, seed=0).fit(x[train], labels[train])
        p = head.predict_proba(x[test])
        best, second = np.argsort(-p, axis=1)[:, 0], np.argsort(-p, axis=1)[:, 1]
        top = p[np.arange(len(test)), best]
        put("softmax", test, best, top)
        put("margin of the two best intents", test, best, top - p[np.arange(len(test)), second])
        nearest = np.argsort(-(x[test] @ x[train].T), axis=1)[:, :10]
        agree = (labels[train][nearest] == best[:, None]).mean(axis=1)
        put("share of the 10 nearest phrasings read so", test, best, agree + 1e-3 * top)
        centroids = np.zeros((classes, x.shape[1]))
        for c in range(classes):
            if (train & (labels == c)).any():
                centroids[c] = x[train & (labels == c)].mean(axis=0)
        unit = centroids / np.maximum(1e-9, np.linalg.norm(centroids, axis=1, keepdims=True))
        residual = x[train] - centroids[labels[train]]
        precision = np.linalg.inv(residual.T @ residual / len(residual) + 1e-3 * np.eye(x.shape[1]))
        offset = x[test] - centroids[best]
        put("gate: centroid cosine", test, best, np.einsum("ij,ij->i", x[test], unit[best]))
        put("gate: Mahalanobis", test, best, -np.einsum("ij,jk,ik->i", offset, precision, offset))
        put("gate: nearest phrasing", test, best,
            np.array([(x[train & (labels == b)] @ x[i]).max() for i, b in zip(test, best, strict=True)]))
        if mlp:
            from sklearn.neural_network import MLPClassifier

            started = time.monotonic()
            model = MLPClassifier(hidden_layer_sizes=(512,), alpha=1e-4, max_iter=60, random_state=0)
            model.fit(x[train], labels[train])
            fitting += time.monotonic() - started
            q, known = model.predict_proba(x[test]), model.classes_
            put("MLP (512 hidden)", test, known[q.argmax(axis=1)], q.max(axis=1))
            averaged = 0.5 * p[:, known] + 0.5 * q
            put("MLP and softmax averaged", test, known[averaged.argmax(axis=1)], averaged.max(axis=1))

    everyone = np.ones(n, dtype=bool)
    for name in scores:
        if name.startswith("gate: "):
            for q in GATE_QUANTILES:
                gate = scores[name] >= np.quantile(scores[name][~unknown], q)
                served = most_served(scores["softmax"], reads["softmax"] != labels, unknown, gate)
                print(f"| {team.name} | softmax, {name[6:]} gate at the in-scope {q:.0%} quantile | {served:.1%} |")
        else:
            served = most_served(scores[name], reads[name] != labels, unknown, everyone)
            print(f"| {team.name} | {name} | {served:.1%} |")
    if mlp:
        print(f"MLP fitting: {fitting:.0f} s over {folds} folds", file=sys.stderr)


CEILING_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.875, 0.9, 0.925, 0.95, 0.96, 0.97, 0.975, 0.98, 0.985, 0.99,
                      0.9925, 0.995, 0.9975, 0.999)
# What `strata intents load` certified on these files (docs/QUALITY.md, fifth measurements).
LOADED_THRESHOLDS = {"bank": 0.982, "clinc": 0.978}


def rule_on_stream(asked: list[str], truth: list[str], near: np.ndarray, read: np.ndarray, sure: np.ndarray,
                   threshold: float, anywhere: bool, refused: Callable[[str, str], bool],
                   guarded: dict[tuple[int, int], bool]) -> tuple[int, int, int]:
    """(served, wrong, perfect) of the intent rule alone on a stream: a question not asked before is
    served from the nearest earlier one (in the band of 8 at the floor, or anywhere) read as its
    intent, both at ``threshold``, past the guards; wrong when their labels differ or it is out of scope.
    Each cached question's first hit is checked as shipped (``intent_first_check``): when the asker's
    label differs from its own, it serves by intent no more."""
    order, perfect = first_askings(asked, truth)
    served = wrong = 0
    checked: set[int] = set()
    refuted: set[int] = set()
    for position, i in enumerate(order):
        if sure[i] < threshold or position == 0:
            continue
        earlier = order[:position]
        similarity = near[earlier] @ near[i]
        ranked = np.argsort(-similarity)
        if not anywhere:
            ranked = ranked[:NEAREST]
            ranked = ranked[similarity[ranked] >= FLOOR]
        for k in ranked:
            j = int(earlier[k])
            if read[j] != read[i] or sure[j] < threshold or j in refuted:
                continue
            if (i, j) not in guarded:
                guarded[(i, j)] = refused(asked[i], asked[j])
            if guarded[(i, j)]:
                continue
            served += 1
            missed = truth[j] != truth[i] or truth[i].startswith("oos:")
            wrong += missed
            if j not in checked:  # its first hit, checked against the model after the response (as shipped)
                checked.add(j)
                if truth[j] != truth[i]:
                    refuted.add(j)
            break
    return served, wrong, perfect


def intent_keyed_on_stream(truth: list[str], names: list[str], read: np.ndarray, sure: np.ndarray,
                           threshold: float, asked: list[str]) -> tuple[int, int, int]:
    """(served, wrong, perfect) of an intent-keyed cache whose cached side is read perfectly: a
    question not asked before, read as an intent at ``threshold``, is served that intent's answer
    when a question labelled with it was asked before (as if every cached question's intent were
    known); wrong when its own label differs or it is out of scope."""
    order, perfect = first_askings(asked, truth)
    served = wrong = 0
    seen: set[str] = set()
    for i in order:
        intent = names[int(read[i])]
        if sure[i] >= threshold and intent in seen:
            served += 1
            wrong += truth[i] != intent
        seen.add(truth[i])
    return served, wrong, perfect


def ceiling(team: Team, encoder: object, refused: Callable[[str, str], bool], seeds: tuple[int, ...] = (0, 1, 2),
            head_encoder: object | None = None) -> None:
    """``head_encoder``: the head reads with it (``STRATA_INTENT_EMBEDDER``), the band stays the index's."""
    head_encoder = encoder if head_encoder is None else head_encoder
    train = team.vectors if head_encoder is encoder else embed(head_encoder, team.texts, f"{team.name}-train")[0]  # type: ignore[arg-type]
    head = SoftmaxHead(n_classes=len(team.intents)).fit(train, team.labels)
    for seed in seeds:
        stream = [json.loads(line) for line in (REPLAY / f"{team.name}-test3000-s{seed}.jsonl").read_text().splitlines()]
        texts = [r["text"] for r in stream]
        vectors = embed(encoder, texts, f"{team.name}-s{seed}")[0]  # type: ignore[arg-type]
        heads = vectors if head_encoder is encoder else embed(head_encoder, texts, f"{team.name}-s{seed}")[0]  # type: ignore[arg-type]
        for with_oos in (True, False):
            keep = [i for i, r in enumerate(stream) if with_oos or not r["label"].startswith("oos:")]
            asked, truth = [stream[i]["text"] for i in keep], [stream[i]["label"] for i in keep]
            near = vectors[keep]
            read, sure = head.read(heads[keep])
            for anywhere in (False, True):
                guarded: dict[tuple[int, int], bool] = {}

                def run(t: float, anywhere: bool = anywhere, guarded: dict[tuple[int, int], bool] = guarded,
                        asked: list[str] = asked, truth: list[str] = truth, near: np.ndarray = near,
                        read: np.ndarray = read, sure: np.ndarray = sure) -> tuple[float, float]:
                    served, wrong, perfect = rule_on_stream(asked, truth, near, read, sure, t, anywhere, refused, guarded)
                    return (served - wrong) / max(1, perfect), wrong / max(1, served)

                loaded = run(LOADED_THRESHOLDS[team.name])
                best = max(((run(t), t) for t in CEILING_THRESHOLDS), key=lambda r: (r[0][1] <= BOUND, r[0][0]))
                (captured, wrong), t = best
                at_load = f"{loaded[0]:.2f} ({loaded[1]:.2%})" if head_encoder is encoder else "-"
                print(f"| {team.name} | s{seed} | {'10%' if with_oos else 'none'} | "
                      f"{'every earlier question' if anywhere else 'the band'} | {at_load} | "
                      f"{captured:.2f} ({wrong:.2%}) | {t} |", flush=True)

            def keyed(t: float, asked: list[str] = asked, truth: list[str] = truth, read: np.ndarray = read,
                      sure: np.ndarray = sure) -> tuple[float, float]:
                served, wrong, perfect = intent_keyed_on_stream(truth, team.intents, read, sure, t, asked)
                return (served - wrong) / max(1, perfect), wrong / max(1, served)

            (captured, wrong), t = max(((keyed(t), t) for t in CEILING_THRESHOLDS),
                                       key=lambda r: (r[0][1] <= BOUND, r[0][0]))
            print(f"| {team.name} | s{seed} | {'10%' if with_oos else 'none'} | the intent's answer, the cached side "
                  f"read perfectly | - | {captured:.2f} ({wrong:.2%}) | {t} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=("beyond", "sources", "confidences", "pairs", "ceiling"))
    parser.add_argument("--teams", nargs="+", default=["bank", "clinc"])
    parser.add_argument("--mlp", action="store_true", help="confidences: also an MLP head (scikit-learn)")
    parser.add_argument("--intent-embedder", help="ceiling: the head reads with this model (the band stays USE's)")
    args = parser.parse_args(argv)
    encoder = load_encoder("use-multilingual")
    verifier = load_verifier(Settings.from_env())

    def refused(asked: str, cached: str) -> bool:
        return verifier.guard(asked, cached) is not None

    head_encoder = None
    if args.intent_embedder:
        from app.cache.readers.embedder import INTENT_PROMPTS, LocalModelVectors

        head_encoder = LocalModelVectors(args.intent_embedder, threads=2, prompts=INTENT_PROMPTS)
    print(HEADERS[args.study])
    for name in args.teams:
        team = Team(name, encoder)
        if args.study == "beyond":
            beyond(team, encoder, refused)
        elif args.study == "sources":
            sources(team, refused)
        elif args.study == "pairs":
            pairs(team)
        elif args.study == "ceiling":
            ceiling(team, encoder, refused, head_encoder=head_encoder)
        else:
            confidences(team, args.mlp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
