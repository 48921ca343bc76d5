"""End users' feedback on served answers, repeats of served questions, and curated answers the
model does not overrule (issue #24), against real Redis Stack, the real embedder and the fake
upstream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import redis

from tests.integration.test_learning import sem_doc
from tests.support import FakeUpstream, ask, eventually, keyspace, scan, seed_pool, serve_strata, strata_settings

LEARN = {"X-Cache-Category": "learn"}
# Signed with the first; the second is a rotated secret still accepted (app/cache/learning/receipts.py).
SECRETS = (b"feedback-test-secret-new-0123456789", b"feedback-test-secret-old-0123456789")
REFUND = "To get a refund, open the order page and press Refund; see guide 12."
INVOICE = "Invoices are under Orders, Invoice, for any order older than a day; see guide 31."


@pytest.fixture(scope="module")
def feedback_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0,
                               response_id_secrets=",".join(s.decode() for s in SECRETS))
    with serve_strata(settings, use_encoder) as server:
        yield server.url


@pytest.fixture
def strata(feedback_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return feedback_strata


def semantic_hit(strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, headers: dict[str, str],
                 cached: str, asked: str) -> httpx.Response:
    """A miss for ``cached``, then ``asked`` served from it."""
    fake_upstream.answers[cached] = REFUND
    assert ask(strata, cached, headers=headers).headers["x-cache"] == "miss"
    seed_pool(redis_sync, headers["X-Cache-Category"])
    served = ask(strata, asked, headers=headers)
    assert served.headers["x-cache"] == "semantic-hit", served.headers
    return served


def altered(response_id: str, position: int) -> str:
    """The id with one character of its token changed."""
    prefix, token = response_id[:9], response_id[9:]
    swapped = "A" if token[position] != "A" else "B"
    return prefix + token[:position] + swapped + token[position + 1:]


def feedback(strata: str, response_id: Any, verdict: str = "wrong", key: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(strata + "/v1/feedback", json={"id": response_id, "verdict": verdict, **extra}, headers=headers,
                      timeout=30)


def test_a_hits_response_id_is_in_its_body_and_header_and_names_what_served_it(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    served = semantic_hit(strata, redis_sync, fake_upstream, LEARN, "怎么申请退款", "怎么申请退款呢")
    response_id = served.json()["id"]
    assert served.headers["x-cache-response-id"] == response_id and response_id.startswith("chatcmpl-")
    # The id is the receipt: opened with the service's secret, it names what served the hit.
    from app.cache.learning.receipts import ResponseIds

    receipt = ResponseIds(SECRETS).open(response_id)
    assert receipt.layer == "semantic" and receipt.tenant == "default" and receipt.category == "learn"
    assert receipt.document.startswith("strata:") and ":sem:" in receipt.document and redis_sync.exists(receipt.document)
    assert abs(receipt.similarity - float(served.headers["x-cache-similarity"])) < 1e-3
    # Every hit has a fresh id: the same question served again is another response.
    again = ask(strata, "怎么申请退款呢", headers=LEARN)
    assert again.json()["id"] != response_id


def test_a_hit_writes_nothing_to_redis(strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    """Issue #32: an exact hit and a semantic hit (in a category that does not explore repeats)
    leave the key count as it was: nothing that grows with traffic."""
    semantic_hit(strata, redis_sync, fake_upstream, LEARN, "怎么查看物流", "怎么查看物流呢")
    def keys() -> set[bytes]:  # the per-minute usage counts are one key a minute, whatever the traffic
        return {k for k in scan(redis_sync, "strata:*") if b":meta:usage:" not in k}

    before = keys()
    for _ in range(5):
        assert ask(strata, "怎么查看物流", headers=LEARN).headers["x-cache"] == "exact-hit"
        assert ask(strata, "怎么查看物流呢", headers=LEARN).headers["x-cache"] == "semantic-hit"
    assert keys() == before


def test_an_altered_or_forged_id_is_refused(strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    served = semantic_hit(strata, redis_sync, fake_upstream, LEARN, "怎么改密码", "怎么改密码呢")
    response_id = served.json()["id"]
    token = response_id[9:]
    for position in (0, len(token) // 3, len(token) // 2, len(token) - 1):
        refused = feedback(strata, altered(response_id, position))
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_response", position
    # Signed with another secret (a client's forgery): as unknown.
    from app.cache.learning.receipts import ResponseIds

    forger = ResponseIds([b"not-the-service-secret-0123456789"])
    receipt = ResponseIds(SECRETS).open(response_id)
    forged = "chatcmpl-" + forger.seal(receipt)
    assert feedback(strata, forged).status_code == 404
    # Signed with the rotated secret (an id from before the rotation): still accepted.
    rotated = ResponseIds(SECRETS[1:]).seal(msgspec.structs.replace(receipt, nonce="00" * 8))
    assert feedback(strata, "chatcmpl-" + rotated, "right").status_code == 200
    # The untouched id still works, in the Responses and Anthropic spellings too.
    assert feedback(strata, "msg_" + token, "right").status_code == 200


def test_wrong_vetoes_the_entry_at_that_similarity_at_once_and_is_audited(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    served = semantic_hit(strata, redis_sync, fake_upstream, LEARN, "怎么开发票", "怎么开发票呢")
    given = feedback(strata, served.json()["id"], comment="I asked about invoices for last month")
    assert given.status_code == 200, given.text
    assert given.json()["verdict"] == "wrong" and "vetoed" in given.json()["applied"]
    fake_upstream.answers["怎么开发票呢"] = INVOICE
    # The same question again: not served from that entry any more (no background wait: at once).
    again = ask(strata, "怎么开发票呢", headers=LEARN)
    assert again.headers["x-cache"] == "miss" and again.json()["choices"][0]["message"]["content"] == INVOICE
    audit = [fields for _, fields in redis_sync.xrevrange("strata:meta:audit", count=20)]
    assert any(f[b"kind"] == b"feedback" and b"invoices for last month" in f[b"request"] for f in audit)


def test_one_verdict_per_response_from_its_own_tenant_only(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    served = semantic_hit(strata, redis_sync, fake_upstream, LEARN, "怎么修改收货地址", "怎么修改收货地址呀")
    response_id = served.json()["id"]
    assert feedback(strata, response_id, "right").status_code == 200
    twice = feedback(strata, response_id, "wrong")
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "feedback_exists"
    unknown = feedback(strata, "chatcmpl-" + "0" * 32)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_response"
    for bad in ({"id": response_id}, {"id": response_id, "verdict": "meh"}, {"id": "", "verdict": "wrong"},
                {"id": response_id, "verdict": "wrong", "extra": 1}):
        refused = httpx.post(strata + "/v1/feedback", json=bad, timeout=30)
        assert refused.status_code == 400 and set(refused.json()["error"]) == {"message", "type", "param", "code"}


def test_another_tenants_feedback_finds_nothing(redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream,
                                                 use_encoder: Any, tmp_path: Any) -> None:
    from app.auth import add_key

    keys_file = tmp_path / "keys.json"
    shop, _ = add_key(keys_file, "shop")
    other, _ = add_key(keys_file, "other")
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0,
                               keys_file=str(keys_file))
    fake_upstream.reset()
    fake_upstream.answers["积分有什么用"] = REFUND
    with serve_strata(settings, use_encoder) as server:
        ask(server.url, "积分有什么用", key=shop)
        served = ask(server.url, "积分有什么用", key=shop)
        assert served.headers["x-cache"] == "exact-hit"
        response_id = served.json()["id"]
        assert feedback(server.url, response_id, key=other).status_code == 404
        # Its own tenant: a wrong exact hit deletes that entry, so the model is asked again.
        done = feedback(server.url, response_id, key=shop)
        assert done.status_code == 200 and done.json()["applied"] == "deleted the exact entry"
        assert ask(server.url, "积分有什么用", key=shop).headers["x-cache"] == "miss"


def test_a_models_differing_answer_does_not_veto_a_curated_answer(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, tmp_path: Any, redis_url: str) -> None:
    import subprocess
    import sys

    from app.settings import PROJECT_ROOT

    faq = tmp_path / "curated.yaml"
    faq.write_text("- category: learn_curated\n  tenant: default\n  question: 退货运费谁出\n  variants: []\n"
                   "  answer: 质量问题由商家承担运费，无理由退货由买家承担。\n", encoding="utf-8")
    loaded = subprocess.run([sys.executable, "-m", "app.cli", "faq", "load", str(faq), "--name", "shipping"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "STRATA_REDIS_URL": redis_url,
                                 "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml"})
    assert loaded.returncode == 0, loaded.stderr
    curated = [k for k in scan(redis_sync, "strata:v1:sem:faq-*") if redis_sync.hget(k, "category") == b"learn_curated"]
    assert curated
    # A question near it that the cold category does not serve: the model answers, differently.
    fake_upstream.answers["退货运费要谁承担"] = "We do not know your shop's shipping policy."
    asked = ask(strata, "退货运费要谁承担", headers={"X-Cache-Category": "learn_curated"})
    assert asked.headers["x-cache"] == "miss"
    strata_pool = keyspace(redis_sync, "default", "learn_curated").observations_key("v1", "learn_curated", "default")
    # The comparison runs after the response: wait until it has been counted, as a curated one.
    def counted() -> bool:
        return any(line.startswith("strata_semantic_observations_total{") and 'category="learn_curated"' in line
                   and 'result="curated"' in line for line in httpx.get(strata + "/metrics", timeout=30).text.splitlines())

    assert eventually(counted)
    assert not any(redis_sync.hget(k, "wrong_above") for k in curated)
    assert not any(k.startswith(b"wrong:") for k in redis_sync.hgetall(strata_pool))


def test_the_secret_kept_in_redis_is_shared_and_restored(redis_url: str, redis_sync: redis.Redis) -> None:
    """Without STRATA_RESPONSE_ID_SECRETS, workers agree on the secret in Redis; a Redis that lost
    it gets it back from a worker, whose earlier ids stay valid."""
    import asyncio

    from redis.asyncio import Redis as AsyncRedis

    from app.cache.learning.receipts import Receipt, ResponseIds
    from app.cache.storage.keys import RESPONSE_SECRET_KEY

    async def go() -> None:
        client = AsyncRedis.from_url(redis_url.replace("redis+cluster://", "redis://").split(",")[0])
        try:
            first, second = ResponseIds(), ResponseIds()
            await first.adopt(client)
            await second.adopt(client)
            sample = Receipt(tenant="t", category="faq", version="v1", layer="exact", document="strata:v1:exact:x",
                             root="strata:v1:exact:x", issued_at=int(__import__("time").time()), nonce="00" * 8)
            assert second.open(first.seal(sample)) == sample
            await client.delete(RESPONSE_SECRET_KEY)
            await second.adopt(client)  # puts its own back
            third = ResponseIds()
            await third.adopt(client)
            assert third.open(first.seal(sample)) == sample
        finally:
            await client.aclose()

    if redis_url.startswith("redis+cluster://"):
        pytest.skip("one node's client is enough for a single key; the cluster suite covers routing")
    asyncio.run(go())


REPEATS = {"X-Cache-Category": "learn_repeats"}


def test_a_pair_served_twice_is_checked_by_the_model_and_a_wrong_one_stops_there(
        strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> None:
    """Issue #58 item 4: a wrong semantic hit is not served to every repeat of its question. Its
    second serve is checked by the model after the response; the model's differing answer vetoes
    the pair and queues it for review, and the repeats after it get the question's own answer."""
    served = semantic_hit(strata, redis_sync, fake_upstream, REPEATS, "怎么查看物流", "怎么查看物流呢")
    assert served.json()["choices"][0]["message"]["content"] == REFUND
    fake_upstream.answers["怎么查看物流呢"] = "在订单页看物流。"  # the model answers the twin otherwise
    calls = len(fake_upstream.calls)
    again = ask(strata, "怎么查看物流呢", headers=REPEATS)
    assert again.headers["x-cache"] == "semantic-hit"  # served, and checked after the response
    assert eventually(lambda: len(fake_upstream.calls) == calls + 1)
    document, _ = sem_doc(redis_sync, "怎么查看物流")
    assert eventually(lambda: int(redis_sync.hget(document, "wrong_above") or -1) > 0)
    for _ in range(3):
        repeat = ask(strata, "怎么查看物流呢", headers=REPEATS)
        assert repeat.json()["choices"][0]["message"]["content"] == "在订单页看物流。", repeat.headers
    assert len(fake_upstream.calls) <= calls + 2  # the repeats cost the model one call at most
    # The check disagreed: people see the pair in the review queue.
    queued = [k for k in scan(redis_sync, "strata:v1:review-item:*") if redis_sync.hget(k, "asked") == "怎么查看物流呢".encode()]
    assert queued and redis_sync.hget(queued[0], "reason") == b"check_disagreed"
    # A pair that checks out is not checked again.
    fake_upstream.answers["怎么查看余额"] = fake_upstream.answers["怎么查看余额呢"] = REFUND
    semantic_hit(strata, redis_sync, fake_upstream, REPEATS, "怎么查看余额", "怎么查看余额呢")
    checked = len(fake_upstream.calls)
    assert ask(strata, "怎么查看余额呢", headers=REPEATS).headers["x-cache"] == "semantic-hit"
    assert eventually(lambda: len(fake_upstream.calls) == checked + 1)
    # Its repeats are served the answer the pair was served, from the cache (the check's own answer
    # is not written as the question's exact entry), and checked no more.
    for _ in range(2):
        repeat = ask(strata, "怎么查看余额呢", headers=REPEATS)
        assert repeat.headers["x-cache"] == "semantic-hit" and repeat.json()["choices"][0]["message"]["content"] == REFUND
    assert len(fake_upstream.calls) == checked + 1
