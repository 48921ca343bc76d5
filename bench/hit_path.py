"""The hit path side by side (issue #32): Strata of this tree against worktrees of earlier
commits and a plain redisvl application, one after the other on this machine, with wrk; then
what hits cost Redis: commands per hit, memory per 100,000 hits, bytes per cached entry.

Every arm gets its own Redis Stack, the stub upstream and one worker (uvicorn, uvloop,
httptools), the first ``--entries`` pairs of gptcache_mock_data.json filled through its API, then
exact hits at concurrency 16 (the throughput row) and semantic hits at concurrency 1 (the p50
row). Arms run in turn, ``--rounds`` times, so drift on the machine spreads over all of them.

    python -m bench.hit_path [--baseline REV ...] [--rounds 2] [--duration 20] [--memory-hits 100000]

An earlier commit is checked out as a worktree under .run/ab/<rev> and served by this venv (its
dependencies are the same). Writes docs/experiments/hit-path-ab.md (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench.run import ROOT, body, free_port, machine, own_redis, seed_evidence, semantic_pairs, wait_for, wrk

AB_DIR = ROOT / ".run" / "ab"
EXACT_CATEGORY = "verified"
SEMANTIC_CATEGORY = "adaptive"
# Past the usage counts' and semantic hit counts' flush (every second): the window shows the batch too.
MONITOR_AFTER_S = 1.5


@dataclass
class Arm:
    """One thing served and measured: a Strata tree, or the redisvl application."""

    name: str
    tree: Path | None = None  # None: the redisvl application
    exact: str = "get"  # the redisvl application's exact layer
    env: dict[str, str] = field(default_factory=dict)  # more settings of the tree's service (tracing on)
    exact_rps: list[float] = field(default_factory=list)
    exact_p50: list[float] = field(default_factory=list)
    exact_p99: list[float] = field(default_factory=list)
    semantic_p50: list[float] = field(default_factory=list)
    semantic_rps16: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` under .run/ab (made once)."""
    resolved = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    path = AB_DIR / resolved
    if not (path / "app").is_dir():
        AB_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(path), resolved], cwd=ROOT, check=True,
                       capture_output=True)
    return path


@contextmanager
def served(arm: Arm, redis_url: str) -> Iterator[str]:
    """The stub upstream and the arm's service on free ports; yields the service's URL."""
    upstream_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.stub_upstream", str(upstream_port)], cwd=ROOT)
    upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
    if arm.tree is None:
        command = [sys.executable, "-m", "bench.redisvl_app", str(port), redis_url, upstream_url, "--exact", arm.exact]
        service = subprocess.Popen(command, cwd=ROOT)
    else:
        env = {**os.environ, "PYTHONPATH": str(arm.tree), "STRATA_PORT": str(port), "STRATA_WORKERS": "1",
               "STRATA_REDIS_URL": redis_url, "STRATA_UPSTREAM_URL": upstream_url, "STRATA_LOG_LEVEL": "warning",
               "STRATA_POLICY_FILE": str(arm.tree / "bench" / "policy.yaml"), **arm.env}
        service = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=arm.tree, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(upstream_url + "/models")
        wait_for(url + "/health", timeout=120)
        yield url
    finally:
        service.terminate()
        service.wait(timeout=30)
        upstream.terminate()
        upstream.wait(timeout=10)


