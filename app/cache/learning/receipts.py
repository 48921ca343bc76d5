"""Response ids that carry what served them (issue #32): no Redis write per hit.

A hit's response id (``chatcmpl-<token>``; ``resp_<token>`` and ``msg_<token>`` in the other
protocols) is a receipt: the token is the hit's provenance (tenant, user, category, version,
layer, document, entry, similarity, score bin, source, when) packed with msgpack, followed by an
HMAC-SHA256 tag under a server-side secret, base64url without padding. ``POST /v1/feedback``
opens the receipt instead of reading a stored record, so serving a hit writes nothing, and a
client can neither forge a receipt, nor alter one (a single changed character breaks the tag),
nor name another tenant's entry (the tenant inside is checked against the caller's).

What feedback itself must remember, that a receipt was judged already, is one small key per
verdict (``strata:fb:<nonce>``, until the receipt expires): it grows with feedback, not with hits.

Secrets: ``STRATA_RESPONSE_ID_SECRETS``, comma-separated; the first signs, every one verifies,
so a rotated secret stays accepted while it is listed (list the new one first, drop the old one
once ``STRATA_FEEDBACK_TTL_S`` has passed). Unset, one secret is made once and kept in Redis
(``strata:meta:response_id_secret``), so every worker and instance on that Redis shares it.
Each secret is named in the token by the first byte of its digest, so verifying tries one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Sequence

import msgspec

from app.cache.decision.verify import INTENT_MATCH, INTENT_PROBATION
from app.cache.storage.contract import CacheHit, CacheQuery, SharedRedis
from app.cache.storage.keys import RESPONSE_SECRET_KEY, VOUCH_INTENT, VOUCH_PROBATION

logger = logging.getLogger("strata.receipts")

CHAT_PREFIX = "chatcmpl-"
# A token's parts: one byte naming the secret, the payload, the tag.
TAG_BYTES = 16
NONCE_BYTES = 8
# Layers and sources, one character each in the payload.
_LAYERS = {"exact": "e", "semantic": "s"}
_LAYER_NAMES = {v: k for k, v in _LAYERS.items()}
_SOURCES = {"model": "m", "faq": "f"}
_SOURCE_NAMES = {v: k for k, v in _SOURCES.items()}
# Keys end with a sha256 digest: carried as its 32 bytes, not 64 hex characters.
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_DOMAIN = b"strata-response-id\x00"


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What one hit served, as its response id carries it.

    Attributes:
        tenant: Whose request.
        user: Its user in a per-user category ("" otherwise).
        category: Its category.
        version: The version tag it was served under.
        layer: ``exact`` or ``semantic``.
        document: The document that matched (the exact entry, or a semantic entry or alias).
        root: The entry whose answer it served.
        similarity: The questions' similarity (semantic hits; 1.0 for exact ones).
        score_bin: The decision score's bin (semantic hits).
        source: ``model`` or ``faq``.
        issued_at: When it was served (UNIX seconds).
        nonce: Random bytes, hex: tells two responses of one hit apart (one verdict each).
        rule: The rule that vouched for a semantic hit beside the pool, when feedback on it must
            count against that rule too (``intent``: the team's intents); "" otherwise.
    """

    tenant: str
    user: str = ""
    category: str
    version: str
    layer: str
    document: str
    root: str
    similarity: float = 1.0
    score_bin: int = 0
    source: str = "model"
    issued_at: int = 0
    nonce: str = ""
    rule: str = ""

    @classmethod
    def of(cls, query: CacheQuery, hit: CacheHit, *, now: float | None = None) -> Receipt:
        """The receipt of a hit a query was served."""
        document = hit.document or hit.key or ""
        return cls(tenant=query.canonical.tenant, user=query.canonical.user or "", category=query.category.name,
                   version=query.version, layer=hit.layer, document=document, root=hit.key or document,
                   similarity=hit.similarity if hit.similarity is not None else 1.0, score_bin=hit.score_bin or 0,
                   source=hit.source, issued_at=int(time.time() if now is None else now),
                   nonce=secrets.token_hex(NONCE_BYTES), rule=rule_of(hit))


class _Packed(msgspec.Struct, array_like=True, frozen=True):
    """The payload on the wire: positional, keys split into (prefix, digest bytes); the entry's
    prefix is empty when it is the document's."""

    tenant: str
    user: str
    category: str
    version: str
    layer: str
    document_prefix: str
    document_digest: bytes
    root_prefix: str
    root_digest: bytes
    similarity_milli: int
    score_bin: int
    source: str
    issued_at: int
    nonce: bytes
    rule: str = ""  # last and optional: ids without it (most) stay as short as before


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Packed)


