"""`strata calibrate` on small fixture files, and the service deciding exactly as `evaluate` does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.cache.decision.verify import load_verifier
from app.calibrate.evaluate import evaluate, similarities, verify_all
from app.calibrate.pairs import Pair
from app.policy import Policy
from app.settings import Settings
from tests.support import MODEL, FakeUpstream, run_cli, serve_strata, strata_settings

LAST_LINE = re.compile(r"^precision=(\d\.\d{4}) recall=(\d\.\d{4}) hits=(\d+) positives=(\d+) pairs=(\d+)$")
PAIRS = [
    ("怎么申请退款", "退款怎么申请", 1),
    ("怎么退款", "怎么开发票", 0),
    ("怎么开通花呗", "怎么关闭花呗", 0),
    ("How do I reset my password?", "How can I reset my password?", 1),
    ("How do I reset my password?", "How do I change my username?", 0),
    ("退款100元多久到账", "退款200元多久到账", 0),
    ("What are your opening hours?", "When are you open?", 1),
]


strata = run_cli


def write(path: Path, rows: list[tuple[str, str, int]], bom: bool = True) -> Path:
    text = "sentence1,sentence2,label\n" + "".join(f"{a},{b},{label}\n" for a, b, label in rows)
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
    return path


def test_evaluate_prints_the_exact_last_line(tmp_path: Path) -> None:
    result = strata("calibrate", "evaluate", "--pairs", str(write(tmp_path / "p.csv", PAIRS)), "--category", "general")
    assert result.returncode == 0, result.stderr
    match = LAST_LINE.match(result.stdout.strip().splitlines()[-1])
    assert match, result.stdout
    precision, recall, hits, positives, pairs = match.groups()
    assert (int(positives), int(pairs)) == (3, 7)
    assert 0 < int(hits) <= 3 and float(precision) == 1.0  # the guards reject all four hard negatives
    assert float(recall) == pytest.approx(int(hits) / 3, abs=1e-4)


def test_no_hits_means_precision_one(tmp_path: Path) -> None:
    rows = [("怎么退款", "怎么开发票", 0), ("花呗怎么还款", "借呗怎么还款", 0)]
    result = strata("calibrate", "evaluate", "--pairs", str(write(tmp_path / "p.csv", rows, bom=False)))
    assert result.stdout.strip().splitlines()[-1] == "precision=1.0000 recall=0.0000 hits=0 positives=0 pairs=2"


@pytest.mark.parametrize(("content", "message"), [
    (b"question,answer,label\na,b,1\n", "missing column"),
    (b"sentence1,sentence2,label\na,b,2\n", "label must be 0 or 1"),
    (b"sentence1,sentence2,label\n", "no pairs"),
    (b"", "missing column"),
    ("sentence1,sentence2,label\n怎么退款,怎么开发票,0\n".encode("gbk"), "not UTF-8"),
])
def test_bad_pairs_files_exit_2_with_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    for step in (["evaluate"], ["fit", "--target-precision", "0.99"]):
        result = strata("calibrate", *step, "--pairs", str(path))
        assert result.returncode == 2
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_file_and_unknown_category_exit_2(tmp_path: Path) -> None:
    assert strata("calibrate", "evaluate", "--pairs", str(tmp_path / "none.csv")).returncode == 2
    result = strata("calibrate", "evaluate", "--pairs", str(write(tmp_path / "p.csv", PAIRS)), "--category", "nope")
    assert result.returncode == 2 and "unknown category" in result.stderr


def test_fit_recommends_a_policy_and_draws_the_trade_off(tmp_path: Path) -> None:
    rows = PAIRS * 4 + [(f"How do I reset my password {i}?", f"How can I reset my password {i}?", 1) for i in range(30)]
    plot = tmp_path / "pr.png"
    pairs = str(write(tmp_path / "p.csv", rows))
    # 30-odd right hits are too few to claim 0.99 one standard error down (Wilson bound 30/31)...
    cautious = strata("calibrate", "fit", "--pairs", pairs, "--target-precision", "0.99", "--category", "faq",
                      "--plot", str(plot))
    assert cautious.returncode == 0, cautious.stderr
    assert "no policy reaches precision 0.99 (margin 1)" in cautious.stdout and not plot.exists()
    # ...but enough for the point precision.
    result = strata("calibrate", "fit", "--pairs", pairs, "--target-precision", "0.99", "--margin", "0",
                    "--category", "faq", "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    assert "cosine alone at precision >= 0.99 (best threshold)" in result.stdout
    assert re.search(r"faq:\n\s+semantic: \{enabled: true, threshold: 0\.\d\d, accept_above: [01]\.\d+, min_probability: 0\.\d+\}",
                     result.stdout), result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_service_decides_exactly_as_evaluate(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    category = Policy.load(settings.resolve(settings.policy_file)).categories["general"]
    pairs = [Pair(cached=a, asked=b, label=label) for a, b, label in PAIRS]
    offline = []
    verifier = load_verifier(Settings())
    for pair, similarity in zip(pairs, similarities(pairs, use_encoder), strict=True):
        offline.append(evaluate([pair], verify_all([pair], [similarity], verifier, category.semantic))[0].hits == 1)
    served = []
    with serve_strata(settings, use_encoder) as server:
        for index, pair in enumerate(pairs):
            # Each pair in a scope of its own (its own system prompt), as `evaluate` assumes.
            def ask(text: str, index: int = index) -> httpx.Response:
                messages = [{"role": "system", "content": f"pair {index}"}, {"role": "user", "content": text}]
                return httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": messages},
                                  headers={"X-Cache-Category": "general"}, timeout=10)
            ask(pair.cached)
            served.append(ask(pair.asked).headers["x-cache"] == "semantic-hit")
        metrics = httpx.get(server.url + "/metrics").text
    assert served == offline
    assert any(served) and not all(served)
    assert 'strata_semantic_verifications_total{decision="reject",reason="numbers_differ"}' in metrics


def test_evaluate_asks_the_llm_judge_like_the_service(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    pairs = str(write(tmp_path / "p.csv", PAIRS))
    env = {"STRATA_UPSTREAM_URL": fake_upstream.url + "/v1"}
    fake_upstream.judge_reply = "Yes."
    trusting = strata("calibrate", "evaluate", "--pairs", pairs, "--category", "judged", env=env)
    assert trusting.returncode == 0, trusting.stderr
    calls = len(fake_upstream.judge_calls)
    assert calls >= 1 and f"LLM judge: {calls} calls" in trusting.stdout and "judge_accepted=" in trusting.stdout
    # Only what the verifier accepted in the band reaches the judge, as the normalised question pair.
    assert set(fake_upstream.judge_calls) <= {(a, b) for a, b, _ in PAIRS}
    fake_upstream.judge_reply = "no"
    vetoed = strata("calibrate", "evaluate", "--pairs", pairs, "--category", "judged", env=env)
    assert LAST_LINE.match(vetoed.stdout.strip().splitlines()[-1]).group(3) == "0"  # type: ignore[union-attr]
    assert f"judge_rejected={calls}" in vetoed.stdout
    unreachable = strata("calibrate", "evaluate", "--pairs", pairs, "--category", "judged",
                         env={"STRATA_UPSTREAM_URL": "http://127.0.0.1:9/v1", "STRATA_UPSTREAM_MAX_RETRIES": "0"})
    assert unreachable.returncode == 2 and len(unreachable.stderr.strip().splitlines()) == 1
    assert "uses the LLM judge" in unreachable.stderr


def test_evaluate_every_kth_pair(tmp_path: Path) -> None:
    pairs = str(write(tmp_path / "p.csv", PAIRS))
    sample = strata("calibrate", "evaluate", "--pairs", pairs, "--every", "2")
    assert sample.returncode == 0, sample.stderr
    assert LAST_LINE.match(sample.stdout.strip().splitlines()[-1]).group(5) == "4"  # type: ignore[union-attr]
    assert strata("calibrate", "evaluate", "--pairs", pairs, "--every", "0").returncode == 2
