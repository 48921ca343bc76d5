"""The recent hits of this worker (exact and semantic), in memory, for the console's "what was
served" page: what a support lead searches when an answer looks wrong.

Kept in a bounded ring per worker (``RECENT_HITS``), never in Redis: a hit writes nothing
(issue #32). A restart forgets them; every hit's response id still names it for feedback.
"""

from __future__ import annotations

import time
from collections import deque

import msgspec

from app.cache.storage.contract import CacheHit, CacheQuery

RECENT_HITS = 500


# The verdict shown for an exact hit: the same request again, nothing to decide.
EXACT_REPEAT = "exact_repeat"


class ServedHit(msgspec.Struct, frozen=True, kw_only=True):
    """One hit as served.

    Attributes:
        at: Unix time it was served.
        response_id: Its response id (the receipt feedback takes).
        tenant: Whose question.
        category: Its category.
        asked: The asked question.
        cached: The cached question whose answer it served (the asked one, for an exact hit).
        similarity: Their cosine similarity (1 for an exact hit).
        verdict: The rule that served it (``X-Cache-Verdict``; ``exact_repeat`` for an exact hit).
        source: ``model`` or ``faq``.
        answer: The answer served (its text).
        layer: ``exact`` or ``semantic``.
    """

    at: float
    response_id: str
    tenant: str
    category: str
    asked: str
    cached: str
    similarity: float
    verdict: str
    source: str
    answer: str
    layer: str = "semantic"


class RecentHits:
    """The last :data:`RECENT_HITS` hits of this worker, newest first."""

    def __init__(self, size: int = RECENT_HITS) -> None:
        self._hits: deque[ServedHit] = deque(maxlen=size)

    def add(self, query: CacheQuery, hit: CacheHit, response_id: str) -> None:
        message = ((hit.decoded or {}).get("choices") or [{}])[0].get("message") or {}
        asked = query.canonical.question or ""
        exact = hit.layer != "semantic"
        self._hits.appendleft(ServedHit(
            at=time.time(), response_id=response_id, tenant=query.canonical.tenant, category=query.category.name,
            asked=asked, cached=asked if exact else hit.matched_question or "",
            similarity=1.0 if exact else hit.similarity or 0.0, verdict=EXACT_REPEAT if exact else hit.reason or "",
            source=hit.source, answer=str(message.get("content") or ""), layer=hit.layer))

    def latest(self, *, tenant: str | None = None, category: str | None = None, verdict: str | None = None,
               layer: str | None = None, count: int = 100) -> list[ServedHit]:
        """The newest hits that match every filter given."""
        found = []
        for hit in self._hits:
            if (tenant is None or hit.tenant == tenant) and (category is None or hit.category == category) \
                    and (verdict is None or hit.verdict == verdict) and (layer is None or hit.layer == layer):
                found.append(hit)
                if len(found) == count:
                    break
        return found
