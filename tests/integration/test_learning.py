"""The adaptive semantic layer against real Redis Stack, the real embedder and the fake upstream:
observations, the per-entry veto, aliases (scope, cap, expiry, version bump), two workers, and
`strata replay --simulate`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.replay.simulate import run_simulated
from app.replay.streams import Request
from app.settings import Settings
from tests.support import ADMIN_TOKEN, FakeUpstream, ask, eventually, keyspace, scan, seed_pool, serve_strata, strata_settings

LEARN = {"X-Cache-Category": "learn"}
REFUND = "To get a refund, open the order page and press Refund; see guide 12."
LIMIT = "Credit limits are raised in the app under Cards, Limits, after a review."
PROGRESS = "Refund progress is on the order page under Status, updated within 3 days; see guide 40."


@pytest.fixture
def strata(learning_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return learning_strata


def pool_key(redis_sync: redis.Redis, category: str = "learn", tenant: str = "default") -> str:
    """The key of a tenant's pooled observations in a category (its bucket on a cluster)."""
    return keyspace(redis_sync, tenant, category).observations_key("v1", category, tenant)


def pool_counts(redis_sync: redis.Redis, category: str = "learn") -> dict[str, int]:
    return {k.decode(): int(v) for k, v in redis_sync.hgetall(pool_key(redis_sync, category)).items()}


def sem_doc(redis_sync: redis.Redis, question: str) -> tuple[str, dict[str, bytes]]:
    for key in scan(redis_sync, "strata:v1:sem:*"):
        fields = redis_sync.hgetall(key)
        if fields.get(b"question") == question.encode():
            return key.decode(), {k.decode(): v for k, v in fields.items()}
    raise AssertionError(f"no semantic document for {question!r}")


def forget_question(redis_sync: redis.Redis, question: str) -> None:
    """Drop both layers' entries of one question, so it is looked up again semantically."""
    for pattern in ("strata:v1:sem:*", "strata:v1:exact:*"):
        for key in scan(redis_sync, pattern):
            if redis_sync.hget(key, "question") == question.encode():
                redis_sync.delete(key)


