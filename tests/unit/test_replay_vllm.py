"""The replay benchmark's arithmetic (bench/replay_vllm.py) on a tiny made-up arm."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.replay_vllm import Arm, Result, curated_intents, pct, summary, taught


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


def test_an_intents_file_names_the_intent_of_each_curated_answer_and_of_each_taught_question(tmp_path: Path) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(yaml.safe_dump([
        {"intent": "balance", "phrasings": ["what is my balance", "how much money do i have"], "answer": "Balance: see guide 1."},
        {"intent": "calories", "phrasings": ["calories in an apple", "how fattening is cake"], "shared": False},
    ]), encoding="utf-8")
    assert curated_intents(None, tmp_path / "unused.csv", str(team)) == {"Balance: see guide 1.": "balance"}
    arm = Arm("strata", results=[Result("miss", 1.0, 0.1, 10, 10, question=q)
                                 for q in (" what is my balance ", "calories in an apple", "balance please")])
    assert taught(str(team), arm) == 2  # word for word (trimmed); a new wording is not taught
