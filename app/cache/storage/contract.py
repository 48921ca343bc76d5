"""The contract every cache layer follows: a small async ``lookup`` / ``store`` pair, the values
they exchange, and the exceptions they may raise."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import msgspec
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from redisvl.exceptions import RedisVLError

from app.cache.storage.keys import NO_GENERATION, CanonicalRequest, with_generation
from app.cache.storage.version import StaleScope, StaleVersion
from app.policy import CategoryPolicy, SemanticPolicy

__all__ = [
    "CACHE_ERRORS", "CacheHit", "CacheLayer", "CacheQuery", "Candidate", "CorruptEntry", "EmbeddingFailed", "Nearest",
    "SharedRedis", "StaleScope", "StaleVersion", "Verdict", "Verifier",
]

# The client of keys outside any bucket (leases, usage, L4's statistics, the audit stream): the
# one Redis, or on a cluster the cluster client, which routes each key to its slot's master.
SharedRedis = Redis | RedisCluster


class EmbeddingFailed(Exception):
    """The embedding model failed; like a Redis failure, it costs a miss, not the request."""


class CorruptEntry(Exception):
    """A stored entry is not what Strata writes (edited by hand?); it is treated as a miss and
    overwritten by the next answer."""


# Cache-side failures: Redis errors and timeouts, the embedder, corrupt entries. Each is logged,
# counted and treated as a miss; anything else is a bug and propagates.
CACHE_ERRORS = (RedisError, RedisVLError, OSError, TimeoutError, EmbeddingFailed, CorruptEntry)


class CacheQuery(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the cache layers see it.

    Attributes:
        canonical: The canonical request (keys and scope derive from it).
        category: The content category's policy (TTL, semantic thresholds).
        version: The version tag the lookup ran under ("v1", ...).
        generation: The (category, tenant) generation it ran under ("c.t.p", bumped by a
            targeted invalidation); part of its keys and semantic scope.
    """

    canonical: CanonicalRequest
    category: CategoryPolicy
    version: str
    generation: str = NO_GENERATION

    @property
    def entry_digest(self) -> str:
        """The key suffix of its entries (exact and semantic) and single-flight lease."""
        return with_generation(self.canonical.exact_digest, self.generation)

    @property
    def scope_digest(self) -> str:
        """What a semantic match must share: the canonical scope under the generation."""
        return with_generation(self.canonical.scope_digest, self.generation)


class CacheHit(msgspec.Struct, frozen=True, kw_only=True):
    """A cached answer a layer found.

    Attributes:
        layer: The layer that found it ("exact", "semantic").
        completion: The stored completion JSON.
        similarity: Cosine similarity of the matched question (semantic layer only).
        matched_question: The cached question that matched (semantic layer only).
        reason: Why the semantic candidate was accepted (semantic layer only).
        decoded: The completion, once the cache has decoded and checked it.
        source: ``model`` (the model's answer) or ``faq`` (an operator's curated answer).
        key: The entry it came from (semantic layer: the entry whose answer it serves).
        document: The document that matched: the exact entry, or a semantic entry or alias.
        score_bin: The adaptive decision's score bin (semantic layer only).
        check: The intent rule served it before its entry's answer was checked against its
            intent (``intent_first_check``): the pipeline asks the model the same question after
            the response and stores its answer with this as the plan's candidate, as a miss's.
    """

    layer: str
    completion: bytes
    similarity: float | None = None
    matched_question: str | None = None
    reason: str | None = None
    decoded: dict[str, Any] | None = None
    source: str = "model"
    key: str | None = None
    document: str | None = None
    score_bin: int | None = None
    check: Candidate | None = None


class Nearest(NamedTuple):
    """One row of a KNN query: a cached document, most similar first.

    Attributes:
        key: The document (an entry or an alias).
        similarity: Its cosine similarity to the asked question.
        fields: Its returned fields (question, answer, root, wrong_above, source), as Redis gave them.
    """

    key: str
    similarity: float
    fields: dict[str, Any]