def test_an_answered_miss_is_an_observation_and_an_equivalent_answer_an_alias(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.answers.update({"怎么申请退款": REFUND, "退款怎么申请": "Open the order page and press Refund (guide 12)."})
    assert ask(strata, "怎么申请退款", headers=LEARN).headers["x-cache"] == "miss"
    # No evidence yet: the nearest candidate is not served, the model answers and Strata learns.
    assert ask(strata, "退款怎么申请", headers=LEARN).headers["x-cache"] == "miss"
    counts = eventually(lambda: pool_counts(redis_sync))
    assert sum(v for k, v in counts.items() if k.startswith("ok:")) == 1 and not any(k.startswith("wrong:") for k in counts)
    entry_key, entry = sem_doc(redis_sync, "怎么申请退款")
    alias_key, alias = eventually(lambda: (d := sem_doc(redis_sync, "退款怎么申请"))[1].get("root") == entry_key.encode() and d)
    assert alias["answer"] == entry["answer"] and alias["scope"] == entry["scope"]  # the entry's answer, same scope
    assert int(redis_sync.hget(entry_key, "aliases")) == 1
    ok_field = next(k for k in counts if k.startswith("ok:"))
    assert int(redis_sync.hget(entry_key, ok_field)) == 1  # counted on the candidate and in the pool
    assert abs(redis_sync.ttl(alias_key) - redis_sync.ttl(entry_key)) <= 1  # it expires with its entry
    assert redis_sync.ttl(pool_key(redis_sync)) > 0  # the pool has a TTL too: eviction and sweeps can reach it


def test_a_wrong_observation_at_a_similarity_vetoes_serving_there(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.answers.update({"怎么申请退款": REFUND, "怎么查询退款进度": PROGRESS})
    ask(strata, "怎么申请退款", headers=LEARN)
    assert ask(strata, "怎么查询退款进度", headers=LEARN).headers["x-cache"] == "miss"
    entry_key, _ = sem_doc(redis_sync, "怎么申请退款")
    wrong_at = eventually(lambda: redis_sync.hget(entry_key, "wrong_above"))
    assert wrong_at is not None and any(k.startswith("wrong:") for k in pool_counts(redis_sync))
    # Now the category's evidence says "serve anywhere"; the entry's own wrong observation still says no.
    seed_pool(redis_sync)
    forget_question(redis_sync, "怎么查询退款进度")
    again = ask(strata, "怎么查询退款进度", headers=LEARN)
    assert again.headers["x-cache"] == "miss" and again.json()["choices"][0]["message"]["content"] == PROGRESS
    # A paraphrase above the wrong similarity is served: the veto is where the entry was wrong.
    served = ask(strata, "怎么申请退款呢", headers=LEARN)
    assert served.headers["x-cache"] == "semantic-hit" and served.headers["x-cache-verdict"] == "within_bound"
    assert float(served.headers["x-cache-similarity"]) * 1000 > int(wrong_at)


def test_aliases_are_scoped_capped_and_go_with_a_version_bump(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    variants = ["怎么申请退款", "退款怎么申请", "如何申请退款", "申请退款怎么弄"]
    fake_upstream.answers.update({v: REFUND for v in variants})
    for question in variants:
        ask(strata, question, headers=LEARN)
        time.sleep(0.2)  # one observation at a time: each paraphrase meets the aliases before it
    entry_key, _ = sem_doc(redis_sync, variants[0])
    assert eventually(lambda: int(redis_sync.hget(entry_key, "aliases") or 0) == 2)  # max_aliases: 2
    roots = [sem_doc(redis_sync, v)[1].get("root") for v in variants]
    assert sum(1 for r in roots if r == entry_key.encode()) == 3  # the entry itself and its two aliases
    # Another scope (its own system prompt) sees none of them.
    other = ask(strata, "退款怎么申请", headers=LEARN, system="another bot")
    assert other.headers["x-cache"] == "miss"
    response = httpx.post(strata + "/admin/cache/invalidate", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    assert eventually(lambda: not list(scan(redis_sync, "strata:v1:*")), timeout=10)


def test_observations_of_two_workers_add_up(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream,
                                            use_encoder: Any) -> None:
    fake_upstream.reset()
    questions = ["怎么申请退款", "退款怎么申请", "如何申请退款"]
    fake_upstream.answers.update({q: REFUND for q in questions})
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0)
    with serve_strata(settings, use_encoder) as one, serve_strata(settings, use_encoder) as two:
        ask(one.url, questions[0], headers=LEARN)
        ask(one.url, questions[1], headers=LEARN)
        eventually(lambda: sum(pool_counts(redis_sync).values()) == 1)
        ask(two.url, questions[2], headers=LEARN)
        counts = eventually(lambda: (c := pool_counts(redis_sync)) and sum(c.values()) == 2 and c)
    assert counts and sum(counts.values()) == 2


def test_replay_simulate_gives_the_same_counts_twice(tmp_path: Path, use_encoder: Any) -> None:
    stream = [Request(text=t, label=label) for t, label in [
        ("how do i reset my pin", "pin"), ("i need to change my pin", "pin"), ("what is my balance", "balance"),
        ("how much money do i have", "balance"), ("change my pin number please", "pin"), ("what is my balance", "balance"),
        ("show my account balance", "balance"), ("please reset the pin on my card", "pin"),
    ] * 3]
    settings = Settings.from_flat({"policy_file": "tests/fixtures/policy.yaml", "log_level": "warning"})
    first = run_simulated(stream, settings=settings, category="learn", encoder=use_encoder)
    second = run_simulated(stream, settings=settings, category="learn", encoder=use_encoder)
    assert [o.layer for o in first.outcomes] == [o.layer for o in second.outcomes]
    assert first.count("exact-hit") >= 10 and first.errors == 0
    assert first.wrong("exact-hit") == 0


JUDGED = {"X-Cache-Category": "learn_judged"}


@pytest.mark.parametrize(("reply", "result"), [("yes", "ok"), ("no", "wrong")])
def test_the_async_judge_decides_the_observation_after_the_response(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, reply: str, result: str) -> None:
    fake_upstream.judge_reply = reply
    ask(strata, "怎么申请退款", headers=JUDGED)
    # The generated answers differ in wording and numbers: only the judge's word can make them one.
    assert ask(strata, "退款怎么申请", headers=JUDGED).headers["x-cache"] == "miss"
    counts = eventually(lambda: pool_counts(redis_sync, "learn_judged"))
    assert sum(v for k, v in counts.items() if k.startswith(result + ":")) == 1 and len(counts) == 1
    assert fake_upstream.judge_calls == [("怎么申请退款", "退款怎么申请")]
    entry_key, _ = sem_doc(redis_sync, "怎么申请退款")
    root = eventually(lambda: sem_doc(redis_sync, "退款怎么申请")[1].get("root") == entry_key.encode()) if reply == "yes" else None
    assert bool(root) == (reply == "yes")  # a yes makes the new question an alias, a no does not


def test_the_learning_queue_is_bounded(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream,
                                       use_encoder: Any) -> None:
    fake_upstream.reset()
    fake_upstream.judge_delay = 2.0  # one request waiting for the judge would take longer than the bound below
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_max_pending=1,
                               judge_timeout_s=5.0)
    with serve_strata(settings, use_encoder) as server:
        ask(server.url, "怎么申请退款", headers=JUDGED)
        started = time.monotonic()
        for question in ("退款怎么申请", "如何申请退款", "申请退款怎么弄"):
            assert ask(server.url, question, headers=JUDGED).headers["x-cache"] == "miss"
        assert time.monotonic() - started < 1.5  # nobody waited for the judge
        metrics = httpx.get(server.url + "/metrics").text
    assert 'strata_semantic_observations_total{category="learn_judged",explored="false",result="dropped"}' in metrics


ENTRY = {"X-Cache-Category": "learn_entry"}


def test_an_entry_confirmed_below_a_score_vouches_for_it_there(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    fake_upstream.answers.update({q: REFUND for q in ("怎么申请退款", "退款怎么申请", "如何申请退款")})
    ask(strata, "怎么申请退款", headers=ENTRY)
    # Too few observations in the pool and no record yet: a miss, whose equivalent answer is
    # counted on the entry's own record (confirmed:<bin>), not only on the pool.
    assert ask(strata, "退款怎么申请", headers=ENTRY).headers["x-cache"] == "miss"
    entry_key, _ = sem_doc(redis_sync, "怎么申请退款")
    record = eventually(lambda: {k.decode(): int(v) for k, v in redis_sync.hgetall(entry_key).items()
                                 if k.startswith(b"confirmed:")})
    assert sum(record.values()) == 1
    # Confirmed often enough at a score below any paraphrase's: the entry vouches.
    redis_sync.hset(entry_key, "confirmed:050", 3)
    served = ask(strata, "如何申请退款", headers=ENTRY)
    assert served.headers["x-cache"] == "semantic-hit" and served.headers["x-cache-verdict"] == "entry_record"
    assert len(fake_upstream.calls) == 2
    # Wrong once close below this similarity: the entry no longer vouches there.
    similarity = float(served.headers["x-cache-similarity"])
    redis_sync.hset(entry_key, "wrong_above", int(similarity * 1000) - 20)
    forget_question(redis_sync, "如何申请退款")
    again = ask(strata, "如何申请退款", headers=ENTRY)
    assert again.headers["x-cache"] == "miss"


def test_replay_simulate_with_curated_answers_counts_their_hits_by_label(use_encoder: Any) -> None:
    from app.faq import FaqItem
    from app.replay.streams import curated_answer

    stream = [Request(text="how do i reset my pin", label="pin"), Request(text="what is my balance", label="balance")]
    # The second curated answer is another label's: serving it for "what is my balance" is wrong.
    faq = [FaqItem(category="faq", question="how do i reset my pin", answer=curated_answer("pin")),
           FaqItem(category="faq", question="what is my balance", answer=curated_answer("checking"))]
    settings = Settings.from_flat({"policy_file": "tests/fixtures/policy.yaml", "log_level": "warning"})
    report = run_simulated(stream, settings=settings, category="faq", encoder=use_encoder, faq=faq)
    right, wrong = report.outcomes
    assert right.layer == "semantic-hit" and right.served_label == "pin" and not right.wrong
    assert wrong.layer == "semantic-hit" and wrong.served_label == "faq:what is my balance" and wrong.wrong
    assert report.wrong("semantic-hit") == 1


def test_two_entries_of_one_answer_are_merged_by_a_miss_that_matches_both(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    first, second, third = "怎么申请退款", "退款怎么申请", "如何申请退款"
    fake_upstream.answers.update({q: REFUND for q in (first, second, third)})
    # Asked at the same moment, neither finds the other: one answer, two entries.
    merges_before = merges(strata)
    fake_upstream.delay = 0.5
    with ThreadPoolExecutor(2) as pool:
        assert [r.headers["x-cache"] for r in pool.map(lambda q: ask(strata, q, headers=LEARN), (first, second))] == ["miss"] * 2
    fake_upstream.delay = 0.0
    (first_key, _), (second_key, _) = sem_doc(redis_sync, first), sem_doc(redis_sync, second)
    assert redis_sync.hget(first_key, "root") == first_key.encode() and redis_sync.hget(second_key, "root") == second_key.encode()
    # A third phrasing meets one of them as its candidate and the other as a neighbour; the
    # model's answer matches both, so the neighbour is merged into the candidate's entry.
    assert ask(strata, third, headers=LEARN).headers["x-cache"] == "miss"
    third_key, _ = sem_doc(redis_sync, third)
    roots = eventually(lambda: len(r := {redis_sync.hget(k, "root") for k in (first_key, second_key, third_key)}) == 1 and r)
    assert roots, "the three documents did not end up in one entry"
    entry = roots.pop().decode()
    merged = second_key if entry == first_key else first_key
    assert int(redis_sync.hget(entry, "aliases")) == 2 and redis_sync.hget(merged, "aliases") is None
    assert sum(int(v) for k, v in redis_sync.hgetall(entry).items() if k.startswith(b"confirmed:")) == 1
    assert merges(strata) == merges_before + 1
    # The merged documents belong to the entry now: invalidating it by key removes all three.
    response = httpx.post(strata + "/admin/cache/invalidate", json={"key": entry},
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200, response.text
    assert not any(redis_sync.exists(k) for k in (first_key, second_key, third_key))


def merges(strata: str) -> float:
    for line in httpx.get(strata + "/metrics").text.splitlines():
        if line.startswith('strata_semantic_entry_merges_total{category="learn"}'):
            return float(line.split()[-1])
    return 0.0


def test_entries_are_not_merged_past_the_alias_cap(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    first, second, third = "怎么申请退款", "退款怎么申请", "如何申请退款"
    fake_upstream.answers.update({q: REFUND for q in (first, second, third)})
    fake_upstream.delay = 0.5
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda q: ask(strata, q, headers=LEARN), (first, second)))
    fake_upstream.delay = 0.0
    keys = [sem_doc(redis_sync, q)[0] for q in (first, second)]
    for key in keys:  # both entries already hold their two aliases (max_aliases: 2)
        redis_sync.hset(key, "aliases", 2)
    ask(strata, third, headers=LEARN)
    eventually(lambda: any(k.startswith("ok:") for k in pool_counts(redis_sync)))
    time.sleep(0.3)
    assert [redis_sync.hget(k, "root") for k in keys] == [k.encode() for k in keys]



def test_a_check_marks_the_entry_only_when_its_question_is_read_as_the_checked_intent(
        redis_url: str, redis_sync: redis.Redis) -> None:
    """A check is of the document's intent: an alias read as a twin of its entry's intent is
    checked (or refuted) for itself; its entry is marked only when the head read both as one."""
    import asyncio

    from app.cache.learning.observations import ObservationWriter

    entry, twin, same = "{check}:entry", "{check}:twin", "{check}:same"
    expires = int(time.time()) + 3600
    redis_sync.hset(entry, mapping={"intent": "goodbye", "question": "it was great talking to you", "root": entry,
                                    "answer": "Goodbye!", "expires_at": expires})
    redis_sync.hset(twin, mapping={"intent": "thank_you", "question": "thanks, bye", "root": entry})
    redis_sync.hset(same, mapping={"intent": "goodbye", "question": "bye for now", "root": entry})

    def client() -> Any:
        if redis_url.startswith("redis+cluster://"):
            from redis.asyncio.cluster import RedisCluster

            host, port = redis_url.removeprefix("redis+cluster://").split(",")[0].split(":")
            return RedisCluster(host=host, port=int(port))
        from redis.asyncio import Redis as AsyncRedis

        return AsyncRedis.from_url(redis_url)

    async def mark(document: str, *, right: bool) -> None:
        redis_client = client()
        try:
            await ObservationWriter(redis_client).mark_intent(document, entry, right=right)
        finally:
            await redis_client.aclose()

    async def approve(document: str, asked_document: str) -> bool:
        """A reviewer approves the pair of a check that disagreed (the console's review queue)."""
        from app.cache.decision.verify import CHECK_DISAGREED
        from app.cache.learning.learner import AnswerLearner
        from app.cache.learning.review import ReviewItem
        from app.policy import AdaptiveSemantic

        redis_client = client()
        try:
            item = ReviewItem(id="x", tenant="default", category="faq", asked="i am grateful for the help",
                              asked_document=asked_document, asked_answer="You're welcome!", cached="thanks, bye",
                              document=document, root=entry, cached_answer="Goodbye!", similarity=0.7, score_bin=70,
                              reason=CHECK_DISAGREED)
            learner = AnswerLearner(redis_client, embedder=None, analyzer=None)  # type: ignore[arg-type]
            return await learner.settle_review("v1", item, True, AdaptiveSemantic(error_bound=0.01, max_aliases=8))
        finally:
            await redis_client.aclose()

    asyncio.run(mark(twin, right=False))
    assert redis_sync.hget(twin, "intent_refuted") == b"1"
    assert redis_sync.hget(entry, "intent_refuted") is None  # `goodbye`'s askers keep their answer
    # A reviewer's approval of that check marks as a check does: the alias, not its entry.
    asked = "{check}:asked"
    redis_sync.hset(asked, mapping={"question": "i am grateful for the help", "intent": "thank_you"})
    assert asyncio.run(approve(twin, asked))
    assert redis_sync.hget(twin, "intent_checked") == b"1" and redis_sync.hget(twin, "intent_refuted") is None
    assert redis_sync.hget(entry, "intent_checked") is None
    asyncio.run(mark(same, right=True))
    assert redis_sync.hget(same, "intent_checked") == b"1" and redis_sync.hget(entry, "intent_checked") == b"1"
