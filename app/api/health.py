"""``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get

from app.cache.decision.rules import intents_refuted
from app.cache.storage.contract import CACHE_ERRORS
from app.errors import Unauthorized
from app.lifespan import Resources
from app.metrics import CONTENT_TYPE
from app.policy import AdaptiveSemantic
from app.upstream_metrics import PrefixCache

# What /health says of a team's intents (and /metrics, one series each).
INTENT_STATUSES = ("serving", "serves_nothing", "suspended", "refused")


class HealthController(Controller):
    @get("/health")
    async def health(self, resources: Resources) -> dict[str, Any]:
        """``ok`` when Redis and the upstream both answer, ``degraded`` otherwise."""
        redis, up, error = await self._dependencies(resources)
        upstream: dict[str, Any] = {"status": "ok"} if up else {"status": "down", "error": error}
        if up:
            cache = await self._prefix_cache(resources)
            if cache is not None:
                upstream["prefix_cache"] = {"hit_ratio": cache.ratio, "queried_tokens": cache.queries,
                                            "hit_tokens": cache.hits, "metrics": list(cache.names)}
        status = "ok" if redis["status"] == "ok" and up else "degraded"
        body: dict[str, Any] = {"status": status, "redis": redis, "upstream": upstream}
        if redis["status"] == "ok" and resources.cache.semantic is not None:
            body["semantic"], warnings = await self._live_precision(resources)
            intents, intent_warnings = await self._intents(resources)
            if intents:
                body["intents"] = intents
            if warnings or intent_warnings:
                body["warnings"] = warnings + intent_warnings
        return body

    @staticmethod
    async def _intents(resources: Resources) -> tuple[list[dict[str, Any]], list[str]]:
        """Per tenant and category with intents loaded (``strata intents load``): what is loaded and
        whether it serves: ``serving``; ``serves_nothing`` (not calibrated under the bound);
        ``suspended`` (the tenant's measured intent hits refute the calibration, until the next
        load); ``refused`` (fitted on another embedder). ``set_aside``: intents whose own measured
        hits refute it, served no more while the others serve."""
        heads = resources.cache.intents
        if heads is None:
            return [], []
        found, warnings = [], []
        tag = resources.cache.known_version
        semantic = resources.cache.semantic
        for head in sorted(heads.loaded(), key=lambda h: (h.meta.tenant, h.meta.category)):
            m = head.meta
            status = "serving" if m.threshold <= 1 else "serves_nothing"
            policy = resources.policy.categories.get(m.category)
            measured: dict[str, Any] = {}
            if status == "serving" and semantic is not None and tag is not None and policy is not None \
                    and isinstance(policy.semantic, AdaptiveSemantic):
                try:
                    counts = await semantic.adaptive.pooled.counts(tag, m.category, m.tenant)
                except CACHE_ERRORS:
                    counts = None
                if counts is not None:
                    watch = intents_refuted(counts, policy.semantic)
                    measured = {"explored": watch.total, "wrong": watch.wrong, "set_aside": list(watch.set_aside)}
                    if watch.suspended:
                        status = "suspended"
                        warnings.append(f"intents of tenant {m.tenant} in {m.category} suspended: {watch.wrong} of "
                                        f"{watch.total} measured intent hits were wrong; load them again to re-calibrate")
                    elif watch.set_aside:
                        warnings.append(f"intents of tenant {m.tenant} in {m.category}: {', '.join(watch.set_aside)} "
                                        "set aside (their measured hits were wrong); the others serve; load them "
                                        "again to re-calibrate")
            found.append({"tenant": m.tenant, "category": m.category, "name": m.name, "intents": m.in_scope_intents,
                          "phrasings": m.phrasings, "threshold": m.threshold, "accuracy": m.accuracy,
                          "served_share": m.served_share, "status": status, "rule": m.rule, **measured})
        for (tenant, category), why in sorted(heads.refused().items()):
            found.append({"tenant": tenant, "category": category, "status": "refused", "reason": why})
        return found, warnings

    @staticmethod
    async def _dependencies(resources: Resources) -> tuple[dict[str, Any], bool, str | None]:
        """Redis's state, and whether the upstream answers (also set on ``strata_dependency_up``)."""
        redis: dict[str, Any] = {"status": "ok"}
        if resources.cache.buckets.clustered and not resources.cache.buckets.all:
            redis = {"status": "down", "error": "the Redis Cluster has not answered since start-up"}
        elif resources.cache.buckets.clustered:
            # On a cluster each bucket is served by its own master: one that does not answer
            # turns its tenants' requests into bypasses, so it is named here.
            buckets = resources.cache.buckets.all
            pings = await asyncio.gather(*(bucket.redis.ping() for bucket in buckets), return_exceptions=True)
            down = [f"{b.keys.namespace}@{b.address}" for b, ping in zip(buckets, pings, strict=True)
                    if isinstance(ping, BaseException)]
            redis.update(version=resources.cache.known_version, buckets=len(buckets),
                         masters=len({b.address for b in buckets}))
            if down:
                redis.update(status="down", buckets_down=down)
        else:
            try:
                await resources.cache.buckets.all[0].redis.ping()
                redis["version"] = resources.cache.known_version
            except CACHE_ERRORS as exc:
                redis = {"status": "down", "error": repr(exc)}
        failing = resources.metrics.failing_writes()
        if failing is not None and redis["status"] == "ok":
            # Redis answers but refuses writes (full with noeviction, read-only replica, ...):
            # nothing new is cached, which the operator must hear about.
            redis.update(status="writes_failing", error=failing)
        up, error = await resources.upstream.healthy()
        resources.metrics.dependency_up.labels("redis").set(1 if redis["status"] in ("ok", "writes_failing") else 0)
        resources.metrics.dependency_up.labels("upstream").set(1 if up else 0)
        return redis, up, error

    @staticmethod
    async def _live_precision(resources: Resources) -> tuple[dict[str, Any], list[str]]:
        """Per adaptive category: the explored would-be hits (sent upstream anyway) estimate the
        error of served hits; a warning when its upper bound passes the category's bound."""
        assert resources.cache.semantic is not None
        tag = resources.cache.known_version
        report: dict[str, Any] = {}
        warnings: list[str] = []
        for name, category in sorted(resources.policy.categories.items()):
            policy = category.semantic
            if not policy.enabled or not isinstance(policy, AdaptiveSemantic) or tag is None:
                continue
            try:
                figures = await resources.cache.semantic.adaptive.precision(tag, name, policy)
            except CACHE_ERRORS:
                continue
            gauge = resources.metrics.semantic_error
            gauge.labels(name, "bound").set(figures.error_bound)
            gauge.labels(name, "estimate").set(figures.error_estimate or 0.0)
            upper = figures.error_upper_bound
            gauge.labels(name, "upper_bound").set(1.0 if upper is None else upper)
            report[name] = {
                "error_bound": figures.error_bound, "observations": figures.observations,
                "observed_wrong": figures.observed_wrong, "explored": figures.explored,
                "explored_wrong": figures.explored_wrong, "error_estimate": figures.error_estimate,
                "error_upper_bound": upper, "status": figures.status,
                "record": msgspec.to_builtins(figures.record),
            }
            reader = resources.cache.semantic.adaptive.reader
            if figures.reader is not None and reader is not None and policy.reader != "off":
                # Trusted only where measured; "ignored" when measured and wrong too often everywhere.
                report[name]["reader"] = {"name": reader.name, "mode": policy.reader,
                                          **msgspec.to_builtins(figures.reader),
                                          "no_but_right": figures.reader_no[0], "no_and_wrong": figures.reader_no[1]}
                if figures.reader.status == "ignored":
                    warnings.append(f"category {name}: reader {reader.name} is ignored: its yes was wrong "
                                    f"{figures.reader.wrong} times in {figures.reader.vouched}")
            if figures.status == "above_bound":
                warnings.append(f"category {name}: served semantic hits may be wrong more often than "
                                f"{figures.error_bound:g} (upper bound {upper:.3f} from {figures.explored} explored hits)")
        return report, warnings

    @get("/metrics")
    async def metrics(self, request: Request[Any, Any, Any], resources: Resources) -> Response[bytes]:
        """Prometheus text exposition; the dependencies' state, the model server's prefix-cache
        figures and the adaptive categories' live precision are read on the way. Behind
        ``STRATA_METRICS_TOKEN`` when it is set."""
        token = resources.settings.metrics_token
        if token:
            scheme, _, presented = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), token.encode()):
                raise Unauthorized("/metrics needs the metrics token (Authorization: Bearer <STRATA_METRICS_TOKEN>)",
                                   code="invalid_metrics_token")
        redis, _, _ = await self._dependencies(resources)
        await self._prefix_cache(resources)
        if redis["status"] == "ok" and resources.cache.semantic is not None:
            await self._live_precision(resources)
            heads, _ = await self._intents(resources)
            for head in heads:
                for status in INTENT_STATUSES:
                    resources.metrics.intent_heads.labels(head["tenant"], head["category"], status).set(
                        int(head["status"] == status))
                if "set_aside" in head:
                    resources.metrics.intents_set_aside.labels(head["tenant"], head["category"]).set(
                        len(head["set_aside"]))
        return Response(content=resources.metrics.render(), media_type=CONTENT_TYPE)

    @staticmethod
    async def _prefix_cache(resources: Resources) -> PrefixCache | None:
        cache = await resources.upstream.prefix_cache()
        if cache is not None:
            gauge = resources.metrics.upstream_prefix_cache
            for name, value in (("queried_tokens", cache.queries), ("hit_tokens", cache.hits), ("hit_ratio", cache.ratio)):
                if value is not None:
                    gauge.labels(name).set(value)
        return cache
