"""Replay streams built from ../shared/data (skipped when the folder is absent)."""

from __future__ import annotations

from collections import Counter

import pytest

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
