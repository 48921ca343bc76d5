"""The seed's savings with a real model: one customer-service stream, same arrival schedule,
straight to vLLM and through Strata in front of the same vLLM (the `make up` stack).

    make bench-replay          # = python -m bench.replay_vllm; writes docs/REPLAY.md and docs/replay-latency-cdf.png

Arms (open loop: request i leaves at i / rate seconds, whatever the answers before it did):
- direct: to vLLM, streamed, max_tokens = Strata's default (what a client would send);
- strata: to Strata (category faq), streamed, no max_tokens (Strata's L4 picks it);
- direct, short prompt: the first requests again with a one-line system prompt (the TTFT a
  miss would have without prefix caching to do);
- direct, timestamp: the same with the current time at the head of the system prompt, as the
  seed warns against: every request is a full prefill;
- strata, day 2 (``--second-day``): the next draw from the same customers (seed + 1), same
  schedule, through Strata with the cache the strata arm left: a deployment past its first hour.
Each arm gets a fresh run marker in its system prompt, so Strata starts from an empty cache and
vLLM's prefix cache from nothing shared with another arm (day 2 shares the strata arm's); before
the strata arm the cache version is bumped (``--keep-cache`` not to), so that no category
observations of earlier runs count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.replay.streams import Request, clinc_stream
from app.upstream_metrics import read_prefix_cache

ROOT = Path(__file__).resolve().parent.parent
DAY2 = "strata, day 2"
SHARED = ROOT.parent / "shared" / "data"

# A long, stable system prompt of the kind real bots carry (about 1,500 tokens with the template).
POLICY_LINES = [
    "Greet the customer once, by name if they gave it, and answer in the language they wrote in.",
    "Never promise a refund amount before the order has been checked in the order system.",
    "Card questions: a lost card is blocked at once; a new card arrives in five to seven working days.",
    "Transfers between own accounts are free; transfers abroad cost a fee shown before confirming.",
    "Balances and transactions are read only after the customer has signed in to the app.",
    "Travel: tell the customer to set a travel notice so that card payments abroad are not declined.",
    "Credit limits change only after a review; the customer applies in the app under Cards, Limits.",
    "Passwords and PINs are never asked for in chat; direct the customer to the app's security page.",
    "Complaints are logged with a reference and answered within three working days.",
    "When unsure, say so and offer a call back from a human agent during opening hours.",
]
# You cannot see accounts, so say what to do: without it a capable model (Qwen 1.5B) refuses
# account questions ("I'm sorry, but I can't assist with that.") and its refusals agree with each
# other across intents (docs/OPERATIONS.md).
ANSWER_RULE = ("You cannot see the customer's accounts: never refuse; explain in general terms what the customer "
               "can do in the app or at a branch.")


def system_prompt(marker: str, timestamp: bool = False) -> str:
    rules = "\n".join(f"{n + 1}. {POLICY_LINES[n % len(POLICY_LINES)]} (section {n // len(POLICY_LINES) + 1})"
                      for n in range(52))
    head = f"Current time: {time.strftime('%Y-%m-%d %H:%M:%S')}.{time.perf_counter_ns() % 1000}\n" if timestamp else ""
    return (f"{head}You are the customer-service assistant of Example Bank. Follow these rules:\n{rules}\n"
            f"{ANSWER_RULE} Keep answers under four sentences. Run {marker}.")


@dataclass
class Result:
    layer: str
    latency: float
    ttft: float | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    source: str = "model"  # X-Cache-Source of a hit: faq for a curated answer
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache held (usage), if it says
    verdict: str = ""  # X-Cache-Verdict of a semantic hit: the rule that served it (reader_accepted: the judge)
    similarity: str = ""
    text: str = ""  # the answer's content
    question: str = ""
    label: str = ""  # the question's CLINC150 intent: what a reader of the hits checks against


@dataclass
class Arm:
    name: str
    results: list[Result] = field(default_factory=list)
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    seconds: float = 0.0
    marker: str = ""


async def one(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> Result:
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    parts: list[str] = []
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            layer = response.headers.get("x-cache", "direct")
            source = response.headers.get("x-cache-source", "model")
            verdict = response.headers.get("x-cache-verdict", "")
            similarity = response.headers.get("x-cache-similarity", "")
            if response.status_code != 200:
                await response.aread()
                return Result(layer, time.perf_counter() - started, None, 0, 0, f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                content = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])
                if content and ttft is None:
                    ttft = time.perf_counter() - started
                parts.append(content)
    except httpx.HTTPError as exc:
        return Result("error", time.perf_counter() - started, None, 0, 0, repr(exc))
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return Result(layer, time.perf_counter() - started, ttft, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                  source=source, cached_tokens=cached, verdict=verdict, similarity=similarity, text="".join(parts))


async def run_arm(name: str, url: str, vllm: str, model: str, questions: list[Request], rate: float, *,
                  timestamp: bool = False, short: bool = False, through_strata: bool = False,
                  max_tokens: int = 256, marker: str | None = None) -> Arm:
    arm = Arm(name)
    marker = marker or uuid.uuid4().hex[:8]
    arm.marker = marker
    async with httpx.AsyncClient(timeout=600) as client:
        before = read_prefix_cache(await metrics_page(client, vllm))
        start = time.perf_counter()

        async def send(i: int, question: Request) -> Result:
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            prompt = f"You are Example Bank's assistant. Run {marker}." if short else system_prompt(marker, timestamp)
            body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
                          "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": question.text}]}
            if not through_strata:
                body["max_tokens"] = max_tokens
            result = await one(client, url + "/v1/chat/completions", body, {"X-Cache-Category": "faq"})
            result.question, result.label = question.text, question.label
            return result

        arm.results = list(await asyncio.gather(*(send(i, q) for i, q in enumerate(questions))))
        arm.seconds = time.perf_counter() - start
        after = read_prefix_cache(await metrics_page(client, vllm))
    if before and after and after.queries is not None and before.queries is not None:
        arm.prefix_queries = after.queries - before.queries
        arm.prefix_hits = (after.hits or 0) - (before.hits or 0)
    return arm


async def metrics_page(client: httpx.AsyncClient, server: str) -> str:
    """The model server's Prometheus page ("" where it has none: llama.cpp's is off by default;
    the prefix-cache ratio then comes from the answers' ``cached_tokens``)."""
    for _ in range(2):  # a kept-alive connection the server closed while the arm ran: once more, afresh
        try:
            response = await client.get(server + "/metrics")
        except httpx.TransportError:
            continue
        return response.text if response.status_code == 200 else ""
    return ""