class Neighbour(msgspec.Struct, frozen=True, kw_only=True):
    """Another entry near a candidate: if the model's answer turns out to match both, they are
    one answer in two entries, and are merged (app/cache/learning/learner.py).

    Attributes:
        root: The entry.
        answer: Its answer.
    """

    root: str
    answer: bytes


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """The nearest cached question a layer did not serve, worth learning from once the model
    has answered (app/cache/learning/learner.py).

    Attributes:
        key: The document that matched (an entry or an alias).
        root: The entry whose answer it serves.
        question: Its question.
        answer: The answer it would have served.
        similarity: Cosine similarity of the two questions.
        score_bin: The decision score's bin (similarity and margin, x100).
        explored: Whether it would have been served and was sent upstream to check the estimate.
        neighbours: Other entries of the model's answers among the nearest documents (a few).
        source: ``model`` or ``faq``: a curated answer is not judged by the model's answer.
        vouched: The rule that vouched for it beside the pool (``record``, ``reader``; "" if
            none): the model's answer counts for or against that rule.
        read: Whether the reader is to read it after the response (not trusted here yet).
        reader_said_no: Whether a reader trusted here said no on the request path: the model's
            answer measures that no, as it measures a read after the response.
        refused: Why the decision refused it (``outside_bound``, ``reader_rejected``, ...; ""
            when it was served or explored): such a candidate
            whose answers disagree goes to the review queue.
        intent: The team's intent the intent rule vouched on ("" for another rule): the model's
            answer counts for or against that intent too.
        first_check: The intent rule served it before its entry was checked
            (``intent_first_check``): the model's answer, asked after the response, marks the
            entry checked or refuted and counts on the document and entry only, never in the
            pool (a chosen sample, not a drawn one).
        trial_bin: A pair the intent rule would have served, had its head certified anything
            (``intent_trial``): the model's answer counts on the rule's trial record too, in
            this hundredth of the pair's lower confidence; -1: none.
        probation: The intent rule served it on probation and asked for its check: the model's
            answer counts on the probation record of ``intent``, and of the pair's lower
            confidence (``probation_bin``, hundredths).
        far: Served on probation from a cached question further than the near floor: the
            model's answer counts on the far record (``intent_far_ok``/``intent_far_wrong``) alone.
    """

    key: str
    root: str
    question: str
    answer: bytes
    similarity: float
    score_bin: int
    explored: bool = False
    neighbours: tuple[Neighbour, ...] = ()
    source: str = "model"
    vouched: str = ""
    read: bool = False
    reader_said_no: bool = False
    refused: str = ""
    intent: str = ""
    first_check: bool = False
    trial_bin: int = -1
    probation: bool = False
    probation_bin: int = -1
    far: bool = False


class Verdict(msgspec.Struct, frozen=True):
    """A decision of the verification stage, and why."""

    accepted: bool
    reason: str


class Verifier(Protocol):
    """Decides whether the answer cached for one question may serve another."""

    def verify(self, asked: str, cached: str, similarity: float, policy: SemanticPolicy) -> Verdict: ...

    def guard(self, asked: str, cached: str) -> str | None:
        """The guards alone: the reason they reject the pair, or ``None``."""
        ...

    def guards(self, asked: str, cached: str) -> tuple[str, ...]:
        """Every guard that rejects the pair (``guard`` is the first)."""
        ...

    def same_content(self, asked: str, cached: str) -> bool:
        """Whether the two questions say the same words (a repeat in other function words)."""
        ...

    def names_values(self, question: str) -> bool:
        """Whether the question names a value the guards compare (a number, an id, a date, a name)."""
        ...


class CacheLayer(Protocol):
    """A cache layer.

    Both methods may raise :class:`StaleVersion` (the version tag moved on; the caller adopts the
    new one and asks again) and any of :data:`CACHE_ERRORS` (the caller counts it and treats it as
    a miss). Nothing else is expected of them.
    """

    name: str

    async def lookup(self, query: CacheQuery) -> CacheHit | Candidate | None:
        """Find a cached answer for the query: a hit, a candidate it did not serve (a miss the
        layer wants to learn from), or ``None``."""
        ...

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        """Store a complete answer for the query, with the category's TTL.

        Raises:
            StaleVersion: The version tag moved since the query was planned (nothing stored).
            StaleScope: The scope's generation moved (nothing stored).
        """
        ...
