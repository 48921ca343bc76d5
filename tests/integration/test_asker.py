"""Only the asker's answer: users, word order, look-alike characters, content parts, tool calls,
each tenant's own learning, no-cache, side channels. One regression test per way an answer that
was not the asker's got served, in English and Chinese, on a real Redis Stack with the real
embedder, two tenants (a keys file) and the fake upstream; the user scope also over two workers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import add_key
from tests.support import (
    ADMIN_TOKEN,
    MODEL,
    FakeUpstream,
    ask,
    eventually,
    free_port,
    serve_process,
    serve_strata,
    stop_process,
    strata_settings,
)

MINE = {"X-Cache-Category": "mine"}  # scope: user (tests/fixtures/policy.yaml)
GENERAL = {"X-Cache-Category": "general"}
LEARN = {"X-Cache-Category": "learn"}


class Keys:
    """Tenant acme: a tenant-wide key, a key allowed to refresh, and keys of users u1 and u2;
    tenant globex: a tenant-wide key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.acme, _ = add_key(path, "acme")
        self.acme_refresher, _ = add_key(path, "acme", may_refresh=True)
        self.u1, _ = add_key(path, "acme", user="u1")
        self.u2, _ = add_key(path, "acme", user="u2")
        self.globex, _ = add_key(path, "globex")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("asker") / "keys.json")


@pytest.fixture(scope="module")
def asker_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, keys: Keys) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, keys_file=str(keys.path),
                               learning_refresh_s=0.0)
    with serve_strata(settings, use_encoder) as server:
        yield server.url


@pytest.fixture
def strata(asker_strata: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return asker_strata


def outcome(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["x-cache"]


def content(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:\{{(?P<labels>[^}}]*)\}})? (?P<value>\S+)$", line)
        if match and all(part in (match["labels"] or "").split(",") for part in wanted.split(",") if part):
            total += float(match["value"])
    return total


# --- personal data across users -----------------------------------------------------------------


@pytest.mark.parametrize(("question", "paraphrase"), [
    ("What is my account balance?", "How much money is in my account?"),
    ("我的账户余额是多少", "我账户里还有多少钱"),
])
def test_a_users_answer_is_never_served_to_another_user_of_the_tenant(
    strata: str, fake_upstream: FakeUpstream, keys: Keys, question: str, paraphrase: str
) -> None:
    as_u1 = {**MINE, "X-Cache-User": "u1"}
    assert outcome(ask(strata, question, key=keys.acme, headers=as_u1)) == "miss"
    assert outcome(ask(strata, question, key=keys.acme, headers=as_u1)) == "exact-hit"
    # Another user of the same tenant: by header, by the OpenAI `user` field, by their own key.
    assert outcome(ask(strata, question, key=keys.acme, headers={**MINE, "X-Cache-User": "u5"})) == "miss"
    assert outcome(ask(strata, question, key=keys.acme, headers=MINE, user="u3")) == "miss"
    assert outcome(ask(strata, question, key=keys.u2, headers=MINE)) == "miss"
    # A user's own key decides: a header naming another user does not make it that user.
    assert outcome(ask(strata, question, key=keys.u2, headers=as_u1)) == "exact-hit"  # u2's own entry
    assert outcome(ask(strata, question, key=keys.u1, headers={**MINE, "X-Cache-User": "u2"})) == "exact-hit"  # u1's
    # Nor does a paraphrase reach another user's entry semantically.
    assert outcome(ask(strata, paraphrase, key=keys.acme, headers={**MINE, "X-Cache-User": "u4"})) == "miss"
    # No identity: not cached at all (counted), however often asked.
    before = metric(strata, "strata_uncached_total", category="mine", reason="no_user")
    assert outcome(ask(strata, question, key=keys.acme, headers=MINE)) == "bypass"
    assert outcome(ask(strata, question, key=keys.acme, headers=MINE)) == "bypass"
    assert metric(strata, "strata_uncached_total", category="mine", reason="no_user") == before + 2
    assert len(fake_upstream.calls) == 7


