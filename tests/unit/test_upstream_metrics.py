"""Discovery of the model server's prefix-cache metrics under both vLLM naming schemes."""

from __future__ import annotations

from app.upstream_metrics import read_prefix_cache

V1 = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1068.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 0.0
"""
EARLY_V1 = """vllm:gpu_prefix_cache_queries_total{model_name="m"} 400
vllm:gpu_prefix_cache_hits_total{model_name="m"} 100
"""
V0 = """# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.25
"""


def test_current_names_sum_over_engines() -> None:
    found = read_prefix_cache(V1)
    assert found is not None and found.names == ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    assert found.queries == 1068 and found.hits == 740 and abs(found.ratio - 740 / 1068) < 1e-9


def test_older_names_and_ratio_only_servers() -> None:
    early = read_prefix_cache(EARLY_V1)
    assert early is not None and early.names[0].startswith("vllm:gpu_prefix") and early.ratio == 0.25
    v0 = read_prefix_cache(V0)
    assert v0 is not None and v0.queries is None and v0.ratio == 0.25


def test_no_known_metric_and_no_queries_yet() -> None:
    assert read_prefix_cache("process_cpu_seconds_total 3.0\n") is None
    idle = read_prefix_cache("vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\n")
    assert idle is not None and idle.ratio is None
