"""The console overview's figures (app/web/overview.py) from layer counts as the workers write them."""

from __future__ import annotations

from app.cache.storage.usage import KIND_MILLISECONDS, KIND_REQUESTS, UsageCounts, latency_bucket, layer_field, parse_layer_field
from app.web.console import chart
from app.web.overview import CURVE_SLOT_MINUTES, layer_figures, percentiles


def minute_row(requests: list[tuple[str, str, str, float]]) -> dict[str, int]:
    """One minute's hash from (layer, category, tenant, milliseconds) requests, as flushed."""
    row: dict[str, int] = {}
    for layer, category, tenant, ms in requests:
        for kind, value in ((KIND_REQUESTS, 1), (KIND_MILLISECONDS, round(ms)), (latency_bucket(ms), 1)):
            field = layer_field(kind, layer, category, tenant)
            row[field] = row.get(field, 0) + value
    return row


def test_a_tenant_name_with_a_bar_splits_nothing() -> None:
    assert parse_layer_field(layer_field("n", "exact", "faq", "a|b")) == ("n", "exact", "faq", "a|b")
    assert parse_layer_field("faq|miss") is None


def test_percentiles_are_bucket_bounds_and_none_past_the_last() -> None:
    buckets = {latency_bucket(2.5): 98, latency_bucket(700): 1, latency_bucket(500_000): 1}
    assert percentiles(buckets).p50_ms == 3 and percentiles(buckets).p99_ms == 800
    assert percentiles({latency_bucket(500_000): 1}).p99_ms is None
    assert percentiles({}).p50_ms is None


def test_time_saved_is_hits_times_the_mean_miss_less_the_hits_own_time() -> None:
    rows = [minute_row([("miss", "faq", "t", 3000.0), ("miss", "faq", "t", 1000.0), ("exact", "faq", "t", 2.0),
                        ("semantic", "faq", "t", 10.0), ("curated", "faq", "t", 8.0), ("bypass", "faq", "t", 900.0)])]
    [figures] = layer_figures(rows)
    assert figures.totals["exact"] == 1 and figures.totals["curated"] == 1 and figures.requests == 6
    assert figures.model_calls_saved == 3 and figures.hit_share == 3 / 5
    assert figures.seconds_saved == (3 * 2000 - 20) / 1000
    assert figures.hit_latency.p99_ms == 13 and figures.miss_latency.p50_ms == 1300


def test_a_tenant_without_a_miss_is_credited_the_categorys_mean_miss() -> None:
    rows = [minute_row([("miss", "faq", "a", 2000.0), ("exact", "faq", "b", 1.0), ("exact", "faq", "b", 1.0)])]
    by_tenant = {f.tenant: f for f in layer_figures(rows)}
    assert by_tenant["b"].seconds_saved == (2 * 2000 - 2) / 1000
    assert by_tenant["a"].seconds_saved is None  # nothing hit
    assert layer_figures([minute_row([("exact", "x", "c", 1.0)])])[0].seconds_saved is None  # no miss to compare


def test_an_operator_sees_its_tenant_only() -> None:
    rows = [minute_row([("miss", "faq", "acme", 5.0), ("miss", "faq", "default", 5.0)])]
    assert [f.tenant for f in layer_figures(rows, "acme")] == ["acme"]
    assert sorted(f.tenant for f in layer_figures(rows)) == ["acme", "default"]


def test_the_learning_curve_climbs_with_the_semantic_share_per_slot() -> None:
    minutes = 3 * CURVE_SLOT_MINUTES
    rows: list[dict[str, int]] = [{} for _ in range(minutes)]
    rows[0] = minute_row([("miss", "faq", "t", 1.0)] * 4)
    rows[CURVE_SLOT_MINUTES] = minute_row([("miss", "faq", "t", 1.0), ("semantic", "faq", "t", 1.0),
                                           ("bypass", "faq", "t", 1.0)])
    rows[2 * CURVE_SLOT_MINUTES + 5] = minute_row([("semantic", "faq", "t", 1.0)] * 3 + [("exact", "faq", "t", 1.0)])
    [figures] = layer_figures(rows)
    assert figures.curve == [0.0, 0.5, 0.75]
    assert figures.series["semantic"][2 * CURVE_SLOT_MINUTES + 5] == 3


def test_a_coalesced_wait_saves_a_model_call_but_is_no_hit_in_latency_or_time_saved() -> None:
    rows = [minute_row([("miss", "faq", "t", 4000.0), ("coalesced", "faq", "t", 3900.0), ("exact", "faq", "t", 2.0)])]
    [figures] = layer_figures(rows)
    assert figures.totals["coalesced"] == 1 and figures.model_calls_saved == 2 and figures.hits == 1
    # The wait's 3.9 s is neither a hit's latency nor time saved (issue #44: a card showed "hit p50 13 s").
    assert figures.hit_latency.p99_ms == 2 and figures.seconds_saved == (4000 - 2) / 1000


def test_usage_counts_a_coalesced_request_in_its_own_layer() -> None:
    counts = UsageCounts()
    counts.add("faq", "exact-hit", 60.0, tenant="t", seconds=3.9, coalesced=True)
    counts.add("faq", "exact-hit", 60.0, tenant="t", seconds=0.002)
    layers = {field for (_, field) in counts._layers}
    assert layer_field(KIND_REQUESTS, "coalesced", "faq", "t") in layers
    assert layer_field(KIND_REQUESTS, "exact", "faq", "t") in layers


def test_the_chart_spans_from_the_first_busy_minute_with_a_scale_time_ticks_and_now() -> None:
    minutes = 120
    rows = [{} for _ in range(minutes - 3)] + [minute_row([("exact", "faq", "t", 1.0)] * n) for n in (2, 5, 1)]
    [figures] = layer_figures(rows)
    drawn = chart(figures, now_minute=29_000_000)
    assert drawn["minutes"] == 30 and drawn["peak"] == 5 and len(drawn["bars"]) == 3
    # The busiest minute's bar reaches the top line; the bars sit at the right, beside "now".
    tallest = max(drawn["bars"], key=lambda b: b["h"])
    assert tallest["y"] == drawn["top"] and drawn["bars"][-1]["x"] < drawn["now_x"] <= drawn["width"]
    assert 3 <= len(drawn["ticks"]) <= 8 and all(":" in t["label"] for t in drawn["ticks"])


def test_counts_agree_with_their_nouns() -> None:
    """"1 variant", "1 entry", "asked 1 time" (issue #56 item 5)."""
    from app.web.words import counted

    assert counted(1, "variant") == "1 variant" and counted(2, "variant") == "2 variants"
    assert counted(1, "entry") == "1 entry" and counted(0, "cached entry") == "0 cached entries"
    assert counted(1, "time") == "1 time" and counted(3, "cached model answer") == "3 cached model answers"
