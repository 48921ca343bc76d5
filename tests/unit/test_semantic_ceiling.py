"""The hindsight ceilings of bench.semantic_ceiling: the threshold search, plain and with repeats."""

from __future__ import annotations

import numpy as np

from bench.semantic_ceiling import best_threshold


def test_the_best_threshold_serves_the_most_within_the_bound() -> None:
    scores = np.array([0.95, 0.90, 0.85, 0.80])
    right = np.array([1.0, 1.0, 0.0, 1.0])
    assert best_threshold(scores, right, 0.0) == 2          # stops before the wrong one
    assert best_threshold(scores, right, 0.25) == 4         # one wrong in four is allowed
    assert best_threshold(np.array([0.9]), np.array([0.0]), 0.01) == 0


def test_repeats_weigh_each_question() -> None:
    scores = np.array([0.95, 0.90, 0.85])
    right = np.array([1.0, 0.0, 1.0])
    # The wrong question is asked once, the right ones 50 times each: serving all three is
    # 1 wrong in 101 requests, within 1%; unweighted it is 1 in 3.
    assert best_threshold(scores, right, 0.01, np.array([50.0, 1.0, 50.0])) == 101
    assert best_threshold(scores, right, 0.01) == 1
