"""The model server's own prefix-cache counters (L3), read from its Prometheus ``/metrics``.

vLLM has named them differently over its versions; the first pair found is used and named at
start-up in the log and in ``/health``:

- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (V1 engine, tokens; 0.8 on)
- ``vllm:gpu_prefix_cache_queries_total`` / ``vllm:gpu_prefix_cache_hits_total`` (early V1 engine)
- ``vllm:gpu_prefix_cache_hit_rate`` (V0 engine, a ratio gauge, no counts)
"""

from __future__ import annotations

import re

import msgspec

# (queries, hits) counter pairs, newest naming first; then ratio gauges of older versions.
PREFIX_CACHE_NAMES = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
)
PREFIX_CACHE_RATIO_NAMES = ("vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+([-+0-9.eEinfNa]+)", re.MULTILINE)


class PrefixCache(msgspec.Struct, frozen=True, kw_only=True):
    """The upstream's prefix cache since it started.

    Attributes:
        names: The metric names read.
        queries: Prompt tokens looked up in the prefix cache (None for a ratio-only server).
        hits: Of those, tokens found.
        ratio: hits / queries, or the server's own ratio gauge.
    """

    names: tuple[str, ...]
    queries: float | None
    hits: float | None
    ratio: float | None


def _sums(text: str) -> dict[str, float]:
    """Every sample's value summed over its labels (engines, models), by metric name."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        try:
            sums[name] = sums.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return sums


def read_prefix_cache(text: str) -> PrefixCache | None:
    """The prefix-cache figures of a Prometheus text page, or ``None`` when it has none we know."""
    sums = _sums(text)
    for queries_name, hits_name in PREFIX_CACHE_NAMES:
        if queries_name in sums and hits_name in sums:
            queries, hits = sums[queries_name], sums[hits_name]
            return PrefixCache(names=(queries_name, hits_name), queries=queries, hits=hits,
                               ratio=hits / queries if queries else None)
    for name in PREFIX_CACHE_RATIO_NAMES:
        if name in sums:
            return PrefixCache(names=(name,), queries=None, hits=None, ratio=sums[name])
    return None
