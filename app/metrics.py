"""Prometheus instruments, one set per app instance (so tests can build several apps)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

# Set by `python -m app.serve` when it runs several workers: every worker then writes its
# values to files there, and a scrape of any worker reports the sum over all of them.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Latency buckets from sub-millisecond cache hits to long generations.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)

_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.015, 0.02,
                     0.03, 0.05, 0.1, 0.25)

CONTENT_TYPE = CONTENT_TYPE_LATEST

logger = logging.getLogger("strata.metrics")


class OutcomeLog(Protocol):
    """Where finished requests are also counted by category and outcome (app/cache/storage/usage.py
    keeps them in Redis for ``strata cache stats``)."""

    def add(self, category: str, outcome: str, now: float | None = None, *, tenant: str | None = None,
            seconds: float | None = None, curated: bool = False, coalesced: bool = False) -> None: ...


class Metrics:
    """The service's counters and histograms.

    Attributes:
        requests: Chat requests by cache outcome (exact-hit, semantic-hit, miss, bypass, error).
        lookups: Cache lookups by layer and result (hit, miss, error).
        latency: Request latency by outcome.
        upstream_requests: Calls to the model server by result.
        upstream_tokens: Tokens the model server reported, by kind (prompt, completion).
        cache_errors: Failed cache operations by layer and operation; each was treated as a miss.
        stores: Answers written back, by layer and result (stored, skipped).
        embed_batches: Embedding model runs; fewer than texts embedded when batching works.
        embed_texts: Texts embedded.
        verifications: Semantic candidates by verification decision and reason.

    Args:
        tenant_labels: Whether series name their tenant (``tenant="-"`` for every one otherwise).
        outcomes: Also counts each finished request's category and outcome (usage in Redis).
    """

    def __init__(self, *, tenant_labels: bool = True, outcomes: OutcomeLog | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Without tenant labels every tenant's series is one (``tenant="-"``): a scrape names no tenant.
        self._tenant_labels = tenant_labels
        # The latest failed cache write (when, what) until a write succeeds: /health reports it.
        self.write_failure: tuple[float, str] | None = None
        # Requests per category and outcome, added to Redis every few seconds (strata cache stats).
        self._outcomes = outcomes
        r = self.registry
        self.requests = Counter("strata_requests", "Chat requests by cache outcome", ["outcome"], registry=r)
        self.category_requests = Counter(
            "strata_category_requests", "Chat requests by cache category and outcome", ["category", "outcome"], registry=r
        )
        self.endpoint_requests = Counter(
            "strata_endpoint_requests", "Generation requests by endpoint (chat, completions, responses, messages) and "
            "cache outcome", ["endpoint", "outcome"], registry=r,
        )
        self.embedding_requests = Counter(
            "strata_embedding_requests", "Embeddings requests by outcome (exact-hit, miss, bypass, error)", ["outcome"],
            registry=r,
        )
        self.passthrough_requests = Counter(
            "strata_passthrough_requests", "Other /v1/ requests passed to the model server, by status class",
            ["status"], registry=r,
        )
        self.lookups = Counter("strata_cache_lookups", "Cache lookups by layer and result", ["layer", "result"], registry=r)
        self.latency = Histogram(
            "strata_request_duration_seconds", "Request latency by outcome", ["outcome"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.miss_overhead = Histogram(
            "strata_miss_overhead_seconds",
            "Time a non-streamed miss spends in Strata outside the upstream call until its response is ready "
            "(parsing, lookups, single flight; the write-back runs after the response)", buckets=_OVERHEAD_BUCKETS, registry=r,
        )
        self.upstream_requests = Counter("strata_upstream_requests", "Calls to the model server", ["result"], registry=r)
        self.upstream_tokens = Counter("strata_upstream_tokens", "Tokens reported by the model server", ["kind"], registry=r)
        self.cache_errors = Counter(
            "strata_cache_errors", "Failed cache operations (each treated as a miss)", ["layer", "operation"], registry=r
        )
        self.stores = Counter("strata_cache_stores", "Answers written back by layer and result", ["layer", "result"], registry=r)
        self.singleflight = Counter(
            "strata_singleflight", "Identical concurrent misses: leaders and coalesced followers", ["role"], registry=r
        )
        self.uncached = Counter(
            "strata_uncached", "Requests deliberately neither served from nor stored in the cache, by category and "
            "reason (no_user: a per-user category without an identity; refresh_denied: Cache-Control no-cache "
            "on a shared category without the right to rewrite it)", ["category", "reason"], registry=r,
        )
        self.embed_batches = Counter("strata_embed_batches", "Embedding model runs (each a batch)", registry=r)
        self.embed_texts = Counter("strata_embed_texts", "Texts embedded", registry=r)
        self.verifications = Counter(
            "strata_semantic_verifications", "Semantic candidates by decision and reason", ["decision", "reason"], registry=r
        )
        self.prompt_dynamic = Counter(
            "strata_prompt_dynamic", "Requests whose system prompt holds dynamic content, by kind and tenant",
            ["kind", "tenant"], registry=r,
        )
        # The model server's own prefix cache (L3), as it reports it: totals since it started.
        self.upstream_prefix_cache = Gauge(
            "strata_upstream_prefix_cache", "The model server's prefix cache: queried and hit prompt tokens, hit ratio",
            ["value"], registry=r, multiprocess_mode="mostrecent",
        )
        self.intent_heads = Gauge(
            "strata_intent_heads",
            "A team's intents per tenant and category: 1 on its status at the last /metrics read "
            "(serving, serves_nothing, suspended, refused), 0 on the others",
            ["tenant", "category", "status"], registry=r, multiprocess_mode="mostrecent",
        )
        self.intents_set_aside = Gauge(
            "strata_intents_set_aside",
            "A team's intents set aside one by one (their measured hits refute the calibration) per tenant and "
            "category, at the last /metrics read",
            ["tenant", "category"], registry=r, multiprocess_mode="mostrecent",
        )
        self.dependency_up = Gauge(
            "strata_dependency_up", "Whether Redis and the model server answered at the last /metrics or /health read",
            ["dependency"], registry=r, multiprocess_mode="mostrecent",
        )
        self.semantic_error = Gauge(
            "strata_semantic_error_rate",
            "Adaptive categories: wrong share of served semantic hits estimated from explored hits (estimate), "
            "its upper confidence bound (upper_bound) and the category's error bound (bound)",
            ["category", "value"], registry=r, multiprocess_mode="mostrecent",
        )
        self.writes_failing = Gauge(
            "strata_cache_writes_failing",
            "1 while the cache's latest write failed and none has succeeded since (Redis full, read-only, ...)",
            registry=r, multiprocess_mode="max",
        )
        self.reader_verdicts = Counter(
            "strata_reader_verdicts", "Verdicts of the grey zone's reader (app/cache/readers), by reader, when it was "
            "asked (now: on the request path; after: off it) and verdict (yes, no, failed, dropped)",
            ["reader", "when", "verdict"], registry=r,
        )
        self.judge_pending = Gauge(
            "strata_judge_pending", "Reads of the grey zone's reader in flight after the response",
            registry=r, multiprocess_mode="livesum",
        )
        self.learned_max_tokens = Gauge(
            "strata_learned_max_tokens", "L4: the max_tokens learnt per category for requests that name none",
            ["category"], registry=r, multiprocess_mode="mostrecent",
        )
        self.learned_cap_cuts = Counter(
            "strata_learned_cap_cuts", "L4: answers the learnt max_tokens cut (finish_reason length)", ["category"], registry=r
        )
        self.semantic_hits = Counter(
            "strata_semantic_hits", "Semantic hits served, by category", ["category"], registry=r
        )
        self.observations = Counter(
            "strata_semantic_observations",
            "Answered misses compared with their nearest candidate, by category, result (equivalent, different, "
            "curated, dropped, judge_failed) and whether the candidate would have been served (explored)",
            ["category", "result", "explored"], registry=r,
        )
        self.intent_checks = Counter(
            "strata_intent_checks",
            "The intent rule's first hits of an entry checked against the model after the response, by category and "
            "result (agreed: the entry is checked; refuted: its answer is not its intent's; dropped: too many in "
            "flight; failed: the model did not answer)",
            ["category", "result"], registry=r,
        )
        self.feedback = Counter(
            "strata_feedback", "End users' verdicts on served hits (POST /v1/feedback), by verdict and layer",
            ["verdict", "layer"], registry=r,
        )
        self.entry_merges = Counter(
            "strata_semantic_entry_merges",
            "Entries merged into another of an equivalent answer (found by an answered miss), by category",
            ["category"], registry=r,
        )

    def finish(self, outcome: str, started: float, category: str | None = None, *, tenant: str | None = None,
               curated: bool = False, coalesced: bool = False) -> None:
        """Count one finished request (and its category's) and its latency since ``started``
        (``perf_counter``); with its tenant, also per tenant and layer for the console
        (``curated``: a curated answer served it; ``coalesced``: it waited on an identical miss)."""
        elapsed = time.perf_counter() - started
        self.requests.labels(outcome).inc()
        if category is not None:
            self.category_requests.labels(category, outcome).inc()
            if self._outcomes is not None:
                self._outcomes.add(category, outcome, tenant=tenant, seconds=elapsed, curated=curated,
                                   coalesced=coalesced)
        self.latency.labels(outcome).observe(elapsed)

    def tenant(self, tenant: str) -> str:
        """The value of a ``tenant`` label: the tenant, or ``-`` with tenant labels off."""
        return tenant if self._tenant_labels else "-"

    def count_tokens(self, usage: Any) -> None:
        """Count the tokens of an upstream answer's ``usage``, when it has any."""
        if isinstance(usage, dict):
            for kind in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(kind), int):
                    self.upstream_tokens.labels(kind.removesuffix("_tokens")).inc(usage[kind])

    def cache_failed(self, layer: str, operation: str, exc: BaseException) -> None:
        """A cache operation failed: logged and counted; the caller treats it as a miss."""
        logger.warning("cache %s %s failed, treated as a miss: %r", layer, operation, exc)
        self.cache_errors.labels(layer, operation).inc()
        if operation == "store":
            self.write_failure = (time.monotonic(), f"{layer}: {exc!r}"[:300])
            self.writes_failing.set(1)

    def stored(self, layer: str) -> None:
        """An answer was written to a layer: writes work (again)."""
        self.stores.labels(layer, "stored").inc()
        if self.write_failure is not None:
            self.write_failure = None
            self.writes_failing.set(0)

    def failing_writes(self, within_s: float = 300.0) -> str | None:
        """The latest write failure, when no write has succeeded since and it is recent."""
        if self.write_failure is None or time.monotonic() - self.write_failure[0] > within_s:
            return None
        return self.write_failure[1]

    def verdict(self, verdict: Any) -> None:
        """Count one verification verdict (``accepted``, ``reason``)."""
        self.verifications.labels("accept" if verdict.accepted else "reject", verdict.reason).inc()

    def render(self) -> bytes:
        if os.environ.get(MULTIPROCESS_ENV):
            combined = CollectorRegistry()
            MultiProcessCollector(combined)
            return generate_latest(combined)
        return generate_latest(self.registry)