def fill(url: str, pairs: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Store every origin in both categories; the bodies that exact-hit (``verified``) and the
    paraphrases that semantic-hit (``adaptive``, its pool seeded by the caller first)."""
    exact, semantic = [], []
    with httpx.Client(base_url=url, timeout=60) as client:
        for category in (EXACT_CATEGORY, SEMANTIC_CATEGORY):
            for origin, _ in pairs:
                client.post("/v1/chat/completions", content=body(origin), headers={"X-Cache-Category": category})
        for origin, similar in pairs:
            hit = client.post("/v1/chat/completions", content=body(origin), headers={"X-Cache-Category": EXACT_CATEGORY})
            if hit.headers.get("x-cache") == "exact-hit":
                exact.append(body(origin))
            near = client.post("/v1/chat/completions", content=body(similar),
                               headers={"X-Cache-Category": SEMANTIC_CATEGORY})
            if near.headers.get("x-cache") == "semantic-hit":
                semantic.append(body(similar))
    return exact, semantic


def measure(arm: Arm, pairs: list[tuple[str, str]], duration: int) -> None:
    with own_redis() as redis_url:
        if arm.tree is not None:
            seed_evidence(redis_url, SEMANTIC_CATEGORY)
        with served(arm, redis_url) as url:
            exact, semantic = fill(url, pairs)
            wrk(url, exact, 16, 3, "warm-up", EXACT_CATEGORY)
            fast = wrk(url, exact, 16, duration, "exact", EXACT_CATEGORY)
            arm.exact_rps.append(fast.rps)
            arm.exact_p50.append(fast.p50_ms)
            arm.exact_p99.append(fast.p99_ms)
            arm.outcomes.append(f"exact {fast.outcomes}")
            if semantic:
                near = wrk(url, semantic, 1, max(duration // 2, 5), "semantic", SEMANTIC_CATEGORY)
                arm.semantic_p50.append(near.p50_ms)
                near16 = wrk(url, semantic, 16, max(duration // 2, 5), "semantic", SEMANTIC_CATEGORY)
                arm.semantic_rps16.append(near16.rps)
                arm.outcomes.append(f"semantic {near.outcomes} / c16 {near16.outcomes}")
            print(f"{arm.name}: exact c16 {fast.rps:,.0f} req/s p50 {fast.p50_ms:.2f} ms; "
                  f"semantic c1 p50 {arm.semantic_p50[-1] if arm.semantic_p50 else float('nan'):.2f} ms", flush=True)


@dataclass
class MemoryRun:
    name: str
    entries: int
    exact_entry_bytes: float
    semantic_entry_bytes: float
    index_bytes_per_doc: float
    hits: int
    outcomes: dict[str, int]
    used_before: int
    used_after: int
    keys_before: int
    keys_after: int


def monitored(redis_url: str, act: Callable[[], None], after_s: float) -> list[str]:
    """The Redis commands sent while ``act()`` runs and for ``after_s`` after it (MONITOR; a
    sentinel ``ECHO`` on a connection opened beforehand ends the window). Commands a script ran
    are marked ``(script)``: they are part of the ``EVALSHA`` before them, not round trips."""
    lines: list[str] = []
    sentinel = f"bench-sentinel-{time.monotonic_ns()}"
    client, closer = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    closer.ping()  # its handshake happens now, outside the window
    with client.monitor() as monitor:
        def read() -> None:
            for event in monitor.listen():
                command = str(event.get("command", ""))
                if sentinel in command:
                    return
                inside = " (script)" if event.get("client_type") == "lua" else ""
                lines.append(f"{command[:110]}{inside}")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.2)  # the reader is listening
        lines.clear()
        act()
        time.sleep(after_s)  # what the hit leaves behind it (batched counts) lands meanwhile
        closer.echo(sentinel)
        reader.join(timeout=10)
    client.close()
    closer.close()
    return list(lines)


def commands_per_hit(url: str, redis_url: str, exact_body: str, semantic_body: str) -> dict[str, list[str]]:
    """The Redis commands of one exact hit and of one semantic hit."""
    seen: dict[str, list[str]] = {}
    for name, payload, category in (("exact hit", exact_body, EXACT_CATEGORY),
                                    ("semantic hit", semantic_body, SEMANTIC_CATEGORY)):
        def ask(payload: str = payload, category: str = category) -> None:
            response = httpx.post(url + "/v1/chat/completions", content=payload,
                                  headers={"X-Cache-Category": category}, timeout=30)
            assert response.headers.get("x-cache") in ("exact-hit", "semantic-hit"), response.headers

        seen[name] = monitored(redis_url, ask, MONITOR_AFTER_S)
    return seen


def memory(arm: Arm, pairs: list[tuple[str, str]], hits: int) -> tuple[MemoryRun, dict[str, list[str]]]:
    """Redis ``used_memory`` before and after ``hits`` hits over the cached entries (half exact,
    half semantic), and what one cached entry costs."""
    with own_redis() as redis_url:
        seed_evidence(redis_url, SEMANTIC_CATEGORY)
        with served(arm, redis_url) as url:
            client = redis.Redis.from_url(redis_url)
            exact, semantic = fill(url, pairs)
            exact_keys = [k for k in client.scan_iter(match="strata:v1:exact:*", count=1000)]
            sem_keys = [k for k in client.scan_iter(match="strata:v1:sem:*", count=1000)]
            exact_bytes = statistics.fmean(client.memory_usage(k) or 0 for k in exact_keys)
            sem_bytes = statistics.fmean(client.memory_usage(k) or 0 for k in sem_keys)
            info = client.ft("strata:v1:sem").info()
            index_mb = sum(float(info.get(f, 0) or 0) for f in ("vector_index_sz_mb", "inverted_sz_mb", "offset_vectors_sz_mb",
                                                                 "doc_table_size_mb", "sortable_values_size_mb",
                                                                 "key_table_size_mb", "tag_overhead_sz_mb"))
            index_per_doc = index_mb * 1024 * 1024 / max(int(info["num_docs"]), 1)
            seen = commands_per_hit(url, redis_url, exact[0], semantic[0])
            bodies = exact + semantic
            wrk(url, bodies, 16, 3, "warm-up", SEMANTIC_CATEGORY)  # the connection pool opens now, not in the run
            time.sleep(6)  # usage counts and hit counts of the warm-up flushed
            before, keys_before = int(client.info("memory")["used_memory"]), int(client.dbsize())
            outcomes: dict[str, int] = {}
            total = 0
            for chunk, category in ((exact, EXACT_CATEGORY), (semantic, SEMANTIC_CATEGORY)):
                done = 0
                while done < hits // 2:  # wrk runs for its duration: 5 s runs, the last one cut at the count
                    run = wrk(url, chunk, 16, 5, "hits", category, limit=hits // 2 - done)
                    done += sum(run.outcomes.values())
                    for key, count in run.outcomes.items():
                        outcomes[f"{category}:{key}"] = outcomes.get(f"{category}:{key}", 0) + count
                total += done
            time.sleep(6)
            after, keys_after = int(client.info("memory")["used_memory"]), int(client.dbsize())
            client.close()
    return MemoryRun(arm.name, len(pairs), exact_bytes, sem_bytes, index_per_doc, total, outcomes, before, after,
                     keys_before, keys_after), seen


def report(arms: list[Arm], memories: list[tuple[MemoryRun, dict[str, list[str]]]], args: argparse.Namespace) -> str:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f}" if values else "-"

    def med2(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "-"

    lines = [
        "# The hit path side by side (issue #32)",
        "",
        f"- Command: `python -m bench.hit_path {' '.join(sys.argv[1:])}`".rstrip(),
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {machine()}; wrk 4.1 on the same 2 cores as the service, Redis and the stub upstream",
        f"- Each arm: its own Redis Stack, the stub upstream, one worker; {len(arms[0].exact_rps)} round(s) of "
        f"{args.duration} s exact hits at concurrency 16 and {max(args.duration // 2, 5)} s semantic hits at 1 and 16, "
        f"arms in turn; the median of the rounds",
        "",
        "| arm | exact hits c16 req/s | exact p50 ms | exact p99 ms | semantic hit c1 p50 ms | semantic hits c16 req/s "
        "| rounds (exact req/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        lines.append(f"| {arm.name} | {med(arm.exact_rps)} | {med2(arm.exact_p50)} | {med2(arm.exact_p99)} | "
                     f"{med2(arm.semantic_p50)} | {med(arm.semantic_rps16)} | "
                     f"{', '.join(f'{r:,.0f}' for r in arm.exact_rps)} |")
    lines += ["", "Outcomes (status:X-Cache=count) per round:", ""]
    for arm in arms:
        lines.append(f"- {arm.name}: " + "; ".join(arm.outcomes))
    for run, seen in memories:
        lines += [
            "", f"## What hits cost Redis: {run.name}", "",
            f"- {run.entries} entries cached in `{EXACT_CATEGORY}` and `{SEMANTIC_CATEGORY}` (each an exact and a semantic entry)",
            f"- Bytes per cached entry (`MEMORY USAGE`, mean): exact {run.exact_entry_bytes:,.0f}, semantic "
            f"{run.semantic_entry_bytes:,.0f} (its 512 float32 dimensions are 2,048 of them) plus "
            f"{run.index_bytes_per_doc:,.0f} in the RediSearch index per document (FT.INFO sizes / num_docs)",
            f"- {run.hits:,} hits (half exact, half semantic, wrk at concurrency 16): `used_memory` {run.used_before:,} -> "
            f"{run.used_after:,} bytes ({run.used_after - run.used_before:+,}; target: less than +1,048,576), keys "
            f"{run.keys_before:,} -> {run.keys_after:,}",
            f"- Outcomes: {run.outcomes}",
            "",
            f"Redis commands of one hit (MONITOR, up to {MONITOR_AFTER_S} s after its response; `(script)`: run "
            "inside the script call before it, no round trip of its own; the hit counts and usage counts are "
            "flushed once a second for every hit of that second):",
            "",
        ]
        for name, commands in seen.items():
            lines.append(f"- {name}: {len(commands)} command(s)")
            lines += [f"  - `{c}`" for c in commands]
    return "\n".join(lines) + "\n"


BENCH_START, BENCH_END = "<!-- hit-path:start -->", "<!-- hit-path:end -->"


def round_trips(commands: list[str]) -> list[str]:
    """The commands of a MONITOR window that are round trips of their own (not run by a script)."""
    return [c.split()[0] for c in commands if not c.endswith("(script)")]


def benchmarks_section(arms: list[Arm], memories: list[tuple[MemoryRun, dict[str, list[str]]]],
                       args: argparse.Namespace) -> str:
    """The section of docs/BENCHMARKS.md this run writes (replaced on the next one)."""
    this = arms[0]
    lines = [BENCH_START, "", "## Hit path side by side, and what hits cost Redis (issue #32)", "",
             f"Written by `python -m bench.hit_path {' '.join(sys.argv[1:])}` (part of `make bench`) on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}. Each arm in turn on this machine "
             f"(its own Redis Stack, the stub upstream, one worker, wrk on the same 2 cores), {len(this.exact_rps)} "
             f"round(s), the median; the full report is [experiments/hit-path-ab.md](experiments/hit-path-ab.md).", "",
             "| arm | exact hits c16 req/s | exact p50 ms | semantic hit c1 p50 ms | semantic hits c16 req/s |",
             "|---|---|---|---|---|"]
    for arm in arms:
        lines.append(f"| {arm.name} | {statistics.median(arm.exact_rps):,.0f} | {statistics.median(arm.exact_p50):.2f} | "
                     f"{statistics.median(arm.semantic_p50) if arm.semantic_p50 else float('nan'):.2f} | "
                     f"{statistics.median(arm.semantic_rps16) if arm.semantic_rps16 else float('nan'):,.0f} |")
    for run, seen in memories:
        growth = run.used_after - run.used_before
        lines += ["", f"{run.name}: {run.hits:,} hits over {run.entries} cached entries grew `used_memory` by "
                  f"{growth:+,} bytes (target: under +1,048,576: {'met' if growth < 1 << 20 else 'MISSED'}); keys "
                  f"{run.keys_before:,} -> {run.keys_after:,}. Bytes per cached entry (`MEMORY USAGE`): exact "
                  f"{run.exact_entry_bytes:,.0f}, semantic {run.semantic_entry_bytes:,.0f} plus "
                  f"{run.index_bytes_per_doc:,.0f} in the index per document. Commands that were round trips of their own "
                  "in the 1.5 s after one hit (the hit's lookup first; then what is sent once a second for every hit "
                  "of that second: usage counts, semantic hit counts, the pool read): " +
                  "; ".join(f"{name} {len(round_trips(c))} ({', '.join(round_trips(c))})" for name, c in seen.items())]
    return "\n".join([*lines, "", BENCH_END]) + "\n"


def write_section(path: Path, section: str) -> None:
    """Put the section into docs/BENCHMARKS.md in place of the previous one (or at its end)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if BENCH_START in text and BENCH_END in text:
        head, rest = text.split(BENCH_START, 1)
        text = head + section + rest.split(BENCH_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def otlp_sink() -> str:
    """An OTLP/HTTP receiver that takes every export and keeps nothing (what a collector on the
    host costs Strata is the export, not the collector's work); its URL."""
    import http.server

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", default=[], help="an earlier commit to serve beside this tree")
    parser.add_argument("--redisvl", action="append", default=[], choices=("get", "embeddings"),
                        help="the redisvl application's exact layer (repeatable); none: both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--memory-hits", type=int, default=100_000, help="0: no memory run")
    parser.add_argument("--memory-baseline", action="store_true", help="the memory run for each baseline too")
    parser.add_argument("--traced", action="store_true",
                        help="also this tree with traces on, exported to an OTLP/HTTP sink of the bench's own")
    parser.add_argument("--no-redisvl", action="store_true", help="leave the redisvl application's arms out")
    parser.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "hit-path-ab.md"))
    parser.add_argument("--benchmarks", help="also write the summary section of this file (docs/BENCHMARKS.md)")
    args = parser.parse_args()
    pairs, _ = semantic_pairs(args.entries)
    arms = [Arm("this tree", ROOT)] + [Arm(f"commit {rev}", worktree(rev)) for rev in args.baseline]
    if args.traced:
        arms.insert(1, Arm("this tree, traces on", ROOT, env={"STRATA_OTEL_ENDPOINT": otlp_sink()}))
    if not args.no_redisvl:
        arms += [Arm(f"redisvl application ({exact} exact layer)", None, exact)
                 for exact in (args.redisvl or ["get", "embeddings"])]
    for _ in range(args.rounds):
        for arm in arms:
            measure(arm, pairs, args.duration)
    memories = []
    if args.memory_hits:
        for arm in [a for a in arms if a.tree is not None][: None if args.memory_baseline else 1]:
            memories.append(memory(arm, pairs, args.memory_hits))
            print(f"{arm.name}: used_memory {memories[-1][0].used_before:,} -> {memories[-1][0].used_after:,}", flush=True)
    text = report(arms, memories, args)
    Path(args.out).write_text(text, encoding="utf-8")
    if args.benchmarks:
        write_section(Path(args.benchmarks), benchmarks_section(arms, memories, args))
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
