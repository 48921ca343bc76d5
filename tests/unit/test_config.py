"""Settings from the environment and the category policy file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.policy import Policy
from app.settings import PROJECT_ROOT, Settings


def test_settings_read_typed_values_from_the_environment() -> None:
    settings = Settings.from_env({"STRATA_PORT": "9090", "STRATA_SEMANTIC_ENABLED": "false",
                                  "STRATA_REDIS_TIMEOUT_S": "0.5", "STRATA_ADMIN_TOKEN": "", "OTHER": "x"})
    assert settings.port == 9090 and settings.semantic.enabled is False and settings.redis.timeout_s == 0.5
    assert settings.admin_token is None
    assert Settings.from_env({}).port == 8080


def test_every_setting_is_in_the_configuration_table() -> None:
    section = (PROJECT_ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    rows = [line for line in section.splitlines() if line.startswith("| `STRATA_")]
    documented = {name for line in rows for name in re.findall(r"`STRATA_([A-Z0-9_]+)`", line.split(" | ")[0])}
    names = {name.upper() for name in Settings.flat_names()}
    assert names - documented == set(), "settings missing from docs/CONFIGURATION.md's table"
    assert documented - names == set(), "docs/CONFIGURATION.md documents settings that do not exist"


def test_grouped_settings_take_flat_names_and_refuse_unknown_ones() -> None:
    settings = Settings.from_flat({"redis_url": "redis://example:1/0", "upstream_max_retries": 0, "tenant_rps": 2.0})
    assert settings.redis.url == "redis://example:1/0" and settings.upstream.max_retries == 0
    assert settings.limits.tenant_rps == 2.0 and settings.limits.tenant_burst == 0.0
    with pytest.raises(ValueError, match="unknown setting"):
        Settings.from_flat({"redis_port": 6380})


def test_settings_reject_values_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="STRATA_"):
        Settings.from_env({"STRATA_PORT": "eighty"})


def test_the_shipped_policy_has_the_three_categories() -> None:
    policy = Policy.load(PROJECT_ROOT / "schemas" / "policy.yaml")
    assert policy.default_category == "business" and policy.get(None).name == "business"
    assert {"business", "faq", "general"} <= set(policy.categories)
    business, faq, general = (policy.categories[n] for n in ("business", "faq", "general"))
    assert 600 <= business.ttl_seconds <= 3600
    assert faq.ttl_seconds >= 3600 and general.ttl_seconds >= 86400
    assert policy.get("nope") is None


def test_the_shipped_policy_never_shares_personal_answers_across_users() -> None:
    policy = Policy.load(PROJECT_ROOT / "schemas" / "policy.yaml")
    # The default category is documented for account operations: each user's answers are their own.
    assert policy.get(None).per_user
    personal = policy.categories["personal"]
    assert personal.per_user and not personal.semantic.enabled and personal.ttl_seconds <= 300
    assert not policy.categories["faq"].per_user and not policy.categories["general"].per_user
    assert not any(c.semantic.tool_calls for c in policy.categories.values())


@pytest.mark.parametrize(("text", "message"), [
    ("default_category: a\ncategories: {}\n", "not defined"),
    ("default_category: a\ncategories:\n  a: {ttl_seconds: 0}\n", "ttl_seconds"),
    ("default_category: A\ncategories:\n  A: {ttl_seconds: 5}\n", "must match"),
    ("default_category: a\ncategories:\n  a: {ttl_seconds: 5, semantic: {threshold: 0.9, accept_above: 0.8}}\n", "accept_above"),
    ("default_category: a\ncategories:\n  a: {ttl_seconds: 5, typo: 1}\n", "typo"),
    ("default_category: a\ncategories:\n  a: {ttl_seconds: 5, scope: users}\n", "scope"),
    ("::: not yaml", "policy file"),
])
def test_bad_policy_files_are_rejected_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Policy.load(path)


def test_a_refused_connection_is_the_only_retryable_upstream_failure() -> None:
    import asyncio

    import httpx
    import openai

    from app.upstream import _never_reached

    async def refused() -> openai.OpenAIError:
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x", max_retries=0)
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        except openai.OpenAIError as exc:
            return exc
        raise AssertionError("port 1 answered")

    assert _never_reached(asyncio.run(refused()))
    timed_out = openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))
    assert not _never_reached(timed_out)


def test_a_policy_file_can_build_on_another_and_name_only_what_changes(tmp_path: Path) -> None:
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"base: {PROJECT_ROOT / 'schemas' / 'policy.yaml'}\ndefault_category: judged\ncategories:\n"
                       "  judged: {like: faq, semantic: {judge: async}}\n", encoding="utf-8")
    policy = Policy.load(variant)
    shipped = Policy.load(PROJECT_ROOT / "schemas" / "policy.yaml").categories["faq"]
    judged = policy.categories["judged"]
    assert judged.semantic.judge_after_miss and judged.semantic.threshold == shipped.semantic.threshold
    assert judged.ttl_seconds == shipped.ttl_seconds and "business" in policy.categories
    variant.write_text("default_category: x\ncategories:\n  x: {like: nowhere, ttl_seconds: 5}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="nowhere"):
        Policy.load(variant)


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0"),
    ("redis://:hunter2@10.0.0.5:6380/0", "redis://:***@10.0.0.5:6380/0"),
    ("rediss://strata:hunter2@cache.internal:6380/1", "rediss://strata:***@cache.internal:6380/1"),
    ("redis+cluster://:hunter2@10.0.0.5:7000,10.0.0.6:7000", "redis+cluster://:***@10.0.0.5:7000,10.0.0.6:7000"),
    ("redis://strata@10.0.0.5:6380", "redis://strata@10.0.0.5:6380"),
])
def test_redis_urls_in_messages_hide_their_password(url: str, shown: str) -> None:
    from app.settings import RedisSettings

    assert RedisSettings(url=url).shown_url == shown


@pytest.mark.parametrize(("semantic", "refused"), [
    ("{error_bound: 0.01, min_probability: 0.9}", "semantic.min_probability does not apply to an adaptive category"),
    ("{error_bound: 0.01, judge: true}", "semantic.judge: true does not apply to an adaptive category"),
    ("{threshold: 0.8, explore: 0.02}", "semantic.explore does not apply to a fixed category"),
    ("{threshold: 0.8, reader: serve}", "semantic.reader does not apply to a fixed category"),
    ("{error_bound: 0.01, repeat_explore: 0.5}", "semantic.repeat_explore is not a setting of an adaptive category"),
    ("{threshold: 0.8, guard_lift: 1}", "semantic.guard_lift is not a setting of a fixed category"),
])
def test_a_knob_of_the_other_kind_of_category_is_refused_naming_file_category_and_knob(
        tmp_path: Path, semantic: str, refused: str) -> None:
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"default_category: x\ncategories:\n  x: {{ttl_seconds: 5, semantic: {semantic}}}\n",
                       encoding="utf-8")
    with pytest.raises(ValueError) as raised:
        Policy.load(variant)
    assert str(variant) in str(raised.value) and "category 'x'" in str(raised.value) and refused in str(raised.value)


def test_each_shipped_category_is_of_its_own_kind() -> None:
    from app.policy import AdaptiveSemantic, FixedSemantic

    categories = Policy.load(PROJECT_ROOT / "schemas" / "policy.yaml").categories
    assert isinstance(categories["faq"].semantic, AdaptiveSemantic)
    assert all(isinstance(categories[name].semantic, FixedSemantic) for name in ("business", "personal", "general"))


def test_a_variant_of_the_other_kind_inherits_only_its_own_kinds_knobs(tmp_path: Path) -> None:
    from app.policy import FixedSemantic

    variant = tmp_path / "variant.yaml"
    variant.write_text(f"base: {PROJECT_ROOT / 'schemas' / 'policy.yaml'}\ndefault_category: fixed\ncategories:\n"
                       "  fixed: {like: faq, semantic: {error_bound: null, threshold: 0.88, min_probability: 0.8}}\n",
                       encoding="utf-8")
    fixed = Policy.load(variant).categories["fixed"].semantic
    assert isinstance(fixed, FixedSemantic) and fixed.min_probability == 0.8 and fixed.threshold == 0.88
    # A knob of the other kind written in the variant itself is still refused.
    variant.write_text(f"base: {PROJECT_ROOT / 'schemas' / 'policy.yaml'}\ndefault_category: fixed\ncategories:\n"
                       "  fixed: {like: faq, semantic: {error_bound: null, explore: 0.1}}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"semantic\.explore does not apply to a fixed category"):
        Policy.load(variant)