def test_a_users_answers_are_invalidated_with_the_user(strata: str, redis_sync: redis.Redis, keys: Keys) -> None:
    for user in ("u1", "u2"):
        assert outcome(ask(strata, "Which cards do I hold?", key=keys.acme, headers={**MINE, "X-Cache-User": user})) == "miss"
    response = httpx.post(strata + "/admin/cache/invalidate", json={"user": "u1", "tenant": "acme"},
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200 and response.json()["deleted"] >= 2  # exact and semantic entries
    assert outcome(ask(strata, "Which cards do I hold?", key=keys.acme, headers={**MINE, "X-Cache-User": "u1"})) == "miss"
    assert outcome(ask(strata, "Which cards do I hold?", key=keys.acme, headers={**MINE, "X-Cache-User": "u2"})) == "exact-hit"
    # A user without a tenant names nobody.
    bad = httpx.post(strata + "/admin/cache/invalidate", json={"user": "u1"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert bad.status_code == 400


def test_a_malformed_user_identity_is_a_400_never_a_500(strata: str, keys: Keys) -> None:
    for header in ("", "x" * 257):
        response = ask(strata, "What is my balance?", key=keys.acme, headers={**MINE, "X-Cache-User": header})
        assert response.status_code == 400, header
        assert response.json()["error"]["param"] == "X-Cache-User"
    response = ask(strata, "What is my balance?", key=keys.acme, headers=MINE, user="x" * 300)
    assert response.status_code == 400 and response.json()["error"]["param"] == "user"
    # In a shared category the user field identifies nobody and is passed on as it is.
    assert ask(strata, "What are your opening hours?", key=keys.acme, headers=GENERAL, user="x" * 300).status_code == 200


def test_two_workers_keep_each_users_answers_to_that_user(
    redis_url: str, fake_upstream: FakeUpstream, keys: Keys
) -> None:
    fake_upstream.reset()
    port = free_port()
    env = {**os.environ, "STRATA_PORT": str(port), "STRATA_WORKERS": "2", "STRATA_REDIS_URL": redis_url,
           "STRATA_UPSTREAM_URL": fake_upstream.url + "/v1", "STRATA_SEMANTIC_ENABLED": "false",
           "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml", "STRATA_KEYS_FILE": str(keys.path),
           "STRATA_LOG_LEVEL": "warning"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    process = serve_process(env, port)
    url = f"http://127.0.0.1:{port}"
    try:
        seen: dict[str, set[str]] = {"u1": set(), "u2": set()}
        for round_ in range(12):  # new connections spread over the workers
            for user, key in (("u1", keys.u1), ("u2", keys.u2)):
                with httpx.Client(base_url=url, timeout=10) as fresh:
                    response = ask(fresh, "我的信用卡还有多少额度", key=key, headers=MINE)
                seen[user].add(outcome(response))
                if round_:
                    assert outcome(response) == "exact-hit"
        assert seen == {"u1": {"miss", "exact-hit"}, "u2": {"miss", "exact-hit"}}
        assert len(fake_upstream.calls) == 2
    finally:
        stop_process(process)


# --- word order and values ------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "swapped"), [
    ("Transfer 300 dollars from account 5 to account 9", "Transfer 300 dollars from account 9 to account 5"),
    ("从5号账户转300元到9号账户", "从9号账户转300元到5号账户"),
    ("Convert 20 usd to eur", "Convert 20 eur to usd"),
    ("从北京到上海的高铁几点发车", "从上海到北京的高铁几点发车"),
    ("Where is my order ab12cd?", "Where is my order ab12ce?"),
    ("Can I collect it on Monday?", "Can I collect it on Tuesday?"),
    ("Send the invoice to alice@example.com", "Send the invoice to bob@example.com"),
    ("c3 n9", "c9 n3"),
])
@pytest.mark.parametrize("category", ["business", "faq", "general", "learn"])
def test_swapped_or_different_values_are_never_served_in_any_category(
    strata: str, fake_upstream: FakeUpstream, redis_sync: redis.Redis, keys: Keys, first: str, swapped: str,
    category: str,
) -> None:
    if category == "learn":  # an adaptive category whose observations allow every score
        from tests.integration.test_learning import pool_key

        redis_sync.hset(pool_key(redis_sync, "learn", "acme"), mapping={f"ok:{b:03d}": 1000 for b in range(50, 160)})
    headers = {"X-Cache-Category": category}
    assert outcome(ask(strata, first, key=keys.acme, headers=headers)) == "miss"
    response = ask(strata, swapped, key=keys.acme, headers=headers)
    assert outcome(response) == "miss", response.headers.get("x-cache-verdict")
    assert swapped in content(response)
    assert len(fake_upstream.calls) == 2


# --- look-alike characters ------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "other"), [("What is 2³?", "What is 23?"), ("Simplify x²+1", "Simplify x2+1"),
                                              ("½是多少", "1⁄2是多少"), ("第①步怎么做", "第1步怎么做")])
