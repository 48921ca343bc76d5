"""`python -m bench.cluster`: the hit path on one Redis against a local 3-master Redis Cluster.

Starts a Redis Stack and a 3-master Redis Cluster of Redis Stack nodes (redis-stack/cluster.sh),
each on free ports, with a stub upstream and one Strata worker in front of each. Both caches are
filled with the same paraphrase pairs; then wrk drives exact and semantic hits (category
``verified``) at concurrency 1 and 16, the two stacks taking turns run by run so that the
machine's drift falls on both alike. Also measured: memory per cached question (its entries'
``MEMORY USAGE`` and its share of the indexes' memory from ``FT.INFO``). Writes the measured part
of docs/SCALING.md (the text after ``## Analysis`` is kept).

    python -m bench.cluster [--duration 10] [--rounds 2] [--pairs 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from bench.run import ROOT, Run, fill, free_port, machine, own_redis, semantic_pairs, stack, wrk

CATEGORY = "verified"
OUT = ROOT / "docs" / "SCALING.md"


@contextmanager
def local_cluster() -> Iterator[str]:
    """A 3-master Redis Cluster on free ports, removed afterwards; yields its URL."""
    ports, bus = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    folder = tempfile.mkdtemp(prefix="strata-bench-cluster-")
    env = {**os.environ, "STACK_CLUSTER_PORTS": " ".join(map(str, ports)),
           "STACK_CLUSTER_BUS_PORTS": " ".join(map(str, bus)), "STACK_CLUSTER_DIR": folder,
           "STACK_PYTHON": sys.executable}
    script = str(ROOT / "redis-stack" / "cluster.sh")
    subprocess.run(["bash", script, "start"], check=True, env=env, stdout=subprocess.DEVNULL)
    try:
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports)
    finally:
        subprocess.run(["bash", script, "stop"], env=env, stdout=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)


def nodes_of(url: str) -> list[redis.Redis]:
    """A plain connection to every master (one Redis: itself)."""
    if not url.startswith("redis+cluster://"):
        return [redis.Redis.from_url(url, protocol=2)]
    first = url.removeprefix("redis+cluster://").split(",")[0]
    host, port = first.split(":")
    cluster = RedisCluster(host=host, port=int(port))
    try:
        return [redis.Redis(host=n.host, port=n.port, protocol=2) for n in cluster.get_primaries()]
    finally:
        cluster.close()


def memory_per_question(url: str) -> tuple[float, float, int, int]:
    """(entry bytes, index bytes) per semantic document, documents, and exact entries, over every master."""
    entry_bytes = index_bytes = 0.0
    documents = exact = 0
    for node in nodes_of(url):
        try:
            for key in node.scan_iter(match="strata:*", count=1000):
                name = key.decode()
                if ":sem:" in name:
                    documents += 1
                elif ":exact:" in name:
                    exact += 1
                else:
                    continue
                entry_bytes += node.memory_usage(key, samples=0) or 0
            for index in node.execute_command("FT._LIST"):
                info = node.execute_command("FT.INFO", index)
                fields = dict(zip(info[::2], info[1::2], strict=False))
                index_bytes += float(fields.get(b"total_index_memory_sz_mb", 0) or 0) * 1024 * 1024
                index_bytes += float(fields.get(b"vector_index_sz_mb", 0) or 0) * 1024 * 1024
        finally:
            node.close()
    per = max(documents, 1)
    return entry_bytes / max(documents + exact, 1), index_bytes / per, documents, exact


def reset_stats(url: str) -> None:
    for node in nodes_of(url):
        node.config_resetstat()
        node.close()


def redis_usec(url: str) -> float:
    """Microseconds every master spent in commands since the last reset (INFO commandstats)."""
    total = 0.0
    for node in nodes_of(url):
        total += sum(float(stats["usec"]) for stats in node.info("commandstats").values())
        node.close()
    return total


def memory_at_scale(url: str, documents: int, dims: int) -> tuple[float, float]:
    """Bytes of Redis memory per semantic document at ``documents`` documents in one index of
    Strata's schema (``used_memory`` before and after, and the index's own share from FT.INFO).

    The documents are shaped like Strata's (a question, a completion JSON of about 600 bytes, the
    tags, a float32 embedding of ``dims``), with random unit vectors."""
    import copy

    import numpy as np
    import yaml
    from redisvl.index import SearchIndex

    from app.cache.storage.keys import Keyspace

    keys = Keyspace("bench-memory")
    schema = yaml.safe_load((ROOT / "schemas" / "semantic_index.yaml").read_text(encoding="utf-8"))
    schema = copy.deepcopy(schema)
    schema["index"]["name"], schema["index"]["prefix"] = keys.semantic_index_name("v1"), keys.semantic_prefix("v1")
    for field in schema["fields"]:
        if field["name"] == "embedding":
            field["attrs"]["dims"] = dims
    client = redis.Redis.from_url(url, protocol=2)
    index = SearchIndex.from_dict(schema, redis_client=client)
    index.create(overwrite=True, drop=True)
    before = client.info("memory")["used_memory"]
    rng = np.random.default_rng(0)
    answer = '{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,' \
             '"message":{"role":"assistant","content":"' + "x" * 420 + '"},"finish_reason":"stop"}],"usage":{}}'
    pipe = client.pipeline(transaction=False)
    for i in range(documents):
        vector = rng.standard_normal(dims).astype(np.float32)
        vector /= np.linalg.norm(vector)
        key = f"{keys.semantic_prefix('v1')}{i:064x}"
        pipe.hset(key, mapping={"question": f"how do i change the delivery address of order {i}", "answer": answer,
                                "scope": f"{i % 50:064x}", "category": "faq", "tenant": f"t{i % 50}", "model": "m",
                                "root": key, "created_at": 1, "expires_at": 2, "hits": 0,
                                "embedding": vector.tobytes()})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    while int(index.info()["indexing"]):
        time.sleep(0.2)
    after = client.info("memory")["used_memory"]
    info = index.info()
    index_mb = float(info["total_index_memory_sz_mb"]) + float(info["vector_index_sz_mb"])
    index.delete(drop=True)
    client.close()
    return (after - before) / documents, index_mb * 1024 * 1024 / documents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per row and arm, taken in turns")
    parser.add_argument("--pairs", type=int, default=300, help="paraphrase pairs to fill each cache with")
    parser.add_argument("--documents", type=int, default=20_000, help="documents for the memory-at-scale row")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("bench: wrk is not installed (Debian package wrk; make bench installs it)", file=sys.stderr)
        return 2
    pairs, source = semantic_pairs(args.pairs)
    arms = ("1 node", "3-master cluster")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with ExitStack() as stacks:
        urls = {"1 node": stacks.enter_context(own_redis()), "3-master cluster": stacks.enter_context(local_cluster())}
        served = {arm: stacks.enter_context(stack(1, urls[arm]))[0] for arm in arms}
        bodies = {arm: fill(served[arm], pairs, CATEGORY) for arm in arms}
        memory = {arm: memory_per_question(urls[arm]) for arm in arms}
        runs: dict[tuple[str, str, int], list[Run]] = {}
        usec: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for kind in ("exact", "semantic"):
                for concurrency in (1, 16):
                    for arm in arms:
                        exact, semantic = bodies[arm]
                        reset_stats(urls[arm])
                        run = wrk(served[arm], exact if kind == "exact" else semantic, concurrency, args.duration,
                                  kind, CATEGORY)
                        usec.setdefault((kind, arm), []).append(redis_usec(urls[arm]) / max(run.requests, 1))
                        print(f"{arm} {kind} c={concurrency}: p50 {run.p50_ms:.2f} ms {run.rps:,.0f} req/s {run.outcomes}")
                        runs.setdefault((kind, arm, concurrency), []).append(run)
        scale = memory_at_scale(urls[arms[0]], args.documents, 512)
    command = "python -m bench.cluster" + (f" {' '.join(sys.argv[1:])}" if sys.argv[1:] else "")
    text = report(runs, memory, bodies, arms, source, command, started, args, usec, scale)
    existing = Path(args.out).read_text(encoding="utf-8") if Path(args.out).exists() else ""
    marker = "\n## Analysis"
    analysis = existing[existing.index(marker):] if marker in existing else ""
    Path(args.out).write_text(text + analysis, encoding="utf-8")
    print(f"bench: wrote {args.out}")
    return 0


def report(runs: dict[tuple[str, str, int], list[Run]], memory: dict[str, tuple[float, float, int, int]],
           bodies: dict[str, tuple[list[str], list[str]]], arms: tuple[str, ...], source: str, command: str,
           started: str, args: argparse.Namespace, usec: dict[tuple[str, str], list[float]],
           scale: tuple[float, float]) -> str:
    def p50(kind: str, arm: str, concurrency: int) -> float:
        return statistics.mean(r.p50_ms for r in runs[(kind, arm, concurrency)])

    def rps(kind: str, arm: str, concurrency: int) -> float:
        return statistics.mean(r.rps for r in runs[(kind, arm, concurrency)])

    lines = [
        "# Strata on a Redis Cluster (issue #13)",
        "",
        f"Measured part written by `{command}` on {started} ({machine()}). Both arms run at once on",
        "this machine's 2 cores (each Redis, each Strata worker, the stub upstream and wrk share them), and take",
        f"turns run by run ({args.rounds} rounds of {args.duration} s per row and arm; the tables give the mean).",
        f"Cache filled with the {source}, category `{CATEGORY}` (static threshold + verifier); one Strata worker per arm.",
        "",
        "| hit path | concurrency | 1 node p50 ms | cluster p50 ms | added p50 ms | 1 node req/s | cluster req/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in ("exact", "semantic"):
        for concurrency in (1, 16):
            one, many = p50(kind, arms[0], concurrency), p50(kind, arms[1], concurrency)
            lines.append(f"| {kind} | {concurrency} | {one:.2f} | {many:.2f} | {many - one:+.2f} | "
                         f"{rps(kind, arms[0], concurrency):,.0f} | {rps(kind, arms[1], concurrency):,.0f} |")
    lines += ["", "Redis's own time per hit (`INFO commandstats` of every master, reset before each run, "
              "divided by the run's requests; mean over the runs of both concurrencies):", "",
              "| hit path | 1 node µs | cluster µs |", "|---|---:|---:|"]
    for kind in ("exact", "semantic"):
        lines.append(f"| {kind} | {statistics.mean(usec[(kind, arms[0])]):.1f} | {statistics.mean(usec[(kind, arms[1])]):.1f} |")
    lines += ["", "Each run, grouped by row and arm:", "",
              "| hit path | concurrency | arm | p50 ms | p99 ms | req/s | errors |", "|---|---:|---|---:|---:|---:|---:|"]
    for (kind, arm, concurrency), taken in sorted(runs.items()):
        for run in taken:
            lines.append(f"| {kind} | {concurrency} | {arm} | {run.p50_ms:.2f} | {run.p99_ms:.2f} | {run.rps:,.0f} | {run.errors} |")
    lines += ["", "Memory per cached question (the same questions in both arms):", "",
              "| arm | exact entries | semantic documents | bytes per entry (MEMORY USAGE) | index bytes per document (FT.INFO) |",
              "|---|---:|---:|---:|---:|"]
    for arm in arms:
        entry, index, documents, exact = memory[arm]
        lines.append(f"| {arm} | {exact} | {documents} | {entry:,.0f} | {index:,.0f} |")
    lines += ["", f"At scale, {args.documents:,} documents shaped like Strata's (512-dim float32, a 600-byte answer) in "
              f"one index of `schemas/semantic_index.yaml` on the single node: **{scale[0]:,.0f} bytes of `used_memory` "
              f"per document**, of which the index (FT.INFO: vector index and the rest) {scale[1]:,.0f}."]
    hits = {arm: (len(bodies[arm][0]), len(bodies[arm][1])) for arm in arms}
    lines += ["", f"Hit bodies found by filling (exact, semantic): {hits}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