def _split(key: str) -> tuple[str, bytes]:
    """A key as (prefix, digest bytes) when it ends with a lowercase sha256 hex digest."""
    tail = key[-64:]
    if len(key) < 64 or not _HEX_DIGEST.fullmatch(tail):
        return key, b""
    return key[:-64], bytes.fromhex(tail)


def _join(prefix: str, digest: bytes) -> str:
    return prefix + digest.hex()


def _pack(receipt: Receipt) -> bytes:
    return _pack_fields(receipt.tenant, receipt.user, receipt.category, receipt.version, receipt.layer,
                        receipt.document, receipt.root, receipt.similarity, receipt.score_bin, receipt.source,
                        receipt.issued_at, bytes.fromhex(receipt.nonce), receipt.rule)


def _pack_fields(tenant: str, user: str, category: str, version: str, layer: str, document: str, root: str,
                 similarity: float, score_bin: int, source: str, issued_at: int, nonce: bytes, rule: str = "") -> bytes:
    """The payload of :class:`_Packed`, encoded from a tuple (msgspec writes both as one array):
    the hit path builds no struct."""
    document_prefix, document_digest = _split(document)
    root_prefix, root_digest = _split(root)
    if root_prefix == document_prefix and root_digest:
        root_prefix = ""
    fields = (tenant, user, category, version, _LAYERS.get(layer, layer), document_prefix, document_digest,
              root_prefix, root_digest, round(similarity * 1000), score_bin, _SOURCES.get(source, source), issued_at,
              nonce)
    return _encoder.encode((*fields, rule) if rule else fields)


def _unpack(payload: bytes) -> Receipt:
    packed = _decoder.decode(payload)
    document = _join(packed.document_prefix, packed.document_digest)
    root = _join(packed.root_prefix or packed.document_prefix, packed.root_digest) if packed.root_digest \
        else packed.root_prefix
    return Receipt(tenant=packed.tenant, user=packed.user, category=packed.category, version=packed.version,
                   layer=_LAYER_NAMES.get(packed.layer, packed.layer), document=document, root=root,
                   similarity=packed.similarity_milli / 1000, score_bin=packed.score_bin,
                   source=_SOURCE_NAMES.get(packed.source, packed.source), issued_at=packed.issued_at,
                   nonce=packed.nonce.hex(), rule=packed.rule)


def rule_of(hit: CacheHit) -> str:
    """The rule feedback on a hit also counts against: the team's intents' (issue #46), or none."""
    return VOUCH_INTENT if hit.reason == INTENT_MATCH else VOUCH_PROBATION if hit.reason == INTENT_PROBATION else ""


def _secret_id(secret: bytes) -> int:
    return hashlib.sha256(_DOMAIN + secret).digest()[0]


def parse_secrets(text: str) -> tuple[bytes, ...]:
    """``STRATA_RESPONSE_ID_SECRETS``: comma-separated, each at least 16 characters.

    Raises:
        ValueError: A secret shorter than 16 characters.
    """
    found = tuple(part.strip().encode() for part in text.split(",") if part.strip())
    short = [s for s in found if len(s) < 16]
    if short:
        raise ValueError("STRATA_RESPONSE_ID_SECRETS: every secret needs at least 16 characters")
    return found


class InvalidReceipt(Exception):
    """A response id that is no receipt of ours: unsigned, altered, under an unknown secret, or expired."""


