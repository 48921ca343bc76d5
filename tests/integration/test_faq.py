"""Curated answers (`strata faq load`) against real Redis Stack, the real embedder and the
command as a user runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import FakeUpstream, ask, every_keyspace, run_cli, scan, serve_strata, strata_settings

GENERAL = {"X-Cache-Category": "general"}
FAQ_FILE = """
- category: general
  question: 怎么申请退款
  variants: [退款怎么申请, 如何申请退款]
  answer: 在订单页面点击"申请退款"，三个工作日内到账。
- category: general
  tenant: shop-b
  question: How do I return an item?
  answer: Print the label from your orders page and drop the parcel at any post office.
"""


@pytest.fixture(scope="module")
def faq_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    with serve_strata(strata_settings(redis_url, fake_upstream.url, semantic_enabled=True), use_encoder) as server:
        yield server.url


def faq_members(redis_sync: redis.Redis, name: str) -> set[str]:
    """The keys a curated file wrote, in every keyspace (a cluster keeps a set per bucket)."""
    return {m.decode() for keys in every_keyspace(redis_sync) for m in redis_sync.smembers(keys.faq_set_key("v1", name))}


def load(path: Path, redis_url: str, *extra: str) -> Any:
    return run_cli("faq", "load", str(path), *extra, env={"STRATA_REDIS_URL": redis_url})


def test_curated_answers_serve_their_questions_and_variants_in_any_model(
        faq_strata: str, redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    fake_upstream.reset()
    path = tmp_path / "shop.yaml"
    path.write_text(FAQ_FILE, encoding="utf-8")
    result = load(path, redis_url)
    assert result.returncode == 0, result.stderr
    assert "loaded 2 curated answers and 2 variants" in result.stdout
    for question, model in (("怎么申请退款", "model-a"), ("如何申请退款", "model-b"), ("退款怎么申请呢", "model-c")):
        response = ask(faq_strata, question, headers=GENERAL, model=model)
        assert response.headers["x-cache"] == "semantic-hit" and response.headers["x-cache-source"] == "faq"
        body = response.json()
        assert body["model"] == model and body["choices"][0]["message"]["content"].startswith("在订单页面")
    # shop-b's answer is not the default tenant's; nor do curated answers leak to another category.
    assert ask(faq_strata, "How do I return an item?", headers=GENERAL).headers["x-cache-source"] == "model"
    assert ask(faq_strata, "怎么申请退款", headers={"X-Cache-Category": "short"}).headers["x-cache"] == "miss"
    assert not fake_upstream.judge_calls
    members = faq_members(redis_sync, "shop")
    prefixes = tuple(keys.semantic_prefix("v1") + "faq-" for keys in every_keyspace(redis_sync))
    assert len(members) == 4 and all(m.startswith(prefixes) for m in members)
    # Variants vouch for nothing: neither in the category's pool nor among the confirmations that
    # let an entry vouch (hand-picked positives say nothing of what lands near the entry).
    entries = [m for m in members if redis_sync.hget(m, "question") in ("怎么申请退款".encode(),)]
    fields = redis_sync.hgetall(entries[0])
    assert not any(k.startswith((b"confirmed:", b"ok:", b"curated:")) for k in fields)
    assert not any(redis_sync.exists(keys.observations_key("v1", "general")) for keys in every_keyspace(redis_sync))

    # Reloading replaces the file's entries: the old answer and its keys are gone at once.
    path.write_text(FAQ_FILE.replace("三个工作日", "五个工作日").replace("[退款怎么申请, 如何申请退款]", "[退款怎么申请]"),
                    encoding="utf-8")
    assert load(path, redis_url).returncode == 0
    assert "五个工作日" in ask(faq_strata, "如何申请退款呀", headers=GENERAL).json()["choices"][0]["message"]["content"]
    reloaded = faq_members(redis_sync, "shop")
    assert len(reloaded) == 3 and members - reloaded and not any(redis_sync.exists(m) for m in members - reloaded)


def test_a_bad_file_exits_2_and_changes_nothing(redis_url: str, redis_sync: redis.Redis, tmp_path: Path) -> None:
    good = tmp_path / "shop.yaml"
    good.write_text(FAQ_FILE, encoding="utf-8")
    assert load(good, redis_url).returncode == 0
    def stored() -> list[bytes]:
        # Every key but what the module's running server keeps writing by itself: usage and layer
        # counts, and its response-id secret, adopted again after the suite's flush (on a busy
        # machine that may land between the two reads).
        return sorted(k for k in scan(redis_sync, "strata:*")
                      if not k.startswith((b"strata:meta:usage:", b"strata:meta:layers:", b"strata:meta:response_id_secret")))

    before = stored()
    for text, message in ((FAQ_FILE.replace("category: general", "category: nowhere", 1), "unknown category"),
                          ("- {category: general, question: '', answer: x}", "must not be empty"),
                          ("- {category: general, question: q, answer: a, colour: red}", "colour"),
                          ("not: [a list", "shop.yaml")):
        good.write_text(text, encoding="utf-8")
        result = load(good, redis_url)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    bad_csv = tmp_path / "shop.csv"
    bad_csv.write_text("category,question\ngeneral,q\n", encoding="utf-8")
    assert load(bad_csv, redis_url, "--name", "shop").returncode == 2
    assert load(good, redis_url, "--name", "../escape").returncode == 2
    assert stored() == before
