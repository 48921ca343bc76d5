"""A curated answer serves its own wording in an adaptive category (`curated_wording`): the same
words up to case, spaces and punctuation, never merely the same content words."""

from __future__ import annotations

import pytest

from app.cache.decision.candidates import same_wording


@pytest.mark.parametrize(("asked", "cached"), [
    ("营业时间是几点?", "营业时间是几点"),
    ("How do I reset my PIN", "how do i reset my pin?"),
    ("怎么 申请 退款！", b"\xe6\x80\x8e\xe4\xb9\x88\xe7\x94\xb3\xe8\xaf\xb7\xe9\x80\x80\xe6\xac\xbe"),  # stored bytes
])
def test_one_wording_up_to_case_spaces_and_punctuation(asked: str, cached: str | bytes) -> None:
    assert same_wording(asked, cached)


@pytest.mark.parametrize(("asked", "cached"), [
    ("why must i verify my identity", "how do i verify my identity"),  # twins: one content word apart
    ("挂失银行卡", "恢复挂失银行卡"),
    ("transfer 100 to savings", "transfer 1000 to savings"),
    ("?!", "..."),  # nothing left of either: not one wording
])
def test_other_words_are_not_its_wording(asked: str, cached: str) -> None:
    assert not same_wording(asked, cached)