class ResponseIds:
    """Mints the ids of hits' responses and opens them again.

    Args:
        configured: The configured secrets, the signing one first; empty: the secret kept in Redis
            is adopted by :meth:`adopt` (until then hits get plain ids that feedback cannot name).
        ttl_s: How long a receipt can be opened (``STRATA_FEEDBACK_TTL_S``); 0: never.
    """

    def __init__(self, configured: Sequence[bytes] = (), ttl_s: int = 86_400) -> None:
        self._secrets: dict[int, bytes] = {}
        self._signing: tuple[int, bytes] | None = None
        self._signer: hmac.HMAC | None = None  # the signing key's HMAC state after the domain: copied per id
        self.ttl_s = ttl_s
        for secret in configured:
            self._add(secret)
        self.configured = bool(configured)

    def _add(self, secret: bytes, *, signing: bool = False) -> None:
        sid = _secret_id(secret)
        self._secrets.setdefault(sid, secret)
        if self._signing is None or signing:
            self._signing = (sid, secret)
            self._signer = hmac.new(secret, _DOMAIN, hashlib.sha256)

    @property
    def signing_secret(self) -> bytes | None:
        """The secret ids are signed with (shared by every worker once adopted); the console
        derives its session key from it."""
        return self._signing[1] if self._signing is not None else None

    @property
    def ready(self) -> bool:
        """Whether ids can be signed (a secret is configured or adopted)."""
        return self._signing is not None and self.ttl_s > 0

    async def adopt(self, redis: SharedRedis) -> None:
        """Adopt the secret kept in Redis; put one there if there is none (``SET NX``: the first
        worker's wins), this worker's own when it has one, so a Redis that lost the key gets it
        back. A secret that differs from this worker's signs from now on; the old one still
        verifies. Nothing to do when secrets are configured. Called at start and every minute.

        Raises:
            Any of ``CACHE_ERRORS``: Redis failed; the caller tries again later.
        """
        if self.configured:
            return
        mine = self._signing[1] if self._signing is not None else secrets.token_hex(32).encode()
        await redis.set(RESPONSE_SECRET_KEY, mine, nx=True)
        stored = await redis.get(RESPONSE_SECRET_KEY)
        if stored is None:
            raise ConnectionError(f"{RESPONSE_SECRET_KEY} vanished right after it was written")
        secret = stored if isinstance(stored, bytes) else str(stored).encode()
        if self._signing is None or secret != self._signing[1]:
            self._add(secret, signing=True)
            logger.info("response ids signed with the secret kept in %s", RESPONSE_SECRET_KEY)

    def mint(self, query: CacheQuery, hit: CacheHit) -> str:
        """The id of a hit's response: a signed receipt, or a plain id while no secret is known."""
        if not self.ready:
            return CHAT_PREFIX + uuid.uuid4().hex
        # Receipt.of and seal in one, without the struct: this runs on every hit.
        document = hit.document or hit.key or ""
        payload = _pack_fields(query.canonical.tenant, query.canonical.user or "", query.category.name, query.version,
                               hit.layer, document, hit.key or document,
                               hit.similarity if hit.similarity is not None else 1.0, hit.score_bin or 0, hit.source,
                               int(time.time()), os.urandom(NONCE_BYTES), rule_of(hit))
        return CHAT_PREFIX + self._sign(payload)

    def seal(self, receipt: Receipt) -> str:
        """The token of a receipt (what follows ``chatcmpl-``)."""
        return self._sign(_pack(receipt))

    def _sign(self, payload: bytes) -> str:
        assert self._signing is not None and self._signer is not None
        body = bytes((self._signing[0],)) + payload
        mac = self._signer.copy()
        mac.update(body)
        tag = mac.digest()[:TAG_BYTES]
        return base64.urlsafe_b64encode(body + tag).rstrip(b"=").decode("ascii")

    def open(self, response_id: str, *, now: float | None = None) -> Receipt:
        """The receipt a response id carries.

        Raises:
            InvalidReceipt: Not a receipt signed by a known secret, altered, or older than ``ttl_s``.
        """
        token = response_id.removeprefix(CHAT_PREFIX)
        if not token or len(token) > 512 or not re.fullmatch(r"[A-Za-z0-9_-]+", token):
            raise InvalidReceipt("not a receipt")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError) as exc:
            raise InvalidReceipt("not a receipt") from exc
        # base64 decoding ignores some trailing bits: a token that does not re-encode to itself
        # was altered in them (one changed character must never pass).
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != token or len(raw) <= 1 + TAG_BYTES:
            raise InvalidReceipt("not a receipt")
        body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        secret = self._secrets.get(body[0])
        if secret is None:
            raise InvalidReceipt("signed with a secret this service does not hold")
        expected = hmac.digest(secret, _DOMAIN + body, "sha256")[:TAG_BYTES]
        if not hmac.compare_digest(expected, tag):
            raise InvalidReceipt("altered, or not ours")
        try:
            receipt = _unpack(body[1:])
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise InvalidReceipt("signed but unreadable") from exc
        age = (time.time() if now is None else now) - receipt.issued_at
        if age > self.ttl_s:
            raise InvalidReceipt("expired")
        return receipt
