"""Scoring the service's decisions on pairs: similarities, verdicts, the judge step, precision and recall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.cache.decision.verify import ABOVE_BAND, BELOW_THRESHOLD, OUTSIDE_BOUND, VERIFIED, CandidateCheck, PairVerifier
from app.cache.storage.contract import Verdict
from app.cache.storage.keys import normalize_text
from app.calibrate.pairs import Pair
from app.embed import Encoder
from app.policy import SemanticPolicy


def similarities(pairs: Sequence[Pair], encoder: Encoder, batch: int = 128) -> np.ndarray:
    """Cosine similarity of each pair, embedding the normalised text as the service does."""
    texts = sorted({normalize_text(t) for p in pairs for t in (p.cached, p.asked)})
    index = {t: i for i, t in enumerate(texts)}
    vectors = np.concatenate([encoder.encode(texts[i : i + batch]) for i in range(0, len(texts), batch)])
    left = vectors[[index[normalize_text(p.cached)] for p in pairs]]
    right = vectors[[index[normalize_text(p.asked)] for p in pairs]]
    cosine: np.ndarray = np.einsum("ij,ij->i", left, right)
    return cosine


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    hits: int
    positives: int
    pairs: int

    def line(self) -> str:
        return (f"precision={self.precision:.4f} recall={self.recall:.4f} hits={self.hits} "
                f"positives={self.positives} pairs={self.pairs}")


def score(decisions: np.ndarray, labels: np.ndarray) -> Score:
    hits = int(decisions.sum())
    true_hits = int((decisions & (labels == 1)).sum())
    positives = int((labels == 1).sum())
    return Score(
        precision=true_hits / hits if hits else 1.0,
        recall=true_hits / positives if positives else 0.0,
        hits=hits,
        positives=positives,
        pairs=len(labels),
    )


def verify_all(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier, policy: SemanticPolicy) -> list[Verdict]:
    """The verification stage's verdict for every pair, as the service would give it.

    An adaptive category is judged as a fresh deployment decides, before any observation: the
    guards, then its prior (``accept_above``); what it learns from traffic only a replay shows.
    """
    if policy.adaptive:
        return [_cold_start(verifier, normalize_text(p.asked), normalize_text(p.cached), float(s), policy)
                for p, s in zip(pairs, sims, strict=True)]
    return [
        verifier.verify(normalize_text(pair.asked), normalize_text(pair.cached), float(similarity), policy)
        for pair, similarity in zip(pairs, sims, strict=True)
    ]


def _cold_start(verifier: PairVerifier, asked: str, cached: str, similarity: float, policy: SemanticPolicy) -> Verdict:
    if similarity < policy.threshold:
        return Verdict(False, BELOW_THRESHOLD)
    rejection = verifier.guard(asked, cached)
    if rejection is not None:
        return Verdict(False, rejection)
    return Verdict(True, ABOVE_BAND) if similarity >= policy.accept_above else Verdict(False, OUTSIDE_BOUND)


async def judge_all(pairs: Sequence[Pair], verdicts: list[Verdict], check: CandidateCheck, policy: SemanticPolicy,
                    model: str, concurrency: int = 4) -> tuple[list[Verdict], list[float]]:
    """Run the confirm step (the LLM judge) over the verdicts, through the hook the service uses.

    Returns:
        The verdicts, and the judge's latency in seconds for each call made.
    """
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    judged = list(verdicts)

    async def one(i: int) -> None:
        async with slots:
            started = time.perf_counter()
            asked, cached = normalize_text(pairs[i].asked), normalize_text(pairs[i].cached)
            judged[i] = await check.confirmed(verdicts[i], asked, cached, policy, model)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(i) for i, v in enumerate(verdicts) if v.reason == VERIFIED and policy.judge_before_serving))
    return judged, latencies


def evaluate(pairs: Sequence[Pair], verdicts: Sequence[Verdict]) -> tuple[Score, dict[str, int]]:
    """Score the service's decisions; returns the score and the count of each reason."""
    decisions = np.array([v.accepted for v in verdicts], dtype=bool)
    reasons: dict[str, int] = {}
    for verdict in verdicts:
        reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
    return score(decisions, np.array([p.label for p in pairs])), reasons