def test_look_alike_characters_are_different_questions(strata: str, fake_upstream: FakeUpstream, keys: Keys,
                                                      first: str, other: str) -> None:
    assert outcome(ask(strata, first, key=keys.acme, headers=GENERAL)) == "miss"
    response = ask(strata, other, key=keys.acme, headers=GENERAL)
    assert outcome(response) == "miss" and other in content(response)


# --- images and other parts -----------------------------------------------------------------------


def with_part(text: str, part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, part]}]


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_another_image_audio_or_file_is_another_question(strata: str, fake_upstream: FakeUpstream, keys: Keys,
                                                         kind: str) -> None:
    parts = {
        "image_url": ({"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
                      {"type": "image_url", "image_url": {"url": "https://example.org/dog.png"}}),
        "input_audio": ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                        {"type": "input_audio", "input_audio": {"data": "UklGRh==", "format": "wav"}}),
        "file": ({"type": "file", "file": {"file_id": "file-a"}}, {"type": "file", "file": {"file_id": "file-b"}}),
    }[kind]
    sent = {"Authorization": f"Bearer {keys.acme}", **GENERAL}

    def send(text: str, part: dict[str, Any]) -> httpx.Response:
        return httpx.post(strata + "/v1/chat/completions", json={"model": MODEL, "messages": with_part(text, part)},
                          headers=sent, timeout=10)

    assert outcome(send("What is in this one?", parts[0])) == "miss"
    assert outcome(send("What is in this one?", parts[1])) == "miss"
    assert outcome(send("What is in this one?", parts[0])) == "exact-hit"
    assert outcome(send("What's in this one?", parts[0])) == "miss"  # never semantically
    assert len(fake_upstream.calls) == 3


# --- tool calls -----------------------------------------------------------------------------------

