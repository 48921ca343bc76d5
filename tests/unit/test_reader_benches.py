"""The arithmetic of issue #33's reader benches: a stream's hindsight ceiling, the worst window."""

from __future__ import annotations

from app.replay.streams import Request
from bench.reader_ceiling import hindsight
from bench.reader_matrix import worst_window


def test_the_hindsight_ceiling_counts_repeats_and_first_askings_apart() -> None:
    stream = [Request("how do i pay", "pay"), Request("How do I pay", "pay"),  # L1 keeps case: not a repeat
              Request("paying how", "pay"), Request("what is my balance", "balance"), Request("paying how", "pay")]
    exact, semantic = hindsight(stream)
    # "paying how" once more is exact; "How do I pay" and the first "paying how" are the label again.
    assert exact == 1 / 5
    assert semantic == 2 / 5


def test_the_worst_window_skips_the_first_requests_and_divides_by_the_windows_hits() -> None:
    report = {
        "requests": 1500,
        "windows": [{"semantic": 0.5}, {"semantic": 0.2}, {"semantic": 0.4}],
        "wrong_hits": [{"index": 10, "layer": "semantic-hit"}, {"index": 20, "layer": "semantic-hit"},
                       {"index": 600, "layer": "semantic-hit"}, {"index": 1200, "layer": "exact-hit"},
                       {"index": 1300, "layer": "semantic-hit"}],
    }
    # Windows of 500 after the first 500: 1 wrong of 100 served, then 1 of 200.
    assert worst_window(report, 500, 500) == 0.01
    # From the first request on, the first window's 2 of 250 count too.
    assert worst_window(report, 500, 0) == 0.01
    assert worst_window({**report, "wrong_hits": []}, 500, 0) == 0.0
