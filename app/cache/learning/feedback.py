"""End users' feedback on served answers (issue #24), named by the hit's receipt (issue #32).

Every hit gets a response id (its body's ``id`` and the ``X-Cache-Response-Id`` header) that
carries what served it, signed (app/cache/learning/receipts.py): serving a hit writes nothing to Redis.

``POST /v1/feedback`` with that id and a verdict applies it at once, in the bucket that holds the
document:

- ``wrong`` on a semantic hit vetoes the document and its entry at that similarity and below
  (``wrong_above``: a candidate that close or further is not served from them), curated answers
  included, and counts a wrong observation in the tenant's pool at the hit's score bin; ``wrong``
  on an exact hit deletes that entry and the same question's semantic document (the model is
  asked again);
- ``right`` counts a right observation on the document and a confirmation of its entry, not in the
  pool: served hits are no fair sample, and one user's votes must not loosen what others are served.

One verdict per response (``strata:fb:<nonce>``; a second is refused), only from the tenant that
was served, and from its user in per-user categories; an id that is altered, forged or older
than ``STRATA_FEEDBACK_TTL_S`` names nothing. Every verdict is appended to the audit stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
from redis.asyncio import Redis

from app.cache.decision.stats import VOUCH_KINDS
from app.cache.learning.observations import Observation, ObservationWriter
from app.cache.learning.receipts import InvalidReceipt, Receipt, ResponseIds
from app.cache.storage.contract import SharedRedis
from app.cache.storage.invalidation import AuditLog, Invalidated
from app.cache.storage.keys import (
    FIELD_INTENT,
    VOUCH_INTENT,
    VOUCH_PROBATION,
    as_text,
    intent_field,
    observation_field,
    probation_field,
    verdict_key,
)

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


class FeedbackError(Exception):
    """A verdict that cannot be applied; ``status`` says why (404: no such response for this
    caller; 409: a verdict was given already)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Verdicts:
    """The receipts of served responses, opened for feedback, and one verdict each.

    Args:
        shared: The client of keys outside any bucket (the verdicts).
        ids: Mints and opens response ids.
    """

    def __init__(self, shared: SharedRedis, ids: ResponseIds) -> None:
        self._shared = shared
        self._ids = ids

    async def claim(self, response_id: str, tenant: str, user: str | None, verdict: str) -> Receipt:
        """The receipt of a response the caller may judge, with its verdict now recorded.

        Raises:
            FeedbackError: No such response for this tenant (or user), or judged already.
        """
        unknown = FeedbackError(f"no response {response_id!r} to give feedback on (unknown, not a hit, or expired)", 404)
        try:
            receipt = self._ids.open(response_id)
        except InvalidReceipt as exc:
            raise unknown from exc
        # Another tenant's (or, in a per-user category, another user's) response is as unknown.
        if receipt.tenant != tenant or (receipt.user and user is not None and receipt.user != user):
            raise unknown
        remaining = max(1, self._ids.ttl_s - (int(time.time()) - receipt.issued_at))
        if not await self._shared.set(verdict_key(receipt.nonce), verdict, nx=True, ex=remaining):
            raise FeedbackError(f"response {response_id!r} has feedback already", 409)
        return receipt


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
        log: The receipts and their verdicts.
        targets: One per bucket, in the buckets' order.
        holding: The bucket index of a document's key (``Buckets.holding``).
        audit: The audit stream.
    """

    def __init__(self, log: Verdicts, targets: Sequence[FeedbackTarget], holding: Callable[[str], int | None],
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
            # A "wrong" on a hit a rule vouched for (the team's intents) counts against that rule too.
            kinds = VOUCH_KINDS.get(served.rule)
            rules: tuple[str, ...] = (observation_field(kinds[1], served.score_bin),) \
                if kinds is not None and wrong else ()
            if rules and served.rule == VOUCH_INTENT:
                # ...and against its intent (the document's, which the rule served on).
                intent = as_text(await target.redis.hget(served.document, FIELD_INTENT))
                rules += (intent_field(False, intent),) if intent else ()
            elif wrong and served.rule == VOUCH_PROBATION:
                # A hit served on probation: a "wrong" counts on its intent's probation record (a
                # "right" does not: askers who answer at all are not a fair sample of the hits).
                intent = as_text(await target.redis.hget(served.document, FIELD_INTENT))
                rules = (probation_field(False, intent),) if intent else ()
            await target.observations.record(Observation.FEEDBACK, served.version, served.category, served.tenant,
                                             document=served.document, root=served.root, similarity=served.similarity,
                                             score_bin=served.score_bin, same=not wrong, rules=rules)
            applied = (f"vetoed {'the entry' if served.document == served.root else 'the alias and its entry'} at "
                       f"similarity {served.similarity:.3f} and below; a wrong observation at bin {served.score_bin}"
                       if wrong else f"a confirmation of the entry at bin {served.score_bin}")
        done = Invalidated(kind="feedback", target=f"{feedback.verdict} {served.layer} {served.document}")
        await self._audit.record_event(who=who, done=done, request={"id": feedback.id, "verdict": feedback.verdict,
                                                                    "comment": feedback.comment[:500],
                                                                    "similarity": served.similarity,
                                                                    "tenant": served.tenant,
                                                                    "category": served.category,
                                                                    "at": int(time.time())})
        logger.info("feedback %s on %s (%s): %s", feedback.verdict, feedback.id, served.document, applied)
        return FeedbackApplied(id=feedback.id, verdict=feedback.verdict, layer=served.layer, applied=applied)