WEATHER_TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
NAMED = {"tools": WEATHER_TOOL, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.mark.parametrize(("question", "others"), [
    ("What is the weather in Paris right now?", ("What's the weather in Paris right now?", "What is the weather in Lyon right now?")),
    ("巴黎现在天气怎么样", ("巴黎现在的天气怎么样", "里昂现在天气怎么样")),
])
def test_tool_calls_are_served_only_to_the_identical_request(strata: str, fake_upstream: FakeUpstream,
                                                             redis_sync: redis.Redis, keys: Keys,
                                                             question: str, others: tuple[str, str]) -> None:
    fake_upstream.tool_calls = True
    first = ask(strata, question, key=keys.acme, headers=GENERAL, **NAMED)
    assert outcome(first) == "miss" and first.json()["choices"][0]["message"]["tool_calls"]
    repeat = ask(strata, question, key=keys.acme, headers=GENERAL, **NAMED)
    assert outcome(repeat) == "exact-hit"
    assert repeat.json()["choices"][0]["message"]["tool_calls"] == first.json()["choices"][0]["message"]["tool_calls"]
    for other in others:
        response = ask(strata, other, key=keys.acme, headers=GENERAL, **NAMED)
        assert outcome(response) == "miss"
        assert other in response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert len(fake_upstream.calls) == 3


def test_a_category_that_opts_in_serves_tool_calls_semantically_under_the_guards(
    strata: str, fake_upstream: FakeUpstream, keys: Keys
) -> None:
    fake_upstream.tool_calls = True
    tools = {"X-Cache-Category": "tools"}
    assert outcome(ask(strata, "What is the weather in Paris right now?", key=keys.acme, headers=tools, **NAMED)) == "miss"
    assert outcome(ask(strata, "What's the weather in Paris right now?", key=keys.acme, headers=tools, **NAMED)) == "semantic-hit"
    response = ask(strata, "What is the weather in Lyon right now?", key=keys.acme, headers=tools, **NAMED)
    assert outcome(response) == "miss" and response.headers.get("x-cache-verdict") in (None, "values_differ")


# --- each tenant's own learning -------------------------------------------------------------------


@pytest.mark.parametrize(("cached", "near"), [
    ("How do I cancel my subscription?", "How do I pause my subscription?"),
    ("怎么取消订阅", "怎么暂停订阅"),
])
def test_one_tenants_traffic_never_moves_what_another_tenant_is_served(
    strata: str, fake_upstream: FakeUpstream, redis_sync: redis.Redis, keys: Keys, cached: str, near: str
) -> None:
    victim = keys.globex
    assert outcome(ask(strata, cached, key=victim, headers=LEARN)) == "miss"
    # The attack: pairs of near-identical questions whose answers the attacker makes equal, so its
    # traffic is one long run of "equivalent" observations at high scores.
    pairs = 30
    for i in range(pairs):
        question, again = f"When does shop number {i} open on holidays?", f"When does shop number {i} open on holidays, please?"
        fake_upstream.answers[question] = fake_upstream.answers[again] = f"Shop {i} opens at 9 on holidays."
        ask(strata, question, key=keys.acme, headers=LEARN)
        ask(strata, again, key=keys.acme, headers=LEARN)
    attacker = eventually(lambda: sum(pool_counts_of(redis_sync, "acme").values()) >= 21 or None, timeout=20)
    assert attacker, pool_counts_of(redis_sync, "acme")
    # The other tenant's decisions read its own pool, which the attacker's traffic did not touch
    # (with one pool for all tenants this question was served the cached one's answer).
    assert pool_counts_of(redis_sync, "globex") == {}
    response = ask(strata, near, key=victim, headers=LEARN)
    assert outcome(response) == "miss", response.headers.get("x-cache-verdict")


def pool_counts_of(redis_sync: redis.Redis, tenant: str) -> dict[str, int]:
    from tests.integration.test_learning import pool_key

    return {k.decode(): int(v) for k, v in redis_sync.hgetall(pool_key(redis_sync, "learn", tenant)).items()}


# --- no-cache -------------------------------------------------------------------------------------


@pytest.mark.parametrize("question", ["What is the return window?", "退货期限是多久"])
def test_no_cache_from_a_client_never_rewrites_what_the_tenants_other_clients_are_served(
    strata: str, fake_upstream: FakeUpstream, keys: Keys, question: str
) -> None:
    original = content(ask(strata, question, key=keys.acme, headers=GENERAL))
    fake_upstream.answers[question] = "A resampled answer."
    fresh = ask(strata, question, key=keys.acme, headers={**GENERAL, "Cache-Control": "no-cache"})
    assert outcome(fresh) == "bypass" and content(fresh) == "A resampled answer."
    again = ask(strata, question, key=keys.acme, headers=GENERAL)
    assert outcome(again) == "exact-hit" and content(again) == original
    # A key the tenant allows to refresh, and an operator, do rewrite it.
    fake_upstream.answers[question] = "The refreshed answer."
    assert outcome(ask(strata, question, key=keys.acme_refresher, headers={**GENERAL, "Cache-Control": "no-cache"})) == "bypass"
    assert content(ask(strata, question, key=keys.acme, headers=GENERAL)) == "The refreshed answer."
    fake_upstream.answers[question] = "The operator's answer."
    operator = {**GENERAL, "Cache-Control": "no-cache", "X-Strata-Admin-Token": ADMIN_TOKEN}
    assert outcome(ask(strata, question, key=keys.acme, headers=operator)) == "bypass"
    assert content(ask(strata, question, key=keys.acme, headers=GENERAL)) == "The operator's answer."
    # In a per-user category the entry is the user's own: their no-cache refreshes it.
    mine = {**MINE, "X-Cache-User": "u7"}
    assert outcome(ask(strata, question, key=keys.acme, headers=mine)) == "miss"
    fake_upstream.answers[question] = "u7's fresh answer."
    assert outcome(ask(strata, question, key=keys.acme, headers={**mine, "Cache-Control": "no-cache"})) == "bypass"
    assert content(ask(strata, question, key=keys.acme, headers=mine)) == "u7's fresh answer."


# --- side channels --------------------------------------------------------------------------------


def test_one_tenants_questions_do_not_make_anothers_lookups_faster(strata: str, keys: Keys) -> None:
    question = "Do you ship to the Faroe Islands by sea freight?"
    assert outcome(ask(strata, question, key=keys.acme, headers=GENERAL)) == "miss"
    embedded = metric(strata, "strata_embed_texts_total")
    assert outcome(ask(strata, question, key=keys.globex, headers=GENERAL)) == "miss"
    # The other tenant's question is embedded afresh: no memo answers it from the first tenant's.
    assert metric(strata, "strata_embed_texts_total") > embedded


def test_metrics_behind_a_token_and_without_tenant_names(redis_url: str, fake_upstream: FakeUpstream, keys: Keys) -> None:
    settings = strata_settings(redis_url, fake_upstream.url, keys_file=str(keys.path), metrics_token="scrape-me",
                               metrics_tenant_labels=False)
    with serve_strata(settings) as server:
        dynamic = [{"role": "system", "content": "Today is 2026-12-01 12:00:00. You help shoppers."}]
        httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {keys.acme}"},
                   json={"model": MODEL, "messages": [*dynamic, {"role": "user", "content": "hi"}]}, timeout=10)
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        scraped = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert scraped.status_code == 200
        assert 'strata_prompt_dynamic_total{kind="timestamp",tenant="-"}' in scraped.text
        assert "acme" not in scraped.text
