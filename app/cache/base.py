"""The contract every cache layer follows: a small async ``lookup`` / ``store`` pair."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from app.cache.keys import CanonicalRequest
from app.policy import CategoryPolicy, SemanticPolicy


class EmbeddingFailed(Exception):
    """The embedding model failed; like a Redis failure, it costs a miss, not the request."""


class CorruptEntry(Exception):
    """A stored entry is not what Strata writes (edited by hand?); it is treated as a miss and
    overwritten by the next answer."""


class CacheQuery(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the cache layers see it.

    Attributes:
        canonical: The canonical request (keys and scope derive from it).
        category: The content category's policy (TTL, semantic thresholds).
        version: The version tag the lookup ran under ("v1", ...).
    """

    canonical: CanonicalRequest
    category: CategoryPolicy
    version: str


class CacheHit(msgspec.Struct, frozen=True, kw_only=True):
    """A cached answer a layer found.

    Attributes:
        layer: The layer that found it ("exact", "semantic").
        completion: The stored completion JSON.
        similarity: Cosine similarity of the matched question (semantic layer only).
        matched_question: The cached question that matched (semantic layer only).
        reason: Why the semantic candidate was accepted (semantic layer only).
        decoded: The completion, once the pipeline has decoded and checked it.
    """

    layer: str
    completion: bytes
    similarity: float | None = None
    matched_question: str | None = None
    reason: str | None = None
    decoded: dict[str, Any] | None = None


class Verdict(msgspec.Struct, frozen=True):
    """A decision of the verification stage, and why."""

    accepted: bool
    reason: str


class Verifier(Protocol):
    """Decides whether the answer cached for one question may serve another."""

    def verify(self, asked: str, cached: str, similarity: float, policy: SemanticPolicy) -> Verdict: ...


class CacheLayer(Protocol):
    """A cache layer. Redis errors propagate; the pipeline counts them and treats them as a miss."""

    name: str

    async def lookup(self, query: CacheQuery) -> CacheHit | None:
        """Find a cached answer for the query, or ``None``."""
        ...

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        """Store a complete answer for the query, with the category's TTL."""
        ...
