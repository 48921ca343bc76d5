"""Hits' response ids as signed receipts (issue #32): round trip, tampering, rotation, expiry."""

from __future__ import annotations

import base64

import msgspec
import pytest

from app.cache.learning.receipts import InvalidReceipt, Receipt, ResponseIds, parse_secrets

SECRET = b"unit-test-secret-0123456789abcdef"
DIGEST = "ab" * 32


def receipt(**changes: object) -> Receipt:
    base = Receipt(tenant="shop-a", user="u-17", category="faq", version="v3", layer="semantic",
                   document=f"strata:{{b4}}:v3:sem:{DIGEST}", root=f"strata:{{b4}}:v3:sem:{'cd' * 32}",
                   similarity=0.913, score_bin=91, source="model", issued_at=1_800_000_000, nonce="0123456789abcdef")
    return msgspec.structs.replace(base, **changes)  # type: ignore[arg-type]


def test_a_receipt_round_trips_and_stays_short() -> None:
    ids = ResponseIds([SECRET])
    for each in (receipt(), receipt(root=receipt().document, layer="exact", similarity=1.0, score_bin=0),
                 receipt(document=f"strata:v3:sem:faq-{DIGEST}", root=f"strata:v3:sem:faq-{DIGEST}", source="faq"),
                 receipt(document="strata:v3:sem:odd-key", root="strata:v3:sem:odd-key")):
        token = ids.seal(each)
        assert ids.open("chatcmpl-" + token, now=each.issued_at + 5) == each
        assert len("chatcmpl-" + token) < 256 and token.replace("-", "").replace("_", "").isalnum()


def test_any_single_changed_character_is_refused() -> None:
    ids = ResponseIds([SECRET])
    token = ids.seal(receipt())
    alphabet = "AZaz09-_"
    for position in range(len(token)):
        for replacement in alphabet:
            if replacement == token[position]:
                continue
            changed = token[:position] + replacement + token[position + 1:]
            with pytest.raises(InvalidReceipt):
                ids.open(changed, now=1_800_000_001)


def test_other_secrets_forgeries_and_garbage_are_refused() -> None:
    ids = ResponseIds([SECRET])
    forged = ResponseIds([b"someone-elses-secret-0123456789"]).seal(receipt())
    for bad in (forged, "", "chatcmpl-", "chatcmpl-" + "0" * 32, "not base64 at all!", "A" * 600,
                base64.urlsafe_b64encode(b"\x00" * 40).decode().rstrip("=")):
        with pytest.raises(InvalidReceipt):
            ids.open(bad, now=1_800_000_001)


def test_a_rotated_secret_still_verifies_and_the_first_signs() -> None:
    new, old = b"the-new-secret-0123456789", b"the-old-secret-0123456789"
    before = ResponseIds([old]).seal(receipt())
    rotated = ResponseIds([new, old])
    assert rotated.open(before, now=1_800_000_001) == receipt()
    after = rotated.seal(receipt())
    assert ResponseIds([new]).open(after, now=1_800_000_001) == receipt()
    with pytest.raises(InvalidReceipt):
        ResponseIds([old]).open(after, now=1_800_000_001)


def test_an_expired_receipt_is_refused() -> None:
    ids = ResponseIds([SECRET], ttl_s=60)
    token = ids.seal(receipt())
    assert ids.open(token, now=1_800_000_060)
    with pytest.raises(InvalidReceipt):
        ids.open(token, now=1_800_000_061)


def test_without_a_secret_ids_are_plain_and_short_secrets_are_refused() -> None:
    assert not ResponseIds().ready and not ResponseIds([SECRET], ttl_s=0).ready
    assert parse_secrets(" a-secret-of-16-chars , another-of-16-chars ") == (b"a-secret-of-16-chars", b"another-of-16-chars")
    assert parse_secrets("") == ()
    with pytest.raises(ValueError, match="16 characters"):
        parse_secrets("short")


def test_an_intent_hits_receipt_names_its_rule_and_other_ids_do_not_grow() -> None:
    ids = ResponseIds([SECRET])
    plain, intent = receipt(), receipt(rule="intent")
    assert ids.open("chatcmpl-" + ids.seal(intent), now=intent.issued_at + 5).rule == "intent"
    assert ids.open("chatcmpl-" + ids.seal(plain), now=plain.issued_at + 5).rule == ""
    assert len(ids.seal(plain)) < len(ids.seal(intent))  # the rule is there only when there is one
