"""The console overview's figures, read from the per-minute layer counts (``strata:meta:layers:*``,
app/cache/storage/usage.py): requests by answering layer over time, model calls and time saved, hit
latency percentiles and the reach an adaptive category learnt, per tenant and category.

Pure functions over the hashes' contents, so that what the page shows is tested without a page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from app.cache.storage.usage import KIND_MILLISECONDS, KIND_REQUESTS, LAYERS, parse_layer_field

# Layers that answer from the cache: their latency is the hit latency.
HIT_LAYERS = ("exact", "semantic", "curated")
# Layers that answer without a model call of their own: hits, and waits on an identical miss.
SAVED_LAYERS = (*HIT_LAYERS, "coalesced")
# Minutes per point of the learning curve: fine enough to see it climb, coarse enough to be a share.
CURVE_SLOT_MINUTES = 10


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Latency percentiles read from the histogram: each is the upper bound (ms) of the bucket it
    falls in (``None``: past the last bound)."""

    p50_ms: float | None
    p99_ms: float | None


class LayerFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's figures in one category over the window.

    Attributes:
        tenant: The tenant.
        category: The content category.
        totals: Requests per layer.
        series: Requests per layer and minute, oldest first.
        requests: All requests.
        model_calls_saved: Requests answered without a model call of their own (hits and coalesced waits).
        hits: Requests answered from the cache (exact, semantic, curated).
        hit_share: ``model_calls_saved`` over the requests that could be answered (not bypass or error).
        hit_latency: Percentiles of the hits' latency.
        miss_latency: Percentiles of the misses' latency (the model's answers through Strata).
        seconds_saved: Hits times (the mean miss minus the mean hit), in seconds; ``None`` with no
            miss to compare with in the window.
        curve: Share of answerable requests answered semantically (learnt or curated), per
            ``CURVE_SLOT_MINUTES`` slot, oldest first (``None``: no request in that slot).
    """

    tenant: str
    category: str
    totals: dict[str, int]
    series: dict[str, list[int]]
    requests: int
    model_calls_saved: int
    hits: int
    hit_share: float | None
    hit_latency: Percentiles
    miss_latency: Percentiles
    seconds_saved: float | None
    curve: list[float | None]


def percentiles(buckets: Mapping[str, int]) -> Percentiles:
    """P50 and P99 of a histogram of ``le<ms>`` counts."""
    bounds = sorted(((math.inf if k == "le+inf" else float(k[2:])), n) for k, n in buckets.items() if n > 0)
    total = sum(n for _, n in bounds)
    if not total:
        return Percentiles(p50_ms=None, p99_ms=None)

    def at(share: float) -> float | None:
        rank, seen = share * total, 0
        for bound, count in bounds:
            seen += count
            if seen >= rank:
                return None if math.isinf(bound) else bound
        return None

    return Percentiles(p50_ms=at(0.50), p99_ms=at(0.99))


def layer_figures(rows: Sequence[Mapping[str, int]], tenant: str | None = None) -> list[LayerFigures]:
    """The figures of every (tenant, category) in the rows, one row per minute, oldest first.

    Args:
        rows: Each minute's layers hash, fields decoded (``n|<layer>|<category>|<tenant>`` ...).
        tenant: Only this tenant's (an operator's view); every tenant's when ``None``.
    """
    minutes = len(rows)
    counts: dict[tuple[str, str], dict[str, list[int]]] = {}
    milliseconds: dict[tuple[str, str], dict[str, int]] = {}
    histograms: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    for i, row in enumerate(rows):
        for field, value in row.items():
            parsed = parse_layer_field(field)
            if parsed is None:
                continue
            kind, layer, category, owner = parsed
            if tenant is not None and owner != tenant:
                continue
            scope = (owner, category)
            if kind == KIND_REQUESTS:
                per = counts.setdefault(scope, {name: [0] * minutes for name in LAYERS})
                per.setdefault(layer, [0] * minutes)[i] += int(value)
            elif kind == KIND_MILLISECONDS:
                summed = milliseconds.setdefault(scope, {})
                summed[layer] = summed.get(layer, 0) + int(value)
            elif kind.startswith("le"):
                histogram = histograms.setdefault(scope, {}).setdefault(layer, {})
                histogram[kind] = histogram.get(kind, 0) + int(value)
    # The category's mean miss over every tenant shown: a tenant whose every request hit in the
    # window still saved what a miss costs in that category.
    miss_ms: dict[str, list[int]] = {}
    for (owner, category), per in counts.items():
        pair = miss_ms.setdefault(category, [0, 0])
        pair[0] += milliseconds.get((owner, category), {}).get("miss", 0)
        pair[1] += sum(per.get("miss", ()))
    figures = []
    for scope, per in sorted(counts.items()):
        owner, category = scope
        totals = {layer: sum(series) for layer, series in per.items()}
        saved = sum(totals.get(layer, 0) for layer in SAVED_LAYERS)
        hits = sum(totals.get(layer, 0) for layer in HIT_LAYERS)
        answerable = saved + totals.get("miss", 0)
        summed = milliseconds.get(scope, {})
        hit_ms = sum(summed.get(layer, 0) for layer in HIT_LAYERS)
        miss_total, miss_count = miss_ms[category]
        seconds_saved = None
        # Coalesced waits took about as long as the model: they save its work, not the asker's time.
        if miss_count and hits:
            seconds_saved = max(0.0, hits * (miss_total / miss_count) - hit_ms) / 1000
        hit_buckets: dict[str, int] = {}
        for layer in HIT_LAYERS:
            for bucket, n in histograms.get(scope, {}).get(layer, {}).items():
                hit_buckets[bucket] = hit_buckets.get(bucket, 0) + n
        figures.append(LayerFigures(
            tenant=owner, category=category, totals=totals, series=per, requests=sum(totals.values()),
            model_calls_saved=saved, hits=hits, hit_share=saved / answerable if answerable else None,
            hit_latency=percentiles(hit_buckets),
            miss_latency=percentiles(histograms.get(scope, {}).get("miss", {})),
            seconds_saved=seconds_saved, curve=_curve(per, minutes)))
    return figures


def _curve(per: Mapping[str, list[int]], minutes: int) -> list[float | None]:
    curve: list[float | None] = []
    for start in range(0, minutes, CURVE_SLOT_MINUTES):
        window = slice(start, start + CURVE_SLOT_MINUTES)
        semantic = sum(per.get("semantic", [])[window]) + sum(per.get("curated", [])[window])
        answerable = semantic + sum(per.get("exact", [])[window]) + sum(per.get("miss", [])[window])
        curve.append(semantic / answerable if answerable else None)
    return curve

