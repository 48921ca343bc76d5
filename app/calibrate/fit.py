"""Fitting a category's policy to a target precision, vectorised over a table of pairs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.cache.decision.verify import PairVerifier
from app.cache.storage.keys import normalize_text
from app.calibrate.evaluate import Score, score
from app.calibrate.pairs import Pair
from app.policy import FixedSemantic


def features_of(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier) -> np.ndarray:
    analyzer = verifier.analyzer
    return np.array([
        analyzer.features(normalize_text(p.asked), normalize_text(p.cached), float(s))
        for p, s in zip(pairs, sims, strict=True)
    ])


@dataclass(frozen=True)
class PairTable:
    """Everything a policy decision needs, precomputed per pair."""

    similarity: np.ndarray
    guard_ok: np.ndarray
    probability: np.ndarray
    label: np.ndarray


def tabulate(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier) -> PairTable:
    features = features_of(pairs, sims, verifier)
    # The guards as the service applies them (every guard, not only those among the features).
    guard_ok = np.array([verifier.guard(normalize_text(p.asked), normalize_text(p.cached)) is None for p in pairs],
                        dtype=bool)
    probability = verifier.model.probability(features) if verifier.model else np.zeros(len(pairs))
    return PairTable(np.asarray(sims), guard_ok, probability, np.array([p.label for p in pairs]))


def decide(table: PairTable, policy: FixedSemantic) -> np.ndarray:
    """Vectorised :meth:`PairVerifier.verify` over a table (tested to agree with it)."""
    gate = (table.similarity >= policy.threshold) & table.guard_ok
    served: np.ndarray = gate & ((table.similarity >= policy.accept_above) | (table.probability >= policy.min_probability))
    return served


def precision_lower_bound(true_hits: np.ndarray | int, hits: np.ndarray | int, z: float) -> np.ndarray:
    """Wilson score lower bound of precision, ``z`` standard errors below; 1.0 with no hits.

    A policy chosen for its point precision on a few hundred pairs is chosen partly for luck: the
    best of many grid points lands above its true precision. Asking the lower bound to reach the
    target leaves that margin (``z=0`` is the point precision).
    """
    k, n = np.asarray(true_hits, dtype=float), np.asarray(hits, dtype=float)
    safe = np.maximum(n, 1.0)
    p = k / safe
    centre = p + z * z / (2 * safe)
    spread = z * np.sqrt(p * (1 - p) / safe + z * z / (4 * safe * safe))
    return np.where(n > 0, (centre - spread) / (1 + z * z / safe), 1.0)


def fit(table: PairTable, target_precision: float, min_hits: int = 20,
        margin: float = 1.0) -> tuple[FixedSemantic, Score] | None:
    """The policy with the highest recall whose precision reaches the target on the table.

    A policy counts only with at least ``min_hits`` hits, and only when the Wilson lower bound of
    its precision, ``margin`` standard errors down, reaches the target: a handful of lucky pairs
    does not pass for precision. Of policies with equal recall the one with the highest cosine
    threshold wins: fewer candidates reach the learned verifier.
    """
    best: tuple[FixedSemantic, Score] | None = None
    thresholds = np.round(np.arange(0.98, 0.499, -0.02), 2)
    probabilities = np.round(np.concatenate([np.arange(0.5, 0.95, 0.05), np.arange(0.95, 1.0, 0.005)]), 3)
    for threshold in thresholds:
        # accept_above 1.0: only identical questions skip the learned verifier.
        for accept_above in (1.0, 0.995, 0.99, 0.98, 0.97):
            if accept_above < threshold:
                continue
            for min_probability in probabilities:
                policy = FixedSemantic(threshold=float(threshold), accept_above=accept_above,
                                        min_probability=float(min_probability))
                decisions = decide(table, policy)
                result = score(decisions, table.label)
                true_hits = int((decisions & (table.label == 1)).sum())
                if result.hits < min_hits or precision_lower_bound(true_hits, result.hits, margin) < target_precision:
                    continue
                if best is None or result.recall > best[1].recall:
                    best = (policy, result)
    return best


def cosine_only_recall(table: PairTable, target_precision: float, min_hits: int = 20,
                       margin: float = 0.0) -> tuple[float, float | None]:
    """Recall of cosine alone at the target precision, and the threshold that gives it.

    ``margin`` as in :func:`fit`; 0 (point precision) makes this the best any threshold can do.
    """
    order = np.argsort(-table.similarity)
    labels = table.label[order]
    true_hits = np.cumsum(labels)
    hits = np.arange(1, len(labels) + 1)
    ok = np.where((precision_lower_bound(true_hits, hits, margin) >= target_precision) & (hits >= min_hits))[0]
    if not len(ok):
        return 0.0, None
    last = ok.max()
    return float(true_hits[last] / max(1, labels.sum())), float(table.similarity[order][last])
