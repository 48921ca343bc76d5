"""What a hit served, remembered; and end users' feedback on it (issue #24).

Every hit gets a response id (its body's ``id`` and the ``X-Cache-Response-Id`` header). After
the response, in the background, Strata writes what served it to ``strata:resp:<id>`` (tenant,
user, category, version, layer, document, entry, similarity, score bin, source), kept for
``STRATA_FEEDBACK_TTL_S``; a semantic hit also marks the question as served
(``strata:vN:served:<sha256>``), so the adaptive decision explores its repeats more often.

``POST /v1/feedback`` with that id and a verdict applies it at once, in the bucket that holds the
document:

- ``wrong`` on a semantic hit vetoes the document and its entry at that similarity and below
  (``wrong_above``: a candidate that close or further is not served from them), curated answers
  included, and counts a wrong observation in the tenant's pool at the hit's score bin; ``wrong``
  on an exact hit deletes that entry and the same question's semantic document (the model is
  asked again);
- ``right`` counts a right observation on the document and a confirmation of its entry, not in the
  pool: served hits are no fair sample, and one user's votes must not loosen what others are served.

One verdict per response (a second is refused), only from the tenant that was served, and from
its user in per-user categories; every verdict is appended to the audit stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
from redis.asyncio import Redis

from app.cache.base import CacheHit, CacheQuery, SharedRedis
from app.cache.invalidation import AuditLog, Invalidated
from app.cache.keys import (
    FIELD_CATEGORY,
    FIELD_DOCUMENT,
    FIELD_LAYER,
    FIELD_ROOT,
    FIELD_SCORE_BIN,
    FIELD_SERVED,
    FIELD_SIMILARITY,
    FIELD_SOURCE,
    FIELD_TENANT,
    FIELD_USER,
    FIELD_VERDICT,
    FIELD_VERSION,
    Keyspace,
    as_text,
    response_key,
)
from app.cache.learning import ObservationWriter

logger = logging.getLogger("strata.feedback")

EXACT, SEMANTIC = "exact", "semantic"
Verdict = Literal["right", "wrong"]


class FeedbackRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/feedback``.

    Attributes:
        id: The response's id (``chatcmpl-...``: its body's ``id``, or ``X-Cache-Response-Id``).
        verdict: ``wrong`` (the answer was not for this question) or ``right``.
        comment: Free text for the audit stream (at most 500 characters).
    """

    id: str = msgspec.field(name="id")
    verdict: Verdict
    comment: str = ""


class Served(msgspec.Struct, frozen=True, kw_only=True):
    """What one hit served: the response record.

    Attributes:
        tenant: Whose request.
        user: Its user in a per-user category ("" otherwise).
        category: Its category.
        version: The version tag it was served under.
        layer: ``exact`` or ``semantic``.
        document: The document that matched (the exact entry, or a semantic entry or alias).
        root: The entry whose answer it served.
        similarity: The questions' similarity (semantic hits).
        score_bin: The decision score's bin (semantic hits).
        source: ``model`` or ``faq``.
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

    def to_hash(self) -> dict[str, str | int | float]:
        return {FIELD_TENANT: self.tenant, FIELD_USER: self.user, FIELD_CATEGORY: self.category,
                FIELD_VERSION: self.version, FIELD_LAYER: self.layer, FIELD_DOCUMENT: self.document,
                FIELD_ROOT: self.root, FIELD_SIMILARITY: round(self.similarity, 4), FIELD_SCORE_BIN: self.score_bin,
                FIELD_SOURCE: self.source}

    @classmethod
    def from_hash(cls, raw: dict[bytes | str, bytes | str]) -> Served:
        fields = {str(as_text(k)): str(as_text(v)) for k, v in raw.items()}
        return cls(tenant=fields[FIELD_TENANT], user=fields.get(FIELD_USER, ""), category=fields[FIELD_CATEGORY],
                   version=fields[FIELD_VERSION], layer=fields[FIELD_LAYER], document=fields[FIELD_DOCUMENT],
                   root=fields[FIELD_ROOT], similarity=float(fields.get(FIELD_SIMILARITY, 1.0)),
                   score_bin=int(fields.get(FIELD_SCORE_BIN, 0)), source=fields.get(FIELD_SOURCE, "model"))

    @classmethod
    def of(cls, query: CacheQuery, hit: CacheHit) -> Served:
        """The record of a hit a query was served."""
        document = hit.document or hit.key or ""
        return cls(tenant=query.canonical.tenant, user=query.canonical.user or "", category=query.category.name,
                   version=query.version, layer=hit.layer, document=document, root=hit.key or document,
                   similarity=hit.similarity if hit.similarity is not None else 1.0, score_bin=hit.score_bin or 0,
                   source=hit.source)


class FeedbackError(Exception):
    """A verdict that cannot be applied; ``status`` says why (404: no such response for this
    caller; 409: a verdict was given already)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServedLog:
    """Response records (outside any bucket) and the served questions of one bucket.

    Args:
        shared: The client of keys outside any bucket (the response records).
        redis: The bucket's Redis (its served questions).
        keys: The bucket's keyspace.
        ttl_s: How long a response can be given feedback; 0 records no responses.
    """

    def __init__(self, shared: SharedRedis, redis: Redis, keys: Keyspace, ttl_s: int) -> None:
        self._shared = shared
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s

    async def remember(self, query: CacheQuery, hit: CacheHit, response_id: str) -> None:
        """Record what served a response; mark a semantically served question."""
        served = Served.of(query, hit)
        # The served question first, the response record last: whoever sees the record (feedback,
        # a test waiting for it) sees everything the hit left.
        if hit.layer == SEMANTIC:
            key = self._keys.served_key(query.version, query.entry_digest)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping={FIELD_DOCUMENT: served.document, FIELD_ROOT: served.root,
                                        FIELD_SIMILARITY: round(served.similarity, 4)})
                pipe.hincrby(key, FIELD_SERVED, 1)
                pipe.expire(key, query.category.ttl_seconds)
                await pipe.execute()
        if self._ttl_s > 0:
            key = response_key(response_id)
            async with self._shared.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping=served.to_hash())  # type: ignore[arg-type]
                pipe.expire(key, self._ttl_s)
                await pipe.execute()

    async def claim(self, response_id: str, tenant: str, user: str | None, verdict: str) -> Served:
        """The record of a response the caller may judge, with the verdict now set on it.

        Raises:
            FeedbackError: No such response for this tenant (or user), or judged already.
        """
        key = response_key(response_id)
        raw = await self._shared.hgetall(key)
        if not raw:
            raise FeedbackError(f"no response {response_id!r} to give feedback on (unknown, not a hit, or expired)", 404)
        served = Served.from_hash(raw)
        # Another tenant's (or, in a per-user category, another user's) response is as unknown.
        if served.tenant != tenant or (served.user and user is not None and served.user != user):
            raise FeedbackError(f"no response {response_id!r} to give feedback on (unknown, not a hit, or expired)", 404)
        if not await self._shared.hsetnx(key, FIELD_VERDICT, verdict):
            raise FeedbackError(f"response {response_id!r} has feedback already", 409)
        return served


