"""The adaptive decision's arithmetic: score, bins, the Wilson bound, pooled counts, answer equivalence."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from app.cache.decision.stats import (
    SET_SHORTFALL,
    PooledCounts,
    decision_score,
    entry_record_fields,
    entry_vouches,
    score_bin,
    set_similarity,
    wilson_upper,
    within_bound,
)
from app.cache.decision.verify import Lexicon, PairAnalyzer
from app.cache.learning.learner import AnswerLearner
from app.policy import AdaptiveSemantic
from app.settings import PROJECT_ROOT

ADAPTIVE = AdaptiveSemantic(threshold=0.6, error_bound=0.01, confidence=0.85)


def test_score_adds_half_the_margin_over_the_nearest_other_answer() -> None:
    assert decision_score(0.9, 0.7, 0.6) == pytest.approx(1.0)
    assert decision_score(0.9, None, 0.6) == pytest.approx(1.05)  # no other answer near: floor
    assert decision_score(0.9, 0.95, 0.6) == pytest.approx(0.9)  # never below the similarity


def test_an_entrys_phrasings_as_a_set_read_its_nearest_few() -> None:
    assert set_similarity([0.9, 0.7, 0.8, 0.5], 1) == pytest.approx(0.9)  # the nearest one
    assert set_similarity([0.9, 0.7, 0.8, 0.5], 3) == pytest.approx(0.8)  # the mean of the three nearest
    # One close phrasing of an entry with no other near vouches for less than three close ones.
    assert set_similarity([0.9], 3) == pytest.approx(0.9 - 2 * SET_SHORTFALL)
    assert set_similarity([0.9, 0.85], 3) == pytest.approx(0.85 - SET_SHORTFALL)
    assert score_bin(0.873) == 87 and score_bin(9.0) == 159 and score_bin(-1.0) == 0


def test_wilson_upper_bound() -> None:
    assert wilson_upper(0, 0, 1.0) == 1.0
    assert wilson_upper(0, 100, 1.04) > 0.01 > wilson_upper(0, 120, 1.04)  # about z^2 / delta clean observations
    assert wilson_upper(5, 100, 1.0) > 0.05


def test_pooled_counts_are_suffix_sums_and_the_bound_needs_evidence() -> None:
    counts = PooledCounts({"ok:090": 150, "ok:080": 100, "wrong:070": 3, "explored_ok": 4})
    assert counts.at_or_above(90) == (0, 150) and counts.at_or_above(80) == (0, 250)
    assert counts.at_or_above(70) == (3, 253) and counts.explored_ok == 4
    assert within_bound(counts, 90, ADAPTIVE) and within_bound(counts, 80, ADAPTIVE)
    assert not within_bound(counts, 70, ADAPTIVE)  # 3 wrong of 253: above 1%
    assert not within_bound(PooledCounts({"ok:090": 30}), 90, ADAPTIVE)  # too few observations


def test_the_prior_speaks_only_once_the_pool_has_seen_one_over_the_bound() -> None:
    from app.cache.decision.stats import prior_has_evidence

    policy = AdaptiveSemantic(threshold=0.6, accept_above=0.88, error_bound=0.01, prior_evidence=True)
    assert not prior_has_evidence(PooledCounts({}), 90, policy)
    assert not prior_has_evidence(PooledCounts({"ok:095": 99}), 90, policy)  # 99 < 1 / 0.01
    assert prior_has_evidence(PooledCounts({"ok:095": 98, "wrong:091": 2}), 90, policy)
    assert not prior_has_evidence(PooledCounts({"ok:085": 500}), 90, policy)  # evidence below the score only


def test_same_content_is_a_repeat_in_other_function_words() -> None:
    from app.cache.decision.verify import PairVerifier

    verifier = PairVerifier(PairAnalyzer(Lexicon.load(PROJECT_ROOT / "schemas" / "verification.yaml")), None)
    assert verifier.same_content("怎么申请退款", "怎么申请退款呢？")
    assert verifier.same_content("How do I reset my password", "how do i reset my password?")
    assert not verifier.same_content("怎么修改密码", "忘记密码怎么办")  # twin intents: other content words
    assert not verifier.same_content("怎么退款", "怎么退货")
    assert not verifier.same_content("transfer 5 dollars", "transfer 9 dollars")
    assert not verifier.same_content("的", "了")  # no content at all says nothing


def completion(text: str) -> bytes:
    return msgspec.json.encode({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})


class _Embedder:
    name, dims = "fake", 2

    async def embed(self, texts: list[str], owner: str = "") -> np.ndarray:
        return np.array([[1.0, 0.0] if "refund" in t else [0.0, 1.0] for t in texts])  # orthogonal topics


def test_answer_equivalence_ignores_wording_not_numbers() -> None:
    analyzer = PairAnalyzer(Lexicon.load(PROJECT_ROOT / "schemas" / "verification.yaml"))
    learner = AnswerLearner(redis=_NoRedis(), embedder=_Embedder(), analyzer=analyzer)  # type: ignore[arg-type]

    def same(a: str, b: str) -> bool:
        return asyncio.run(learner.equivalent(completion(a), completion(b), ADAPTIVE))

    assert same("For pin change, follow guide 1004 in section B.", "Follow guide 1004 in section B for pin change.")
    assert same("退款请在订单页面点击申请退款", "退款请在订单页面点击申请退款。")
    assert not same("For pin change, follow guide 1004 in section B.", "For pin change, follow guide 1005 in section B.")
    assert not same("Your refund arrives within five working days.", "Invoices are issued by the billing team.")


class _NoRedis:
    def register_script(self, script: str) -> object:
        return None


def test_a_prior_serves_until_the_observations_refute_it() -> None:
    nothing = PooledCounts({})
    assert not within_bound(nothing, 90, ADAPTIVE) and within_bound(nothing, 90, ADAPTIVE, prior=True)
    refuted = PooledCounts({"ok:095": 80, "wrong:095": 20})  # a fifth wrong at these scores
    assert not within_bound(refuted, 90, ADAPTIVE, prior=True)
    unclear = PooledCounts({"ok:095": 98, "wrong:095": 2})  # 2% of 100: not enough to withdraw it
    assert within_bound(unclear, 90, ADAPTIVE, prior=True) and not within_bound(unclear, 90, ADAPTIVE)


ENTRY_POLICY = AdaptiveSemantic(threshold=0.6, accept_above=0.9, error_bound=0.01, entry_confirmations=3)


def test_an_entry_vouches_with_enough_confirmations_and_no_wrong_nearby() -> None:
    fields = entry_record_fields(0.6, 82)
    assert fields[0] == "wrong_above" and fields[1] == "confirmed:060" and fields[-1] == "confirmed:082"
    confirmations = [None] * (len(fields) - 1)
    confirmations[5] = b"2"
    assert not entry_vouches([None, *confirmations], 0.80, ENTRY_POLICY)  # two of three
    confirmations[10] = b"1"
    assert entry_vouches([None, *confirmations], 0.80, ENTRY_POLICY)
    assert not entry_vouches([b"760", *confirmations], 0.80, ENTRY_POLICY)  # wrong at 0.76: within the gap
    assert entry_vouches([b"740", *confirmations], 0.80, ENTRY_POLICY)  # wrong further below: still vouches
    assert not entry_vouches([b"850", *confirmations], 0.80, ENTRY_POLICY)  # wrong above it


def test_a_wrong_just_below_is_outweighed_only_by_twice_the_evidence_from_closer_in() -> None:
    fields = entry_record_fields(0.6, 82)  # bins 60..82
    confirmations = [None] * (len(fields) - 1)
    confirmations[0] = b"40"  # far below (bin 60): says nothing about 0.76-0.81
    assert not entry_vouches([b"760", *confirmations], 0.80, ENTRY_POLICY)
    confirmations[81 - 60] = b"5"  # at bin 81, closer in than the wrong 0.76 plus the gap
    assert not entry_vouches([b"760", *confirmations], 0.80, ENTRY_POLICY)  # 5 of 2 x 3
    confirmations[82 - 60] = b"1"
    assert entry_vouches([b"760", *confirmations], 0.80, ENTRY_POLICY)  # 6 of 2 x 3
    # At the similarity where it was wrong, or below, nothing outweighs it (feedback's veto).
    assert not entry_vouches([b"800", *confirmations], 0.80, ENTRY_POLICY)
    assert not entry_vouches([b"850", *confirmations], 0.80, ENTRY_POLICY)


def test_neighbours_are_other_entries_of_model_answers_in_the_band() -> None:
    from app.cache.decision.candidates import NEIGHBOURS, neighbours_of
    from app.cache.storage.contract import Nearest

    def row(key: str, similarity: float, root: str, source: str | None = None, answer: str = "a") -> Nearest:
        fields: dict[str, object] = {"root": root, "answer": answer, "question": "q"}
        if source:
            fields["source"] = source
        return Nearest(key, similarity, fields)

    rows = [row("d1", 0.95, "e1"), row("d2", 0.93, "e1"), row("d3", 0.9, "e2"), row("d4", 0.85, "e3", "faq"),
            row("d5", 0.8, "e2"), row("d6", 0.7, "e4"), row("d7", 0.5, "e5")]
    found = neighbours_of("e1", rows[0], rows, floor=0.6)
    # Not the candidate's own entry, not curated answers, each entry once, nothing under the floor.
    assert [n.root for n in found] == ["e2", "e4"] and found[0].answer == b"a"
    assert neighbours_of("e3", rows[3], rows, floor=0.6) == ()  # a curated candidate is never merged
    many = [row(f"d{i}", 0.9, f"e{i}") for i in range(10)]
    assert len(neighbours_of("e0", many[0], many, floor=0.6)) == NEIGHBOURS


def test_each_kind_of_observation_counts_in_the_pool_what_its_table_says() -> None:
    from app.cache.learning.observations import Observation, pool_fields

    miss = pool_fields(Observation.ANSWERED_MISS, same=True, score_bin=87)
    assert miss == ["ok:087"]
    explored = pool_fields(Observation.ANSWERED_MISS, same=False, score_bin=87, explored=True,
                           rules=("reader_wrong:087",))
    assert explored == ["wrong:087", "explored_wrong", "reader_wrong:087"]
    # A candidate a rule vouched for measures the rule, never the pool's own bins.
    assert pool_fields(Observation.VOUCHED_MISS, same=True, score_bin=80, explored=True,
                       rules=("record_ok:080",)) == ["explored_ok", "record_ok:080"]
    # A user's "right" is no fair sample; a "wrong" counts against the bin; a reviewer's pair is chosen.
    assert pool_fields(Observation.FEEDBACK, same=True, score_bin=90) == []
    assert pool_fields(Observation.FEEDBACK, same=False, score_bin=90) == ["wrong:090"]
    assert pool_fields(Observation.REVIEW, same=False, score_bin=90) == []
