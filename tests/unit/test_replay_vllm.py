"""The replay benchmark's arithmetic (bench/replay_vllm.py) on a tiny made-up arm."""

from __future__ import annotations

from bench.replay_vllm import Arm, Result, pct, summary


def test_summary_counts_only_model_answers_as_upstream_work() -> None:
    arm = Arm("strata", results=[
        Result("miss", 4.0, 0.2, 1500, 100),
        Result("exact-hit", 0.002, 0.001, 0, 0),
        Result("semantic-hit", 0.01, 0.005, 0, 0),
        Result("miss", 6.0, 0.4, 1500, 140),
        Result("miss", 0.0, None, 0, 0, error="timeout"),
    ], prefix_queries=3000, prefix_hits=1500)
    row = summary(arm)
    assert row["requests"] == 5 and row["errors"] == 1
    assert row["upstream"] == 2 and row["completion_tokens"] == 240 and row["prompt_tokens"] == 3000
    assert row["layers"] == {"exact-hit": 1, "miss": 2, "semantic-hit": 1}
    assert abs(row["mean"] - (4.0 + 0.002 + 0.01 + 6.0) / 4) < 1e-9
    assert row["ttft_p50"] == 0.4 and row["prefix_ratio"] == 0.5  # TTFT of model answers only
    assert pct([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0 and pct([], 0.5) != pct([], 0.5)  # empty: NaN