@dataclass(frozen=True)
class FeedbackTarget:
    """Where feedback on one bucket's documents is applied."""

    redis: Redis
    observations: ObservationWriter


class FeedbackApplied(msgspec.Struct, frozen=True, kw_only=True):
    """What a verdict did (the endpoint's response body).

    Attributes:
        id: The response.
        verdict: ``right`` or ``wrong``.
        layer: The layer that had served it.
        applied: In words: the veto, the deletion or the observation recorded.
    """

    object: str = "feedback"
    id: str
    verdict: str
    layer: str
    applied: str


class Feedback:
    """Applies end users' verdicts on served responses.

    Args:
        log: The response records.
        targets: One per bucket, in the buckets' order.
        holding: The bucket index of a document's key (``Buckets.holding``).
        audit: The audit stream.
    """

    def __init__(self, log: ServedLog, targets: Sequence[FeedbackTarget], holding: Callable[[str], int | None],
                 audit: AuditLog) -> None:
        self._log = log
        self._targets = tuple(targets)
        self._holding = holding
        self._audit = audit

    async def give(self, feedback: FeedbackRequest, *, tenant: str, user: str | None, who: str) -> FeedbackApplied:
        """Apply one verdict at once.

        Raises:
            FeedbackError: Unknown response for this caller (404), or judged already (409).
        """
        served = await self._log.claim(feedback.id, tenant, user, feedback.verdict)
        index = self._holding(served.document)
        if index is None or index >= len(self._targets):
            raise FeedbackError(f"response {feedback.id!r} was served from a bucket this cluster no longer has", 404)
        target = self._targets[index]
        wrong = feedback.verdict == "wrong"
        if served.layer == EXACT:
            # The same question's semantic document (same digest) holds the same answer: it goes too.
            same_question = served.document.replace(":exact:", ":sem:", 1)
            deleted = int(await target.redis.unlink(served.document, same_question)) if wrong else 0
            applied = "deleted the exact entry" if deleted else "nothing to change" if wrong else "noted"
        else:
            await target.observations.record(served.version, served.category, served.tenant, document=served.document,
                                             root=served.root, similarity=served.similarity, score_bin=served.score_bin,
                                             same=not wrong, pooled=wrong)
            applied = (f"vetoed {'the entry' if served.document == served.root else 'the alias and its entry'} at "
                       f"similarity {served.similarity:.3f} and below; a wrong observation at bin {served.score_bin}"
                       if wrong else f"a confirmation of the entry at bin {served.score_bin}")
        done = Invalidated(kind="feedback", target=f"{feedback.verdict} {served.layer} {served.document}")
        await self._audit.record_event(who=who, done=done, request={"id": feedback.id, "verdict": feedback.verdict,
                                                                    "comment": feedback.comment[:500],
                                                                    "similarity": served.similarity,
                                                                    "at": int(time.time())})
        logger.info("feedback %s on %s (%s): %s", feedback.verdict, feedback.id, served.document, applied)
        return FeedbackApplied(id=feedback.id, verdict=feedback.verdict, layer=served.layer, applied=applied)
