"""Prompt-hygiene patterns: every example in schemas/prompt_hygiene.yaml, Chinese and English."""

from __future__ import annotations

import pytest

from app.hygiene import PromptHygiene
from app.settings import PROJECT_ROOT

HYGIENE = PromptHygiene.load(PROJECT_ROOT / "schemas" / "prompt_hygiene.yaml")
CASES = [(p.kind, text, True) for p in HYGIENE.patterns for text in p.match] + \
        [(p.kind, text, False) for p in HYGIENE.patterns for text in p.no_match]


@pytest.mark.parametrize(("kind", "text", "found"), CASES)
def test_each_pattern_on_its_examples(kind: str, text: str, found: bool) -> None:
    kinds = {f.kind for f in HYGIENE.find(text)}
    assert (kind in kinds) == found, (kind, text, HYGIENE.find(text))


def test_a_stable_prompt_has_nothing_and_a_busy_one_has_every_span_once() -> None:
    stable = "You are the customer-service assistant of Example Shop. Answer in Chinese, politely, in 3 sentences."
    assert HYGIENE.find(stable) == []
    busy = "Now: 2026-12-01 09:30:15. User 48213377 (jane@example.com), session 3f2b8c1e-9d4a-4b7e-8f21-0c5d6e7f8a9b."
    findings = HYGIENE.find(busy)
    assert [f.kind for f in findings] == ["timestamp", "digits", "email", "uuid"]
    assert all(busy[f.start:f.end] == f.text for f in findings)


def test_a_prompt_is_reported_once() -> None:
    hygiene = PromptHygiene(HYGIENE.patterns)
    first, new = hygiene.check("Today is 2026-12-01.")
    again, new_again = hygiene.check("Today is 2026-12-01.")
    assert new and not new_again and first == again and first[0].kind == "date"
