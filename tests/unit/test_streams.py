"""Replay streams built from ../shared/data (skipped when the folder is absent)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from app.cli import DEFAULT_DATA
from app.replay.streams import CLINC_DOMAINS, clinc_stream

CLINC = DEFAULT_DATA / "clinc150.csv"
pytestmark = pytest.mark.skipif(not CLINC.exists(), reason=f"shared data not found: {CLINC}")


def test_a_domain_stream_keeps_its_intents_fresh_utterances_first_and_is_seeded() -> None:
    stream = clinc_stream(CLINC, 400, seed=3, domain="bank")
    labels = Counter(request.label for request in stream)
    assert set(labels) <= set(CLINC_DOMAINS["bank"]) and len(labels) >= 20
    assert labels.most_common(1)[0][1] > 3 * labels.most_common()[-1][1]  # Zipf: a head and a tail
    # A fresh utterance each time while any is left: no intent has used up its 150 here, so only
    # the data's own duplicates (the same words under one intent) repeat.
    assert labels.most_common(1)[0][1] < 150 and len({request.text for request in stream}) >= 0.99 * len(stream)
    assert stream == clinc_stream(CLINC, 400, seed=3, domain="bank")
    assert stream != clinc_stream(CLINC, 400, seed=4, domain="bank")


def test_the_replays_faq_as_intents_keeps_the_streams_intents_and_marks_the_named_ones(tmp_path: Path) -> None:
    from app.intents import read_intents
    from app.replay.streams import CLINC_NAMED_INTENTS, curated_answer, intents_with_answers, team_intents

    rows = team_intents("clinc", CLINC, first_intents=40)
    streamed = {request.label for request in clinc_stream(CLINC, 3000, seed=0, domain_intents=40)}
    assert {intent for _, intent in rows} == streamed and len(streamed) == 40
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(intents_with_answers(rows)), encoding="utf-8")
    items = {item.intent: item for item in read_intents(path)}  # what `strata intents load` accepts
    named = [item for item in items.values() if item.intent in CLINC_NAMED_INTENTS]
    assert named and all(not item.shared and item.answer is None for item in named)
    kept = [item for item in items.values() if item.intent not in CLINC_NAMED_INTENTS]
    assert kept and all(item.shared and item.answer == curated_answer(item.intent) for item in kept)
    assert sum(len(item.phrasings) for item in items.values()) == len(rows)
