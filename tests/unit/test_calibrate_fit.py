"""The fitting rules of `strata calibrate`: the precision margin and the QQP-hard construction."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from app.calibrate import fit as calibrate
from app.calibrate.qqp import qqp_hard


def test_lower_bound_is_below_the_point_precision_and_tightens_with_more_hits() -> None:
    assert calibrate.precision_lower_bound(10, 10, 0.0) == pytest.approx(1.0)
    few, many = calibrate.precision_lower_bound(30, 30, 1.0), calibrate.precision_lower_bound(3000, 3000, 1.0)
    assert few == pytest.approx(30 / 31)  # Wilson at z=1 with no misses: n / (n + 1)
    assert few < many < 1.0
    assert calibrate.precision_lower_bound(0, 0, 1.0) == 1.0  # no hits: precision 1.0, as in evaluate
    assert calibrate.precision_lower_bound(99, 100, 1.0) < 0.99 < 99 / 100 + 1e-9


def _table(similarity: list[float], label: list[int]) -> calibrate.PairTable:
    n = len(label)
    return calibrate.PairTable(np.array(similarity), np.ones(n, bool), np.zeros(n), np.array(label))


def test_cosine_only_recall_with_and_without_margin() -> None:
    # 40 right pairs above 0.9, then one wrong at 0.89, then 10 right ones.
    table = _table([0.99 - i * 0.001 for i in range(40)] + [0.89] + [0.85] * 10, [1] * 40 + [0] + [1] * 10)
    recall, threshold = calibrate.cosine_only_recall(table, 0.97)
    assert threshold == pytest.approx(0.85) and recall == 1.0  # 50/51 >= 0.97 at the point
    cautious, cautious_threshold = calibrate.cosine_only_recall(table, 0.97, margin=1.0)
    assert cautious == pytest.approx(40 / 50) and cautious_threshold == pytest.approx(0.951)


def topic(question: str) -> str:
    return re.search(r"\d+", question).group()  # type: ignore[union-attr]


def test_qqp_hard_negatives_stay_in_their_pool_and_cluster(tmp_path: Path) -> None:
    rows = [{"origin": f"How do I learn topic {i} fast?", "similar": f"What is the fastest way to learn topic {i}?"}
            for i in range(60)]
    rows.append({"origin": "What is the fastest way to learn topic 0?", "similar": "Quickest way to learn topic 0?"})
    path = tmp_path / "qqp.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    for split in ("train", "eval"):
        pairs = qqp_hard(path, split, pool_size=10)
        assert pairs == qqp_hard(path, split, pool_size=10)  # deterministic
        positives = [p for p in pairs if p.label == 1]
        negatives = [p for p in pairs if p.label == 0]
        # One negative per origin row, except where a pool holds nothing of another cluster.
        assert len(positives) - 1 <= len(negatives) <= len(positives)
        linked = {(p.cached, p.asked) for p in positives}
        # Positives come in pool order: the pool of an origin is its run of 10.
        pool_of = {p.cached: i // 10 for i, p in enumerate(positives)}
        similars_in = {i // 10: set() for i in range(len(positives))}
        for i, p in enumerate(positives):
            similars_in[i // 10].add(p.asked)
        for negative in negatives:
            # Never a pair of the same duplicate cluster (topic 0's three questions are one).
            assert topic(negative.cached) != topic(negative.asked)
            assert (negative.cached, negative.asked) not in linked
            assert negative.asked in similars_in[pool_of[negative.cached]]