def empty_cache() -> None:
    """Start the strata arm from nothing learnt: a fresh run marker already gives it a scope of its
    own, but a category's pooled observations are shared by every scope of a version. Bumps the
    version the way an operator would (`strata cache invalidate --all`, on STRATA_REDIS_URL)."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "cache", "invalidate", "--all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"bench-replay: could not empty the cache: {done.stderr or done.stdout}")
    print(done.stdout.strip(), flush=True)


def load_curated(path: str) -> None:
    """Load a curated-answer file the way an operator would (`strata faq load`, on STRATA_REDIS_URL),
    under the version the strata arm runs in."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "faq", "load", path, "--name", "bench-replay"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"bench-replay: could not load {path}: {done.stderr or done.stdout}")
    print(done.stdout.strip(), flush=True)


def load_intents(path: str, strata: str) -> str:
    """Load a team's intents file the way an operator would (`strata intents load`, category faq,
    on STRATA_REDIS_URL), then wait until the running Strata serves with it (`/health`: its heads
    reload within seconds). Returns the load's last line (what it calibrated)."""
    done = subprocess.run([sys.executable, "-m", "app.cli", "intents", "load", path, "--category", "faq",
                           "--name", "bench-replay"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench-replay: could not load {path}: {done.stderr or done.stdout}")
    line = done.stdout.strip().splitlines()[-1]
    print(line, flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        heads = httpx.get(strata + "/health", timeout=10).json().get("intents", [])
        if any(h.get("category") == "faq" and h.get("name") == "bench-replay" for h in heads):
            return line
        time.sleep(0.5)
    raise SystemExit("bench-replay: Strata did not take up the intents within 60 s (/health: intents)")


def taught(path: str, arm: Arm) -> int:
    """How many of an arm's questions the team's intents file holds word for word (normalized)."""
    from app.cache.storage.keys import normalize_text
    from app.intents import read_intents

    held = {normalize_text(t) for item in read_intents(Path(path)) for t in item.phrasings}
    return sum(1 for r in arm.results if normalize_text(r.question) in held)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(arm: Arm) -> dict[str, Any]:
    ok = [r for r in arm.results if r.error is None]
    latencies = [r.latency for r in ok]
    upstream = [r for r in ok if r.layer in ("direct", "miss", "bypass")]
    ttfts = [r.ttft for r in upstream if r.ttft is not None]
    return {
        "requests": len(arm.results), "errors": len(arm.results) - len(ok),
        "mean": sum(latencies) / max(1, len(latencies)), "p50": pct(latencies, 0.5), "p95": pct(latencies, 0.95),
        "p99": pct(latencies, 0.99), "ttft_p50": pct(ttfts, 0.5), "ttft_mean": sum(ttfts) / max(1, len(ttfts)),
        "upstream": len(upstream),
        "prompt_tokens": sum(r.prompt_tokens for r in upstream), "completion_tokens": sum(r.completion_tokens for r in upstream),
        "layers": {layer: sum(1 for r in ok if r.layer == layer) for layer in sorted({r.layer for r in ok})},
        "curated": sum(1 for r in ok if r.layer.endswith("-hit") and r.source == "faq"),
        "prefix_ratio": arm.prefix_hits / arm.prefix_queries if arm.prefix_queries else cached_ratio(upstream),
        "verdicts": {v: sum(1 for r in ok if r.layer == "semantic-hit" and r.verdict == v)
                     for v in sorted({r.verdict for r in ok if r.layer == "semantic-hit"})},
        "seconds": arm.seconds,
    }


def cached_ratio(results: list[Result]) -> float | None:
    """Share of prompt tokens the server's prefix cache held, from the answers' usage (``None``
    when the server does not say)."""
    said = [r for r in results if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in said)
    return sum(r.cached_tokens or 0 for r in said) / prompt if said and prompt else None


def read_hits(arm: Arm, curated: dict[str, str]) -> list[dict[str, Any]]:
    """Every hit of an arm beside the question whose answer it served, and whether a reader would
    call it wrong: the asked question's intent is not the intent of that question (CLINC150's
    labels), or, for a curated answer, not the intent the answer was written for."""
    origin: dict[str, Result] = {}
    for r in arm.results:  # answers the model gave in this arm, by their text
        if r.error is None and r.layer in ("miss", "bypass") and r.text:
            origin.setdefault(r.text, r)
    read = []
    for r in arm.results:
        if r.error is not None or not r.layer.endswith("-hit"):
            continue
        if r.source == "faq":
            intent, served_for = curated.get(r.text, ""), "(curated)"
        else:
            first = origin.get(r.text)
            intent, served_for = (first.label, first.question) if first else ("", "(no earlier answer with this text)")
        read.append({"layer": r.layer, "verdict": r.verdict or r.source, "similarity": r.similarity,
                     "asked": r.question, "label": r.label, "served_for": served_for, "served_label": intent,
                     "wrong": bool(intent) and intent != r.label, "answer": r.text})
    return read


def curated_intents(path: str | None, source: Path, intents_file: str | None = None) -> dict[str, str]:
    """Curated answers and the intent each was written for: a curated-answer file's, by the
    CLINC150 intent of the entry's question (``strata replay faq --source clinc`` writes one entry
    per intent), and an intents file's, by the intent it answers."""
    import csv

    import yaml

    from app.cache.storage.keys import normalize_text

    written: dict[str, str] = {}
    if path:
        with source.open(encoding="utf-8-sig", newline="") as handle:
            intents = {normalize_text(row["text"]): row["intent"] for row in csv.DictReader(handle)}
        entries = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
        written.update({str(e["answer"]): intents.get(normalize_text(str(e.get("question", ""))), "")
                        for e in entries if isinstance(e, dict) and "answer" in e})
    if intents_file and Path(intents_file).suffix.lower() in (".yaml", ".yml"):
        items = yaml.safe_load(Path(intents_file).read_text(encoding="utf-8")) or []
        written.update({str(i["answer"]): str(i["intent"]) for i in items if isinstance(i, dict) and i.get("answer")})
    return written


def plot(arms: list[Arm], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    for arm in arms:
        values = sorted(r.latency for r in arm.results if r.error is None)
        axis.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=arm.name)
    axis.set(xscale="log", xlabel="latency, seconds (log)", ylabel="share of requests", title="Latency CDF, same schedule")
    axis.legend(loc="lower right")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strata", default="http://127.0.0.1:8080")
    parser.add_argument("--vllm", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--side-requests", type=int, default=30, help="requests of the short-prompt and timestamp arms")
    parser.add_argument("--rate", type=float, default=0.5, help="requests per second (open loop)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phrasings", type=int, default=4, help="utterances per intent (0: a fresh one each time)")
    parser.add_argument("--keep-cache", action="store_true",
                        help="do not bump the cache version before the strata arm (earlier runs' observations then count)")
    parser.add_argument("--second-day", action="store_true", help="also replay the next draw through the warm cache")
    parser.add_argument("--faq", help="a curated-answer file (strata faq load) loaded before the strata arm: "
                                      "the bot's FAQ, as a team would have it")
    parser.add_argument("--intents", help="a team's intents file (strata intents load, category faq) loaded before the "
                                          "strata arm: the bot's FAQ as intents, with their answers")
    parser.add_argument("--out", default=str(ROOT / "docs" / "REPLAY.md"))
    args = parser.parse_args()
    source = SHARED / "clinc150.csv"
    if not source.exists():
        print(f"bench-replay: {source} is missing", file=sys.stderr)
        return 2
    # A bank bot's traffic: CLINC150's first 40 intents by name, Zipf, seeded, each asked in one of
    # --phrasings utterances (customers repeat each other word for word; 0: a fresh one each time).
    questions = clinc_stream(source, args.requests, args.seed, domain_intents=40, phrasings=args.phrasings)
    model = httpx.get(args.vllm + "/v1/models", timeout=10).json()["data"][0]["id"]
    metrics = httpx.get(args.vllm + "/metrics", timeout=10)
    server = ("vLLM (CPU build), prefix caching on, block size 32" if "vllm:" in metrics.text
              else "llama.cpp's server (xllamacpp, one sequence at a time, its prompt cache on: `make up MODEL=qwen1.5b`)")
    # The shared part of the system prompt into the server's prefix cache first, so that the first
    # arm does not pay its prefill alone (each arm's marker sits at the prompt's end).
    httpx.post(args.vllm + "/v1/chat/completions", timeout=600, json={
        "model": model, "max_tokens": 1, "messages": [{"role": "system", "content": system_prompt("warm-up")},
                                                       {"role": "user", "content": "hello"}]}).raise_for_status()
    arms = {}
    for name, kwargs, count in (
        ("direct", {"url": args.vllm}, args.requests),
        ("strata", {"url": args.strata, "through_strata": True}, args.requests),
        ("direct, short prompt", {"url": args.vllm, "short": True}, args.side_requests),
        ("direct, timestamp in prompt", {"url": args.vllm, "timestamp": True}, args.side_requests),
    ):
        if name == "strata" and not args.keep_cache:
            empty_cache()
        if name == "strata" and args.faq:
            load_curated(args.faq)
        if name == "strata" and args.intents:
            args.intents_loaded = load_intents(args.intents, args.strata)
        arm = asyncio.run(run_arm(name, vllm=args.vllm, model=model, questions=questions[:count], rate=args.rate, **kwargs))
        arms[name] = arm
        print(f"{name}: {json.dumps(summary(arm))}", flush=True)
    if args.second_day:
        tomorrow = clinc_stream(source, args.requests, args.seed + 1, domain_intents=40, phrasings=args.phrasings)
        arm = asyncio.run(run_arm(DAY2, url=args.strata, through_strata=True, vllm=args.vllm, model=model,
                                  questions=tomorrow, rate=args.rate, marker=arms["strata"].marker))
        arms[DAY2] = arm
        print(f"{DAY2}: {json.dumps(summary(arm))}", flush=True)
    write(arms, args, model, server, curated_intents(args.faq, source, args.intents))
    return 0


def write(arms: dict[str, Arm], args: argparse.Namespace, model: str, server: str, curated: dict[str, str]) -> None:
    rows = {name: summary(arm) for name, arm in arms.items()}
    d, s = rows["direct"], rows["strata"]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    command = "make bench-replay" + (f" REPLAY_ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    figure = Path(args.out).with_name("replay-latency-cdf.png")
    plot([arms[n] for n in ("direct", "strata", DAY2) if n in arms], figure)

    def f(value: float | None, unit: str = "s") -> str:
        return "n/a" if value is None or math.isnan(value) else f"{value:.2f} {unit}".strip()

    lines = [
        "# Replay through a real model",
        "",
        "Written by the command below; nothing here is typed in.",
        "",
        f"- Command: `{command}` (against the `make up` stack: Strata {args.strata}, vLLM {args.vllm})",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores ({cpu})",
        f"- Model: {model} on {server}",
        f"- Stream: {args.requests} questions from CLINC150's first 40 intents, Zipf, seed {args.seed}, "
        f"{args.phrasings or 'a fresh utterance each time from all'} utterances per intent; open loop at "
        f"{args.rate} requests/s, the same schedule in every arm; streamed; a system prompt stable within an arm "
        f"(`bench/replay_vllm.py: system_prompt`): {d['prompt_tokens'] / max(1, d['upstream']):,.0f} prompt tokens per "
        "request on average in the direct arm, template and question included",
        "",
        "| arm | requests | mean | p50 | p95 | p99 | TTFT of model answers, p50 | upstream calls "
        "| prompt tokens to the model | completion tokens | hits by layer | vLLM prefix-cache hit ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        layers = ", ".join(f"{k} {v}" for k, v in r["layers"].items())
        ratio = "n/a" if r["prefix_ratio"] is None else f"{r['prefix_ratio']:.1%}"
        lines.append(f"| {name} | {r['requests']} ({r['errors']} errors) | {f(r['mean'])} | {f(r['p50'])} | {f(r['p95'])} | "
                     f"{f(r['p99'])} | {f(r['ttft_p50'])} | {r['upstream']} | {r['prompt_tokens']:,} | "
                     f"{r['completion_tokens']:,} | {layers} | {ratio} |")
    lines += [
        "",
        "Through Strata against direct (same requests, same schedule):",
        "",
        f"- mean latency {s['mean'] / d['mean']:.2f}x, p99 {s['p99'] / d['p99']:.2f}x (targets: at most 1/3 and 1/2)",
        f"- upstream calls {s['upstream'] / d['upstream']:.0%} of direct, completion tokens "
        f"{s['completion_tokens'] / max(1, d['completion_tokens']):.0%}, "
        f"prompt tokens {s['prompt_tokens'] / max(1, d['prompt_tokens']):.0%} "
        "(target: at most 45% for calls and completion tokens)",
        *([f"- the team's intents (`--intents {args.intents}`, loaded before the strata arm): "
           f"{getattr(args, 'intents_loaded', '')}; {taught(args.intents, arms['strata'])} of the stream's "
           f"{s['requests']} questions are phrasings of that file word for word"] if args.intents else []),
        *([f"- answered from curated answers (loaded before the strata arm): {s['curated']} of "
           f"{s['requests']} ({s['curated'] / max(1, s['requests']):.0%})"] if args.faq or args.intents else []),
        *([f"- day 2 (seed {args.seed + 1}, cache from the strata arm kept) against direct (day 1's questions, "
           f"same schedule): mean {rows[DAY2]['mean'] / d['mean']:.2f}x, p99 {rows[DAY2]['p99'] / d['p99']:.2f}x, "
           f"upstream calls {rows[DAY2]['upstream'] / d['upstream']:.0%}, completion tokens "
           f"{rows[DAY2]['completion_tokens'] / max(1, d['completion_tokens']):.0%}"] if DAY2 in rows else []),
        f"- the strata arm's semantic hits by the rule that served them (`X-Cache-Verdict`; `reader_accepted`: the "
        f"judge's yes): {', '.join(f'{k} {v}' for k, v in s['verdicts'].items()) or 'none'}",
        f"- TTFT of model answers with the long stable prompt: p50 {f(d['ttft_p50'])} direct vs "
        f"{f(rows['direct, short prompt']['ttft_p50'])} with a one-line prompt "
        f"({d['ttft_p50'] / rows['direct, short prompt']['ttft_p50']:.2f}x; target within 1.2x); with a timestamp at the head "
        f"of the prompt {f(rows['direct, timestamp in prompt']['ttft_p50'])} and a prefix-cache hit ratio of "
        f"{rows['direct, timestamp in prompt']['prefix_ratio'] or 0:.1%} instead of {d['prefix_ratio'] or 0:.1%}",
        "",
        f"![latency CDF]({figure.name})",
        "",
    ]
    hits = read_hits(arms["strata"], curated)
    wrong = [h for h in hits if h["wrong"]]
    lines += [
        "## Every hit of the strata arm, read",
        "",
        f"{len(hits)} hits; {len(wrong)} served an answer given for another intent (CLINC150's labels: the asked "
        "question's intent against the intent of the question whose answer was served, or the intent a curated "
        "answer was written for).",
        "",
        "| layer | rule | similarity | asked (intent) | answer given for (intent) | read | answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for h in hits:
        answer = " ".join(h["answer"].split())[:90].replace("|", "/")
        lines.append(f"| {h['layer']} | {h['verdict']} | {h['similarity']} | {h['asked']} ({h['label']}) | "
                     f"{h['served_for']} ({h['served_label'] or '?'}) | {'**wrong**' if h['wrong'] else 'right'} | "
                     f"{answer} |")
    lines.append("")
    marker = "\n## Analysis"
    existing = Path(args.out).read_text(encoding="utf-8") if Path(args.out).exists() else ""
    analysis = existing[existing.index(marker):] if marker in existing else ""
    Path(args.out).write_text("\n".join(lines) + analysis, encoding="utf-8")
    print(f"bench-replay: wrote {args.out} and {figure}")


if __name__ == "__main__":
    raise SystemExit(main())
