"""The buckets of bench.refusals: why a candidate was refused, in the decision's own order."""

from __future__ import annotations

from app.policy import AdaptiveSemantic
from bench.refusals import Logged, bucket

POLICY = AdaptiveSemantic(threshold=0.60, accept_above=0.88, error_bound=0.01, confidence=0.85,
                        entry_confirmations=5, entry_floor=0.75, entry_margin=0.06)


def refused(similarity: float, margin: float, confirmations: int | None = None, wrong_above: int | None = None,
            reason: str = "outside_bound") -> Logged:
    return Logged(right=True, served=False, reason=reason, similarity=similarity, score=similarity + margin / 2,
                  confirmations=confirmations, wrong_above=wrong_above)


def test_each_refusal_falls_in_the_first_rule_that_stopped_it() -> None:
    assert bucket(refused(0.70, 0.02), POLICY) == "refused: score below entry_floor 0.75"
    assert bucket(refused(0.80, 0.04), POLICY) == "refused: another answer within entry_margin 0.06"
    assert bucket(refused(0.80, 0.10, confirmations=2), POLICY) == "refused: 0-2 confirmations below the score"
    assert bucket(refused(0.80, 0.10, confirmations=4), POLICY) == "refused: 3-4 confirmations below the score"
    assert bucket(refused(0.80, 0.10, confirmations=9, wrong_above=820), POLICY) == \
        "refused: entry wrong at this similarity or above"
    assert bucket(refused(0.80, 0.10, confirmations=9, wrong_above=780), POLICY) == \
        "refused: entry wrong within 0.05 below"
    assert bucket(refused(0.95, 0.10, reason="wrong_before"), POLICY) == "refused wrong_before"


def test_served_candidates_are_bucketed_by_their_rule() -> None:
    served = Logged(right=False, served=True, reason="entry_record", similarity=0.8, score=0.85,
                    confirmations=6, wrong_above=None)
    assert bucket(served, POLICY) == "served entry_record"
