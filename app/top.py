"""``strata top``: a live terminal view of a running Strata, from its ``/metrics`` alone.

    strata top [--url http://127.0.0.1:8080] [--interval 1.0] [--once]

Every interval it reads ``/metrics`` (which sums all workers) and shows what changed since the
previous read: requests per second, hit ratio per layer and per category, p50/p99 of hits and
misses over the last ten seconds, the same per category and per endpoint (chat, completions,
responses, messages), upstream calls saved, the model server's prefix-cache hit
ratio, and errors. ``q`` quits. ``--once`` prints one frame (two reads an interval apart) and
exits, for scripts.
"""

from __future__ import annotations

import argparse
import curses
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings

HIT_OUTCOMES = ("exact-hit", "semantic-hit")
OUTCOMES = ("exact-hit", "semantic-hit", "miss", "bypass", "error")
WINDOW_S = 10.0


@dataclass
class Sample:
    """One read of ``/metrics``: counters by name and label values, and latency buckets."""

    at: float
    counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    # outcome -> [(upper bound, cumulative count)]
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    prefix_ratio: float | None = None

    def total(self, name: str, **labels: str) -> float:
        """Sum of a counter's samples whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.counters.items() if n == name and wanted <= set(ls))

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(ls)[label] for (n, ls) in self.counters if n == name and label in dict(ls)}


def parse(text: str, at: float) -> Sample:
    sample = Sample(at=at)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted(s.labels.items()))
            if s.name.endswith("_total"):
                sample.counters[(s.name.removesuffix("_total"), labels)] = s.value
            elif s.name == "strata_request_duration_seconds_bucket":
                bound = float("inf") if s.labels["le"] == "+Inf" else float(s.labels["le"])
                sample.buckets[s.labels["outcome"]].append((bound, s.value))
            elif s.name == "strata_upstream_prefix_cache" and s.labels.get("value") == "hit_ratio":
                sample.prefix_ratio = s.value
    for values in sample.buckets.values():
        values.sort()
    return sample


def quantile(old: Sample, new: Sample, outcomes: tuple[str, ...], q: float) -> float | None:
    """The q-quantile (seconds, the bucket's upper bound) of requests finished between two reads."""
    merged: dict[float, float] = defaultdict(float)
    for outcome in outcomes:
        before = dict(old.buckets.get(outcome, []))
        for bound, count in new.buckets.get(outcome, []):
            merged[bound] += count - before.get(bound, 0.0)
    if not merged:
        return None
    bounds = sorted(merged)
    total = merged[bounds[-1]]
    if total <= 0:
        return None
    for bound in bounds:
        if merged[bound] >= q * total:
            return bound
    return bounds[-1]


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "> 64 s" if seconds == float("inf") else f"<= {seconds * 1000:g} ms"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole > 0 else "    -"


def frame(url: str, previous: Sample, current: Sample, window: Sample) -> list[str]:
    """The lines of one screen: rates between ``previous`` and ``current``, latency quantiles
    since ``window`` (about ten seconds ago)."""
    elapsed = max(current.at - previous.at, 1e-6)

    def delta(name: str, **labels: str) -> float:
        return current.total(name, **labels) - previous.total(name, **labels)

    requests = delta("strata_requests")
    lines = [f"strata top - {url} - {time.strftime('%H:%M:%S')} - every {elapsed:.1f} s - q quits", ""]
    lines.append(f"requests/s {requests / elapsed:9.1f}      since start {current.total('strata_requests'):,.0f}")
    by_outcome = "  ".join(f"{o} {_pct(delta('strata_requests', outcome=o), requests)}" for o in OUTCOMES)
    lines.append(f"  now:   {by_outcome}")
    total = current.total("strata_requests")
    lifetime = "  ".join(f"{o} {_pct(current.total('strata_requests', outcome=o), total)}" for o in OUTCOMES)
    lines.append(f"  total: {lifetime}")
    hits = sum(current.total("strata_requests", outcome=o) for o in HIT_OUTCOMES)
    calls = current.total("strata_upstream_requests")
    lines.append(f"upstream calls saved {_pct(hits, hits + calls)}   (hits {hits:,.0f}, upstream calls {calls:,.0f})")
    ratio = "-" if current.prefix_ratio is None else f"{100 * current.prefix_ratio:.1f}%"
    lines.append(f"model server prefix-cache hit ratio {ratio}")
    lines.append("")
    lines.append(f"latency, last {current.at - window.at:.0f} s   p50            p99")
    for name, outcomes in (("hits", HIT_OUTCOMES), ("misses", ("miss", "bypass"))):
        p50, p99 = quantile(window, current, outcomes, 0.5), quantile(window, current, outcomes, 0.99)
        lines.append(f"  {name:<8}           {_ms(p50):<14} {_ms(p99)}")
    lines.append("")
    for counter, label in (("strata_category_requests", "category"), ("strata_endpoint_requests", "endpoint")):
        lines.append(f"{label:<20} {'req/s':>8} {'exact':>7} {'semantic':>9} {'miss':>7}   total hit ratio")
        for value in sorted(current.label_values(counter, label)):
            now = delta(counter, **{label: value})
            ever = current.total(counter, **{label: value})
            exact, semantic, miss = (delta(counter, **{label: value, "outcome": o})
                                     for o in ("exact-hit", "semantic-hit", "miss"))
            ever_hits = sum(current.total(counter, **{label: value, "outcome": o}) for o in HIT_OUTCOMES)
            lines.append(f"{value:<20} {now / elapsed:8.1f} {_pct(exact, now):>7} {_pct(semantic, now):>9} "
                         f"{_pct(miss, now):>7}   {_pct(ever_hits, ever)}")
        lines.append("")
    cache_errors, upstream_errors = delta("strata_cache_errors"), delta("strata_upstream_requests", result="error")
    lines.append(f"errors/s: cache {cache_errors / elapsed:.1f} (treated as misses)   upstream {upstream_errors / elapsed:.1f}"
                 f"   requests answered with an error {delta('strata_requests', outcome='error') / elapsed:.1f}")
    return lines


class Reader:
    """Reads ``/metrics`` and keeps the samples of the last ``WINDOW_S`` seconds."""

    def __init__(self, url: str, timeout: float = 2.0, token: str | None = None) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=url, timeout=timeout, headers=headers)
        self.samples: deque[Sample] = deque()

    def read(self) -> Sample:
        response = self._client.get("/metrics")
        response.raise_for_status()
        sample = parse(response.text, time.monotonic())
        self.samples.append(sample)
        while len(self.samples) > 2 and sample.at - self.samples[0].at > WINDOW_S:
            self.samples.popleft()
        return sample

    def lines(self) -> list[str]:
        return frame(self.url, self.samples[-2], self.samples[-1], self.samples[0])

    def close(self) -> None:
        self._client.close()


