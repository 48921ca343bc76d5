"""Canonical requests: what shares a cache entry and what must not."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from app.cache.storage.keys import KEYS, Keyspace, canonicalize, version_tag
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
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
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


# Characters NFKC would fold into others that mean something else: each pair must stay two keys.
LOOK_ALIKES = [
    ("What is 2³?", "What is 23?"),
    ("Simplify x²", "Simplify x2"),
    ("What is ½ of 10?", "What is 1⁄2 of 10?"),
    ("Step ① first", "Step 1 first"),
    ("Chapter Ⅻ", "Chapter XII"),
    ("Price per ㎏", "Price per kg"),
    ("H₂O formula", "H2O formula"),
    ("ﬁle a claim", "file a claim"),
]


def test_the_exact_key_never_merges_look_alike_characters() -> None:
    for one, other in LOOK_ALIKES:
        assert canon(body(one)).exact_digest != canon(body(other)).exact_digest, (one, other)
        assert canon(body(one)).question != canon(body(other)).question


def test_the_exact_key_folds_only_what_cannot_change_meaning() -> None:
    # Full-width ASCII (a CJK keyboard's) and the ideographic space; NFC joins combining accents.
    assert canon(body("ＡＢＣ１２３？")).exact_digest == canon(body("ABC123?")).exact_digest
    assert canon(body("退款\u3000怎么办")).exact_digest == canon(body("退款 怎么办")).exact_digest
    assert canon(body("cafe\u0301")).exact_digest == canon(body("café")).exact_digest
    # Inner whitespace is kept: in code it is meaning.
    assert canon(body("if x:\n    y")).exact_digest != canon(body("if x:\n  y")).exact_digest


def parts(*extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *extra]}]}


def test_every_content_part_is_in_the_key() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}}
    variants = [
        parts(image),
        parts({"type": "image_url", "image_url": {"url": "https://example.org/b.png"}}),
        parts({"type": "image_url", "image_url": {"url": "https://example.org/a.png", "detail": "high"}}),
        parts({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
        parts({"type": "input_audio", "input_audio": {"data": "BBBB", "format": "wav"}}),
        parts({"type": "file", "file": {"file_id": "file-1"}}),
        parts({"type": "file", "file": {"file_id": "file-2"}}),
        parts({"type": "video_url", "video_url": {"url": "https://example.org/v.mp4"}}),  # unknown: as it is
        parts(),
    ]
    digests = [canon(v).exact_digest for v in variants]
    assert len(set(digests)) == len(variants)
    assert canon(parts(image)).exact_digest == canon(parts(dict(image))).exact_digest
    # A conversation with anything but text is never a semantic question, wherever the part is.
    assert all(canon(v).question is None for v in variants[:-1]) and canon(variants[-1]).question == "What is this?"
    earlier = {"model": "m", "messages": [parts(image)["messages"][0], {"role": "assistant", "content": "A cat."},
                                          {"role": "user", "content": "And its colour?"}]}
    assert canon(earlier).question is None


def test_the_user_of_a_per_user_category_is_in_every_key_and_scope() -> None:
    request = msgspec.convert(body("What is my balance?"), ChatCompletionRequest)
    one, two, shared = (canonicalize(request, body("What is my balance?"), tenant="t", category="mine",
                                     max_tokens=None, user=user) for user in ("u1", "u2", None))
    assert len({one.exact_digest, two.exact_digest, shared.exact_digest}) == 3
    assert len({one.scope_digest, two.scope_digest, shared.scope_digest}) == 3


def test_an_admin_token_from_the_environment_is_read_as_its_file_is_without_surrounding_whitespace() -> None:
    """A Kubernetes Secret made from a file keeps the file's final newline (deploy/k8s)."""
    from app.auth import AdminToken

    assert AdminToken("s3cret-token-of-enough-length\n", None).current() == "s3cret-token-of-enough-length"
    assert AdminToken("  \n", None).current() is None
