"""The cache as the request path sees it: a plan, the layers in order, and write-back.

:class:`LayeredCache` is the one object the pipeline talks to about the cache. It reads the
version tag into a :class:`CachePlan`, asks the layers in turn (retrying once under a newer
version tag, dropping corrupt entries), and writes complete answers back to every layer unless
the cache was invalidated while the model was answering. Cache failures never leave it: they
are logged, counted and turn the plan into ``unavailable`` (a bypass).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Protocol

import msgspec

from app import tracing
from app.cache.learning.learner import AnswerLearner, Observed
from app.cache.semantic import SEMANTIC
from app.cache.storage.contract import CACHE_ERRORS, CacheHit, CacheLayer, CacheQuery, Candidate, CorruptEntry
from app.cache.storage.exact import EXACT
from app.cache.storage.keys import NO_GENERATION, CanonicalRequest
from app.cache.storage.version import ScopeGenerations, StaleScope, StaleVersion, VersionTag
from app.metrics import Metrics
from app.policy import CategoryPolicy
from app.wire import decode_completion


def _says_something(choice: dict[str, Any]) -> bool:
    message = choice.get("message") or {}
    return bool((message.get("content") or "").strip() or message.get("tool_calls") or message.get("refusal")
                or message.get("function_call"))


class CacheMode(StrEnum):
    """What a request may do with the cache."""

    USE = "use"  # look up; store a complete answer
    REFRESH = "refresh"  # Cache-Control: no-cache: skip the lookup, store the fresh answer
    SKIP = "skip"  # Cache-Control: no-store: neither
    # Cache-Control: no-cache from a client that may not rewrite what others are served: the
    # lookup is skipped and the entry left alone.
    REFRESH_DENIED = "refresh_denied"
    NO_USER = "no_user"  # a per-user category (scope: user) without an identity: never cached
    UNCACHEABLE = "uncacheable"  # several choices (n > 1) cannot be replayed as one
    UNAVAILABLE = "unavailable"  # Redis failed (version unreadable, lookup failed): bypass


class CachePlan(msgspec.Struct, frozen=True):
    """What the cache does for one request: its mode, and the query when the cache is used.

    Attributes:
        mode: The mode.
        query: The query of modes that read or write (``USE``, ``REFRESH``), else ``None``.
        candidate: The nearest semantic candidate the lookup did not serve: once the model has
            answered, the answers are compared and the adaptive layer learns (app/cache/learning/learner.py).
    """

    mode: CacheMode
    query: CacheQuery | None = None
    candidate: Candidate | None = None

    @property
    def reads(self) -> bool:
        return self.mode is CacheMode.USE

    @property
    def writes(self) -> bool:
        return self.mode in (CacheMode.USE, CacheMode.REFRESH)


class RequestCache(Protocol):
    """What the pipeline and the relay ask of the cache: one :class:`LayeredCache`, or the
    buckets of a cluster behind one (app/cache/storage/buckets.py)."""

    @property
    def versions(self) -> VersionTag: ...

    async def plan(self, canonical: CanonicalRequest, category: CategoryPolicy, mode: CacheMode) -> CachePlan: ...

    async def lookup(self, plan: CachePlan) -> tuple[CachePlan, CacheHit | None]: ...

    def lease_key(self, query: CacheQuery) -> str: ...

    async def read_exact(self, query: CacheQuery) -> bytes | None: ...

    async def store(self, plan: CachePlan, raw: bytes, completion: dict[str, Any]) -> None: ...

    async def settle(self) -> None: ...


class LayeredCache:
    """The layers in order (exact, then semantic), behind one plan/lookup/store interface.

    Args:
        versions: The version tag of the Redis database.
        generations: The (category, tenant) generations of targeted invalidation; ``None``
            when only the global version invalidates (tools that only read).
        layers: The layers, cheapest first; one of them must be named ``exact``.
        metrics: Where lookups, stores and failures are counted.
        lookup_timeout_s: Bound on each layer's lookup; past it the request is a bypass.
        judge_timeout_s: Added to the semantic layer's bound for categories whose verification
            waits on the LLM judge.
        learner: Learns from answered misses of adaptive categories, off the request path.
        max_learning: Observations in flight per worker; beyond it new ones are dropped (counted).
    """

    def __init__(self, versions: VersionTag, layers: Sequence[CacheLayer], metrics: Metrics, *,
                 lookup_timeout_s: float, judge_timeout_s: float = 0.0, learner: AnswerLearner | None = None,
                 max_learning: int = 256, generations: ScopeGenerations | None = None) -> None:
        self.versions = versions
        self.generations = generations
        self._layers = list(layers)
        self._by_name = {layer.name: layer for layer in self._layers}
        self._span_names = {layer.name: f"strata.lookup {layer.name}" for layer in self._layers}
        if EXACT not in self._by_name:
            raise ValueError("the exact layer is required (single flight reads answers from it)")
        self._metrics = metrics
        self._lookup_timeout_s = lookup_timeout_s
        self._judge_timeout_s = judge_timeout_s
        self._learner = learner
        self._max_learning = max_learning
        self._learning: set[asyncio.Task[Observed | None]] = set()

    def layer(self, name: str) -> CacheLayer | None:
        return self._by_name.get(name)

    async def plan(self, canonical: CanonicalRequest, category: CategoryPolicy, mode: CacheMode) -> CachePlan:
        """The plan of a cacheable request: its query under the current version tag.

        Args:
            canonical: The canonical request.
            category: The content category's policy.
            mode: ``USE`` or ``REFRESH`` (other modes need no query and are planned as they are).
        """
        if not (mode is CacheMode.USE or mode is CacheMode.REFRESH):
            return CachePlan(mode)
        version = self.versions.known
        generation = self._known_generation(canonical, category)
        try:
            if version is None:
                version = await self.versions.refresh()
            if generation is None:
                assert self.generations is not None
                generation = await self.generations.refresh(category.name, canonical.tenant)
        except CACHE_ERRORS as exc:
            self._metrics.cache_failed("version", "read", exc)
            return CachePlan(CacheMode.UNAVAILABLE)
        return CachePlan(mode, CacheQuery(canonical=canonical, category=category, version=version, generation=generation))

    def _known_generation(self, canonical: CanonicalRequest, category: CategoryPolicy) -> str | None:
        if self.generations is None:
            return NO_GENERATION
        return self.generations.known(category.name, canonical.tenant)

    def _adopt(self, query: CacheQuery, stale: StaleScope) -> CacheQuery:
        if self.generations is not None:
            self.generations.observe(query.category.name, query.canonical.tenant, stale.generation)
        return msgspec.structs.replace(query, generation=stale.generation)

    async def lookup(self, plan: CachePlan) -> tuple[CachePlan, CacheHit | None]:
        """Ask each layer in turn.

        Returns:
            The plan as it stands after the lookup (its version may have moved on, or the cache
            may have failed: ``UNAVAILABLE``), and the hit, its completion decoded and checked.
        """
        if not plan.reads or plan.query is None:
            return plan, None
        query = plan.query
        candidate: Candidate | None = None
        for layer in self._layers:
            # With tracing off the span is a shared no-op and nothing below builds attributes.
            with tracing.span(self._span_names[layer.name]) as step:
                try:
                    async with asyncio.timeout(self._budget(layer, query)):
                        query, hit = await self._lookup_adopting(layer, query)
                except CACHE_ERRORS as exc:
                    self._metrics.cache_failed(layer.name, "lookup", exc)
                    if step is not None:
                        tracing.note(step, {tracing.CACHE_LAYER: layer.name, "error.type": type(exc).__name__})
                    return CachePlan(CacheMode.UNAVAILABLE), None
                if step is not None:
                    tracing.note(step, {tracing.CACHE_LAYER: layer.name, tracing.CATEGORY: query.category.name,
                                        tracing.CACHE_HIT: isinstance(hit, CacheHit)})
            if isinstance(hit, Candidate):
                candidate, hit = hit, None
            if hit is not None:
                completion = decode_completion(hit.completion)
                if completion is None:
                    self._metrics.cache_failed(layer.name, "lookup", CorruptEntry(f"{layer.name} entry is not a completion"))
                    hit = None  # a miss: the fresh answer overwrites the entry
                else:
                    hit = msgspec.structs.replace(hit, decoded=completion)
            self._metrics.lookups.labels(layer.name, "hit" if hit else "miss").inc()
            if hit is not None:
                if hit.layer == SEMANTIC:
                    self._metrics.semantic_hits.labels(query.category.name).inc()
                return CachePlan(plan.mode, query), hit
        return CachePlan(plan.mode, query, candidate), None

    async def _lookup_adopting(self, layer: CacheLayer, query: CacheQuery) -> tuple[CacheQuery, CacheHit | Candidate | None]:
        """A layer's lookup; a version tag or a scope generation moved by another worker is
        adopted and the lookup made again, each once (both may have moved: a bump, then a
        targeted invalidation). Moving again meanwhile is a cache failure: the next request adopts it."""
        adopted: set[type[Exception]] = set()
        while True:
            try:
                return query, await layer.lookup(query)
            except (StaleVersion, StaleScope) as moved:
                if type(moved) in adopted:
                    raise TimeoutError("the cache was invalidated twice during one lookup") from moved
                adopted.add(type(moved))
                if isinstance(moved, StaleVersion):
                    tag = self.versions.observe(moved.current) or await self.versions.refresh()
                    query = msgspec.structs.replace(query, version=tag)
                else:
                    query = self._adopt(query, moved)

    def _budget(self, layer: CacheLayer, query: CacheQuery) -> float:
        # The judge is a model call: its own timeout bounds it, on top of the lookup's.
        if layer.name == SEMANTIC and query.category.semantic.judge_before_serving:
            return self._lookup_timeout_s + self._judge_timeout_s
        return self._lookup_timeout_s

    def lease_key(self, query: CacheQuery) -> str:
        """The single-flight lease of a query, in this cache's keyspace."""
        return self.versions.keys.lease_key(query.version, query.entry_digest)

    async def read_exact(self, query: CacheQuery) -> bytes | None:
        """The answer stored for exactly this query (single-flight followers wait on it).

        Raises:
            Any of ``CACHE_ERRORS``.
        """
        try:
            hit = await self._by_name[EXACT].lookup(query)
        except (StaleVersion, StaleScope):
            return None  # invalidated while waiting: the leader's answer will not be stored
        if not isinstance(hit, CacheHit) or decode_completion(hit.completion) is None:
            return None  # a corrupt entry is no answer: the leader's fresh one overwrites it
        return hit.completion

    async def store(self, plan: CachePlan, raw: bytes, completion: dict[str, Any]) -> None:
        """Write a complete answer to every layer; anything else is not cached."""
        if not plan.writes or plan.query is None:
            return
        query = plan.query
        reasons = {c.get("finish_reason") for c in completion.get("choices") or []}
        # A call of tools is a complete answer too (the exact layer keeps it; the semantic layer
        # only where the category allows, app/cache/semantic.py).
        complete = bool(reasons) and reasons <= {"stop", "tool_calls"}
        # Cut by the client's own max_tokens (it is in the key): the exact layer may keep it.
        truncated = (not complete and reasons <= {"stop", "length"} and query.category.cache_truncated
                     and query.canonical.params.get("max_tokens") is not None)
        if not complete and not truncated:
            self._skip_store("skipped_incomplete")
            return
        if not any(_says_something(c) for c in completion.get("choices") or []):
            self._skip_store("skipped_empty")  # an empty answer is a model's failure, not an answer to keep
            return
        # The answer took seconds to generate: if the cache was invalidated meanwhile, it was
        # generated for a world that no longer holds. Each layer's write checks the version and
        # the generation in the same script (app/cache/storage/entry.py) and writes nothing if either moved.
        with tracing.span(tracing.WRITE_BACK) as step:
            if step is not None:
                tracing.note(step, {tracing.CATEGORY: query.category.name})
            await self._write_back(plan, query, raw, completion, complete, truncated)

    async def _write_back(self, plan: CachePlan, query: CacheQuery, raw: bytes, completion: dict[str, Any],
                          complete: bool, truncated: bool) -> None:
        checked = plan.candidate is not None and plan.candidate.first_check and complete
        writes = []
        for layer in self._layers:
            if truncated and layer.name != EXACT:
                self._metrics.stores.labels(layer.name, "skipped_truncated").inc()  # never served semantically
                continue
            if checked and layer.name == EXACT:
                continue  # written below only if the check disagrees
            writes.append(self._store_in(layer, query, raw))
        current = await asyncio.gather(*writes)  # the layers' keys are independent: one round trip's wait
        if plan.candidate is None or not complete or not all(current):
            return
        if not checked:
            self._learn(query, plan.candidate, raw)
            return
        # The check of a served hit (already off the request path): an agreeing answer leaves the
        # served one standing (the asked wording becomes an alias of its entry, so its repeats get
        # the answer it was served); a differing one is the wording's own answer, exact included.
        observed = await self._observe(query, plan.candidate, raw)
        if (observed is None or not observed.same) and EXACT in self._by_name:
            await self._store_in(self._by_name[EXACT], query, raw)

    async def _store_in(self, layer: CacheLayer, query: CacheQuery, raw: bytes) -> bool:
        """One layer's write; ``False`` when the cache was invalidated meanwhile (nothing written)."""
        try:
            await layer.store(query, raw)
        except StaleVersion as stale:
            self.versions.observe(stale.current)  # the next request plans under the new version
            self._metrics.stores.labels(layer.name, "skipped_stale_version").inc()
            return False
        except StaleScope as stale:
            if self.generations is not None:
                self.generations.observe(query.category.name, query.canonical.tenant, stale.generation)
            self._metrics.stores.labels(layer.name, "skipped_stale_version").inc()
            return False
        except CACHE_ERRORS as exc:
            self._metrics.cache_failed(layer.name, "store", exc)
            return True
        self._metrics.stored(layer.name)
        return True

    def _learn(self, query: CacheQuery, candidate: Candidate, answer: bytes) -> None:
        """Compare the fresh answer with the candidate's in the background: nothing on the
        request path waits on an observation; a full queue drops it rather than grow."""
        if self._learner is None:
            return
        if len(self._learning) >= self._max_learning:
            self._metrics.observations.labels(query.category.name, "dropped", "false").inc()
            return
        task = asyncio.create_task(self._observe(query, candidate, answer))
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    async def _observe(self, query: CacheQuery, candidate: Candidate, answer: bytes) -> Observed | None:
        """What the fresh answer taught (``None``: nothing, counted)."""
        if self._learner is None:
            return None
        try:
            observed = await self._learner.observe(query, candidate, answer)
        except CACHE_ERRORS as exc:
            self._metrics.cache_failed("learning", "observe", exc)
            return None
        if observed is None:
            self._metrics.observations.labels(query.category.name, "judge_failed", str(candidate.explored).lower()).inc()
            return None
        result = "curated" if not observed.recorded else "equivalent" if observed.same else "different"
        if candidate.first_check:
            self._metrics.intent_checks.labels(query.category.name, "agreed" if observed.same else "refuted").inc()
        else:
            self._metrics.observations.labels(query.category.name, result, str(candidate.explored).lower()).inc()
        if observed.merged:
            self._metrics.entry_merges.labels(query.category.name).inc(observed.merged)
        return observed

    async def settle(self) -> None:
        """Wait for the observations in flight (shutdown, replays that must be deterministic)."""
        while self._learning:
            await asyncio.gather(*list(self._learning), return_exceptions=True)

    def _skip_store(self, reason: str) -> None:
        for layer in self._layers:
            self._metrics.stores.labels(layer.name, reason).inc()