def _run_screen(screen: curses.window, reader: Reader, interval: float) -> None:
    curses.curs_set(0)
    screen.timeout(int(interval * 1000))
    message = ""
    while True:
        try:
            reader.read()
            message = ""
        except httpx.HTTPError as exc:
            message = f"cannot read {reader.url}/metrics: {exc}"
        screen.erase()
        height, width = screen.getmaxyx()
        lines = reader.lines() if len(reader.samples) >= 2 else [f"strata top - {reader.url} - reading..."]
        for row, line in enumerate([*lines, "", message][: height - 1]):
            screen.addnstr(row, 0, line, width - 1)
        screen.refresh()
        if screen.getch() in (ord("q"), ord("Q")):
            return


def cmd_top(args: argparse.Namespace, settings: Settings) -> int:
    url = args.url or f"http://127.0.0.1:{settings.port}"
    reader = Reader(url, token=settings.metrics_token)
    try:
        if args.once:
            reader.read()
            time.sleep(args.interval)
            reader.read()
            print("\n".join(reader.lines()))
            return 0
        curses.wrapper(_run_screen, reader, args.interval)
        return 0
    except httpx.HTTPError as exc:
        print(f"strata: cannot read {url}/metrics: {exc}")
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    top = commands.add_parser("top", help="live view of a running Strata (from its /metrics); q quits")
    top.add_argument("--url", help="Strata's base URL (default: http://127.0.0.1:$STRATA_PORT)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(run=cmd_top)
