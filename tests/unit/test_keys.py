"""Canonical requests: what shares a cache entry and what must not."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from app.cache.keys import KEYS, Keyspace, canonicalize, version_tag
from app.wire import ChatCompletionRequest


def canon(raw: dict[str, Any], tenant: str = "t", max_tokens: int = 64, category: str = "faq"):
    request = msgspec.convert(raw, ChatCompletionRequest)
    return canonicalize(request, raw, tenant=tenant, category=category, max_tokens=max_tokens)


def body(question: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": question}], **extra}


@given(st.permutations(["model", "messages", "temperature", "seed", "top_k"]))
def test_field_order_never_changes_the_digest(order: list[str]) -> None:
    full = body(temperature=0.2, seed=1, top_k=4)
    shuffled = {name: full[name] for name in order}
    assert canon(shuffled).exact_digest == canon(full).exact_digest


def test_normalisation_and_ignored_fields() -> None:
    base = canon(body("退款？")).exact_digest
    assert canon(body("  退款?\n")).exact_digest == base  # NFKC folds the full-width "？"
    assert canon(body("退款?", stream=True, user="u", request_id="r", stream_options={"include_usage": True})).exact_digest == base
    assert canon(body("退款?", temperature=1)).exact_digest == canon(body("退款?", temperature=1.0)).exact_digest


def test_everything_that_changes_the_answer_changes_the_digest() -> None:
    base = canon(body())
    variants = [
        canon(body(), tenant="other"),
        canon(body(), category="business"),
        canon(body(), max_tokens=65),
        canon(body(temperature=0.3)),
        canon(body(stop=["x"])),
        canon(body(response_format={"type": "json_object"})),
        canon(body(tools=[{"type": "function", "function": {"name": "f"}}])),
        canon({**body(), "model": "m2"}),
        canon({"model": "m", "messages": [{"role": "system", "content": "T"}, {"role": "user", "content": "hi"}]}),
    ]
    digests = {v.exact_digest for v in variants}
    assert base.exact_digest not in digests and len(digests) == len(variants)


def test_scope_covers_system_and_history_but_not_the_question() -> None:
    one, two = canon(body("how old is he?")), canon(body("what is his age?"))
    assert one.scope_digest == two.scope_digest and one.exact_digest != two.exact_digest
    history = {"model": "m", "messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Tell me about Obama"},
        {"role": "assistant", "content": "He was president."},
        {"role": "user", "content": "how old is he?"},
    ]}
    other = canon(history)
    assert other.scope_digest != one.scope_digest
    assert other.question == "how old is he?" and len(other.history) == 2 and len(other.system) == 1


def test_order_of_system_and_conversation_messages_matters() -> None:
    a = canon({"model": "m", "messages": [
        {"role": "system", "content": "A"}, {"role": "user", "content": "q1"},
        {"role": "system", "content": "B"}, {"role": "user", "content": "q2"}]})
    b = canon({"model": "m", "messages": [
        {"role": "system", "content": "A"}, {"role": "system", "content": "B"},
        {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]})
    assert a.exact_digest != b.exact_digest and a.scope_digest != b.scope_digest


def test_no_question_when_the_last_message_is_not_user_text() -> None:
    tool_last = canon({"model": "m", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"}]})
    assert tool_last.question is None
    image = canon({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    assert image.question is None


def test_prefixes_are_siblings_and_never_nest() -> None:
    tags = [version_tag(n) for n in (1, 2, 10, 11, 100)]
    spaces = [KEYS, *(Keyspace.bucket(f"b{n}") for n in (1, 2, 10, 11))]
    prefixes = [p(t) for t in tags for ks in spaces for p in (ks.exact_prefix, ks.semantic_prefix)]
    assert all(p.endswith(":") for p in prefixes)
    for a in prefixes:
        for b in prefixes:
            assert a == b or not b.startswith(a)
    assert KEYS.semantic_index_name("v1") + ":" == KEYS.semantic_prefix("v1")


def test_every_key_of_a_bucket_carries_its_hash_tag() -> None:
    """On a cluster, a key's slot is the hash of what is inside its first {...}: every key of a
    bucket, its index and its copies of the version and generations, must name the bucket's tag."""
    bucket = Keyspace.bucket("b7")
    names = [bucket.version_key, bucket.scopes_key, bucket.embedder_key, bucket.exact_prefix("v3"),
             bucket.semantic_prefix("v3"), bucket.semantic_index_name("v3"), bucket.embeddings_key("v3", "d"),
             bucket.lease_key("v3", "d"), bucket.faq_key("v3", "d"), bucket.faq_set_key("v3", "n"),
             bucket.observations_key("v3", "faq")]
    for name in names:
        assert name.startswith("strata:{b7}:"), name
        assert name.index("{") < name.index("}") and name.count("{") == 1, name
    assert all("{" not in name for name in (KEYS.version_key, KEYS.exact_prefix("v3")))
