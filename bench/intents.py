"""A team's intents against none, on streams nobody tuned them to (issue #46).

    python -m bench.intents [--seeds 0] [--out .run/bench-intents] [--only clinc-all ...]
        [--intent-embedder .run/models/embeddinggemma-300m]

Each arm is ``strata replay run --simulate`` (its own Redis Stack, the labelled upstream) of one
stream, category ``faq`` as shipped, with and without ``--intents`` (the team's file, loaded and
calibrated first). The streams and team files:

- CLINC150: the team's data is its ``train`` split (all of it, or 10 phrasings per intent); the
  stream is 3,000 requests of its ``test`` split, 10% of them from ``oos_test``;
- its bank domain the same way;
- the Chinese FAQ set: the team's data is the first 3 wordings of each label, the stream the rest;
- a Chinese telecom team's file (``../shared/data/zh_telecom_intents.csv``, 12 intents of 15
  phrasings and 20 questions of none): the team's file is 8 phrasings of each intent (seeded),
  the stream 1,500 requests of the other 7, with (``zh-telecom-oos``) or without its out-of-scope
  questions (each its own label); the file is read from ``../shared``, never copied here.

Columns: semantic hits and their wrong share; **captured**: right semantic hits on texts not
asked before, over what a perfect cache would serve semantically (requests of a label seen before,
in other words; never an out-of-scope one); the worst window of 500 requests, the first ones
included; out-of-scope questions served by the intent rule and by any rule (each counted wrong). Reports are kept as JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

STRATA = [sys.executable, "-m", "app.cli"]
REPLAY = Path(".run/replay")
INTENT_MATCH = "intent_match"
INTENT_PROBATION = "intent_probation"
INTENT_RULE = (INTENT_MATCH, INTENT_PROBATION)
WINDOW = 500
TELECOM = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "zh_telecom_intents.csv"
TELECOM_TEAM = 8


def telecom(seed: int) -> tuple[Path, Path, Path] | None:
    """The telecom team's file (8 phrasings an intent) and its two streams, made when missing;
    ``None`` when the shared folder is absent."""
    import csv
    import random

    from app.replay.streams import zipf_stream

    if not TELECOM.exists():
        return None
    team, plain, scoped = (REPLAY / f"zh-telecom-team8-s{seed}.csv", REPLAY / f"zh-telecom-s{seed}.jsonl",
                           REPLAY / f"zh-telecom-oos-s{seed}.jsonl")
    if team.exists() and plain.exists() and scoped.exists():
        return team, plain, scoped
    groups: dict[str, list[str]] = {}
    with TELECOM.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            groups.setdefault(row["intent"], []).append(row["text"].strip())
    out_of_scope = groups.pop("out_of_scope", [])
    rng = random.Random(seed)
    kept: dict[str, list[str]] = {}
    asked: dict[str, list[str]] = {}
    for intent in sorted(groups):
        texts = rng.sample(groups[intent], len(groups[intent]))
        kept[intent], asked[intent] = texts[:TELECOM_TEAM], texts[TELECOM_TEAM:]
    with team.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "intent"])
        writer.writerows((text, intent) for intent, texts in kept.items() for text in texts)
    for path, extra in ((plain, {}), (scoped, {f"oos:{t}": [t] for t in out_of_scope})):
        stream = zipf_stream({**asked, **extra}, 1500, seed)
        path.write_text("".join(msgspec.json.encode({"text": r.text, "label": r.label}).decode() + "\n"
                                for r in stream), encoding="utf-8")
    return team, plain, scoped


def build(seed: int) -> dict[str, tuple[Path, Path | None]]:
    """The streams of a seed and their team files (made when missing)."""
    REPLAY.mkdir(parents=True, exist_ok=True)

    def make(out: Path, *args: str) -> Path:
        if not out.exists():
            subprocess.run([*STRATA, "replay", *args, "--out", str(out)], check=True, capture_output=True)
        return out

    clinc = make(REPLAY / f"clinc-test3000-s{seed}.jsonl", "build", "--source", "clinc", "--split", "test",
                 "--oos-share", "0.1", "--requests", "3000", "--seed", str(seed))
    bank = make(REPLAY / f"bank-test3000-s{seed}.jsonl", "build", "--source", "clinc", "--domain", "bank", "--split",
                "test", "--oos-share", "0.1", "--requests", "3000", "--seed", str(seed))
    zh = make(REPLAY / f"zh-held3-s{seed}.jsonl", "build", "--source", "faqset", "--file",
              "bench/data/zh_shop_bank_faq.yaml", "--held", "3", "--requests", "1500", "--seed", str(seed))
    teams = {
        "clinc-all": make(REPLAY / "clinc-train.csv", "intents", "--source", "clinc"),
        "clinc-10": make(REPLAY / "clinc-train10.csv", "intents", "--source", "clinc", "--per-intent", "10"),
        "bank-all": make(REPLAY / "bank-train.csv", "intents", "--source", "clinc", "--domain", "bank"),
        # A small team's file (6 phrasings an intent): it certifies nothing; the rule on trial (issue #58 item 6).
        "bank-6": make(REPLAY / "bank-train6.csv", "intents", "--source", "clinc", "--domain", "bank", "--per-intent", "6"),
        # The same with CLINC150's oos_train questions labelled out_of_scope (issue #58 item 5).
        "clinc-oos": make(REPLAY / "clinc-train-oos.csv", "intents", "--source", "clinc", "--out-of-scope"),
        "bank-oos": make(REPLAY / "bank-train-oos.csv", "intents", "--source", "clinc", "--domain", "bank",
                         "--out-of-scope"),
        "zh-3": make(REPLAY / "zh-team3.csv", "intents", "--source", "faqset", "--file",
                     "bench/data/zh_shop_bank_faq.yaml", "--per-intent", "3"),
    }
    # CLINC150 with 6 phrasings an intent: a small English file (issue #62's second target).
    teams["clinc-6"] = make(REPLAY / "clinc-train6.csv", "intents", "--source", "clinc", "--per-intent", "6")
    arms = {"clinc-none": (clinc, None), "clinc-all": (clinc, teams["clinc-all"]), "clinc-10": (clinc, teams["clinc-10"]),
            "clinc-6": (clinc, teams["clinc-6"]),
            "bank-none": (bank, None), "bank-all": (bank, teams["bank-all"]), "bank-6": (bank, teams["bank-6"]),
            "clinc-oos": (clinc, teams["clinc-oos"]), "bank-oos": (bank, teams["bank-oos"]),
            "zh-none": (zh, None), "zh-3": (zh, teams["zh-3"])}
    shared = telecom(seed)
    if shared is not None:
        team, plain, scoped = shared
        arms.update({"zh-telecom-none": (scoped, None), "zh-telecom": (plain, team), "zh-telecom-oos": (scoped, team)})
    return arms


def opportunity(stream: Path) -> int:
    """What a perfect cache serves semantically: a label seen before, a text not (never out of scope)."""
    return opportunity_of([msgspec.json.decode(line) for line in stream.read_text(encoding="utf-8").splitlines()])


def opportunity_of(requests: list[Any]) -> int:
    """:func:`opportunity` of decoded requests."""
    seen_labels, seen_texts, count = set(), set(), 0
    for request in requests:
        text, label = request["text"], request["label"]
        if label in seen_labels and text not in seen_texts and not label.startswith("oos:"):
            count += 1
        seen_labels.add(label)
        seen_texts.add(text)
    return count


def figures(report: dict[str, Any], stream: Path) -> dict[str, Any]:
    trace = [step.split(":", 2) for step in report["trace"]]
    requests = [msgspec.json.decode(line) for line in stream.read_text(encoding="utf-8").splitlines()]
    labels = [r["label"] for r in requests]
    # Beyond the stream's repeats: a text asked before is not what the semantic layer is for.
    seen: set[str] = set()
    new_text = []
    for r in requests:
        new_text.append(r["text"] not in seen)
        seen.add(r["text"])
    wrong_at = {hit["index"] for hit in report["wrong_hits"] if hit["layer"] == "semantic-hit"}
    semantic = [i for i, (layer, _, _) in enumerate(trace) if layer == "semantic-hit"]
    right = [i for i in semantic if i not in wrong_at and new_text[i]]
    worst = 0.0
    for start in range(0, len(trace), WINDOW):
        served = [i for i in semantic if start <= i < start + WINDOW]
        if served:
            worst = max(worst, sum(i in wrong_at for i in served) / len(served))
    oos = [i for i in semantic if labels[i].startswith("oos:")]
    intent_hits = [i for i in semantic if trace[i][1] in INTENT_RULE]
    return {"requests": len(trace), "semantic": len(semantic), "wrong": len(wrong_at),
            "captured": len(right) / max(1, opportunity(stream)),
            "intent_hits": len(intent_hits), "probation_hits": sum(trace[i][1] == INTENT_PROBATION for i in semantic),
            "intent_wrong": sum(i in wrong_at for i in intent_hits),
            "worst_window": worst, "oos_by_intent": sum(1 for i in oos if trace[i][1] in INTENT_RULE),
            "oos_any": len(oos), "model_calls": report.get("model_calls")}


def lost(report: dict[str, Any], stream: Path, served_right: list[int]) -> list[tuple[str, int]]:
    """Where the pipeline lost what the static head served right, request by request: each such
    request's outcome in the pipeline (a wrong hit; an exact hit; else its semantic decision, from
    ``replay run --decisions``: the verdict and rule, a "none" by the nearest row's similarity), most first."""
    trace = [step.split(":", 2) for step in report["trace"]]
    decisions = report.get("decisions") or [""] * len(trace)
    wrong_at = {hit["index"] for hit in report["wrong_hits"]}
    tally: dict[str, int] = {}
    for i in served_right:
        layer = trace[i][0]
        if layer == "semantic-hit" and i not in wrong_at:
            continue
        if i in wrong_at:
            why = "served wrong"
        elif layer != "miss":
            why = layer
        else:
            verdict, rule, similarity, set_aside, beyond = [*decisions[i].split("|"), "", "", "", "", ""][:5]
            nearest = float(similarity) if similarity else 0.0
            reach = "<0.5" if nearest < 0.5 else "0.5-0.8" if nearest < 0.8 else ">=0.8"
            aside = f"; set aside: {set_aside}" if set_aside else ""
            why = f"{verdict} {rule}".strip() + aside if verdict != "none" else \
                f"none (nearest {reach}; {beyond or 0} beyond the band{aside})"
        tally[why] = tally.get(why, 0) + 1
    return sorted(tally.items(), key=lambda t: -t[1])


def coarse(why: str) -> str:
    """A loss of :func:`lost` in a few words: which part of the pipeline took it."""
    if why == "served wrong":
        return "served another label's answer"
    if why.startswith("explored"):
        return "explored (sent to the model to measure the rule)"
    if "intent_unchecked" in why:
        return "checked first (an entry's first match)"
    if "wrong_before" in why:
        return "a veto from an earlier wrong answer"
    from app.cache.decision.rules import Guards

    if any(reason in why for reason in Guards.reasons):
        return "the guards (numbers, negation, names ...)"
    if "intent_differs" in why:
        return "the head's veto"
    if why.startswith("none"):
        return "nothing within reach (the band's floor; beyond it, 0.45)"
    if "outside_bound" in why:
        return "no rule vouched (outside the bound)"
    return why


def stand_in_reach(load_output: str) -> float | None:
    """How surely the load's out-of-scope stand-ins were read as an intent, at most (the load's
    line); ``None``: none was read as one."""
    found = re.search(r"were read as \d+ of the intents, up to ([0-9.]+)", load_output)
    return float(found.group(1)) if found else None


def serving_confidence(load_output: str) -> float | None:
    """The lowest confidence the loaded head serves at (on probation or certified), from the
    load's line (``confidence >= X``); ``None``: it serves nothing."""
    found = [float(m) for m in re.findall(r"confidence >= ([0-9.]+)", load_output)]
    return min(found) if found else None


def static_ceiling(team: Path, stream: Path, threshold: float, reach: float | None = None) -> dict[str, Any]:
    """The tenant's own head replayed statically as a cache keyed by its reading (issue #62 item
    0): fitted on the team's file as ``strata intents load`` fits it (its out-of-scope questions,
    or Strata's stand-ins), reading what the load's head reads (all-MiniLM-L6-v2 for an English
    file, USE otherwise); a question not asked before is served when an earlier question not
    served is read as the same intent, both at ``threshold``, never an out-of-scope reading;
    wrong when that question's label differs or the asker is out of scope. No band, no guards,
    no checks: what the head alone reads, the ceiling of the pipeline built on it. Beside it the
    same with the guards the pipeline keeps, and with those and the out-of-scope check at the
    load's ``reach`` (``None``: none)."""
    import numpy as np

    from app.cache.learning.intents import SoftmaxHead
    from app.cache.readers.onnx_vectors import OnnxModelVectors
    from app.cache.storage.keys import normalize_text
    from app.embed import load_encoder
    from app.intents import out_of_scope_stand_ins, read_intents, reads_english
    from bench.intent_embedders import embed

    items = read_intents(team)
    every = items + out_of_scope_stand_ins(items)
    english = reads_english(items)
    reader = OnnxModelVectors(".run/models/minilm-l6-onnx-int8") if english else load_encoder("use-multilingual")
    texts = [normalize_text(t) for item in every for t in item.phrasings]
    labels = np.array([n for n, item in enumerate(every) for _ in item.phrasings])
    requests = [msgspec.json.decode(line) for line in stream.read_text(encoding="utf-8").splitlines()]
    asked = [normalize_text(r["text"]) for r in requests]

    def unit(vectors: np.ndarray) -> np.ndarray:
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)

    head = SoftmaxHead(n_classes=len(every)).fit(unit(embed(reader, texts, f"team-{team.stem}")[0]), labels)
    vectors = unit(embed(reader, asked, f"stream-{stream.stem}")[0])
    read, sure = head.read(vectors)
    out_of_scope = {n for n, item in enumerate(every) if item.out_of_scope}
    at = replay_static(requests, asked, vectors, read, sure, out_of_scope, threshold)
    # The same with the guards the pipeline keeps (a simulated model answers per label, so the
    # static replay counts "a timer for 5 minutes" served "a timer for 10 minutes" right; a real
    # one would not be).
    from app.cache.decision.rules import intent_may_overrule
    from app.cache.decision.verify import Lexicon, PairAnalyzer
    from app.intents import negation_within
    from app.settings import PROJECT_ROOT

    analyzer = PairAnalyzer(Lexicon.load(PROJECT_ROOT / "schemas" / "verification.yaml"))
    # As the pipeline keeps them for the intent rule: a negation's word that negates nothing, or the
    # negation guard in an intent whose team phrasings differ in negation, does not set a pair aside.
    negated = negation_within(every, lambda a, b: analyzer.signals(a, b).rejections, english=english)
    intent_of = {text: int(intent) for text, intent in zip(asked, read, strict=True)}

    def guard(text: str, cached: str) -> str | None:
        rejections = analyzer.signals(text, cached).rejections
        if intent_may_overrule(rejections, negation_within=negated[intent_of[text]]):
            return None
        return rejections[0] if rejections else None

    guarded = replay_static(requests, asked, vectors, read, sure, out_of_scope, threshold, guard=guard)
    # And with the out-of-scope check the pipeline keeps (issue #62 item 4): what it may reach.
    kept = replay_static(requests, asked, vectors, read, sure, out_of_scope, threshold, guard=guard,
                         reach=reach) if reach is not None else guarded
    # The same head at the threshold that, in hindsight, captures most within the bound (1%).
    within = [r for r in (replay_static(requests, asked, vectors, read, sure, out_of_scope, level)
                          for level in CEILING_LEVELS) if r["wrong"] <= 0.01 * r["served"]]
    best = max(within, key=lambda r: r["captured"], default={"captured": 0.0, "served": 0, "wrong": 0, "level": 1.0})
    return {**at, "guarded_captured": guarded["captured"], "guarded_wrong": guarded["wrong"] / max(1, guarded["served"]),
            "kept_captured": kept["captured"], "kept_wrong": kept["wrong"] / max(1, kept["served"]),
            "kept_right_at": kept["right_at"],
            "best_captured": best["captured"], "best_level": best["level"],
            "best_wrong": best["wrong"] / max(1, best["served"])}


# The thresholds the static head is replayed at to find its best within the bound, in hindsight.
CEILING_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)


def replay_static(requests: list[Any], asked: list[str], vectors: Any, read: Any, sure: Any, out_of_scope: set[int],
                  threshold: float, guard: Any = None, reach: float | None = None) -> dict[str, Any]:
    """:func:`static_ceiling`'s replay at one threshold; ``guard`` (asked, cached) -> a reason or
    ``None``: the nearest cached question of the intent the guards let through serves. ``reach``:
    the out-of-scope check (issue #62 item 4), as the pipeline keeps it: a cached question read no
    surer than that serves only once its first match agreed (that match is the model's: a miss,
    and the question is cached); one that disagreed never serves."""
    import numpy as np

    seen_texts: set[str] = set()
    cached: dict[int, list[int]] = {}  # intent -> the requests cached, read as it confidently
    checked: set[int] = set()
    served = wrong = right = 0
    right_at: list[int] = []
    for i, (text, request, intent, confidence) in enumerate(zip(asked, requests, read, sure, strict=True)):
        if text in seen_texts:
            continue
        seen_texts.add(text)
        confident = confidence >= threshold and int(intent) not in out_of_scope
        same = [j for j in cached.get(int(intent), []) if guard is None or guard(text, asked[j]) is None]
        if confident and same:
            nearest = same[int(np.argmax(vectors[same] @ vectors[i]))]
            if reach is not None and sure[nearest] <= reach and nearest not in checked:
                if request["label"] == requests[nearest]["label"] and not request["label"].startswith("oos:"):
                    checked.add(nearest)
                else:
                    cached[int(intent)].remove(nearest)
                cached[int(intent)].append(i)
                continue
            served += 1
            label = request["label"]
            if label.startswith("oos:") or requests[nearest]["label"] != label:
                wrong += 1
            else:
                right += 1
                right_at.append(i)
            continue
        if confident:
            cached.setdefault(int(intent), []).append(i)
    return {"captured": right / max(1, opportunity_of(requests)), "served": served, "wrong": wrong, "level": threshold,
            "right_at": right_at}


def head_cost(intents: int = 150, dims: int = 512, reads: int = 20_000) -> float:
    """Microseconds the intent head takes to read one asked question: what the intent rule adds to
    a lookup (the rule itself compares two fields of the KNN row)."""
    import time

    import numpy as np

    from app.cache.storage.intents import HeadMeta, IntentHead

    rng = np.random.default_rng(0)
    meta = HeadMeta(name="bench", tenant="t", category="faq", intents=[f"i{i}" for i in range(intents)],
                    shared=[True] * intents, threshold=0.65, fingerprint="x", phrasings=0, accuracy=0.0,
                    served_share=0.0, held_out_wrong=0.0, error_bound=0.01, rule="", loaded_at=0)
    head = IntentHead(meta, rng.normal(size=(dims, intents)).astype(np.float32), np.zeros(intents, np.float32))
    vector = rng.normal(size=dims).astype(np.float32)
    vector /= np.linalg.norm(vector)
    for _ in range(200):
        head.guess(vector)
    started = time.perf_counter()
    for _ in range(reads):
        head.guess(vector)
    return (time.perf_counter() - started) / reads * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-cost", action="store_true", help="only time the head's reading of one question")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=".run/bench-intents")
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--no-ceiling", action="store_true", help="skip the static replay of each arm's head")
    parser.add_argument("--intent-embedder", default="",
                        help="STRATA_INTENT_EMBEDDER for every arm (.run/models/embeddinggemma-300m): what the heads read")
    args = parser.parse_args(argv)
    env = {**os.environ, "STRATA_INTENT_EMBEDDER": args.intent_embedder} if args.intent_embedder else None
    if args.head_cost:
        print(f"the intent head reads one question in {head_cost():.1f} us (150 intents, 512 dims)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("| arm | team's data | seed | semantic | wrong | captured | intent hits (on probation; wrong) | worst 500 | "
          "OOS served (intent / any) | model calls | its head's static ceiling (wrong); reached | "
          "the same with the guards; reached | with the guards and the out-of-scope check; reached | "
          "the same head's best within 1%, in hindsight; reached |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    losses: dict[str, list[tuple[str, int]]] = {}
    for seed in args.seeds:
        for arm, (stream, team) in build(seed).items():
            if args.only and arm not in args.only:
                continue
            report_path = out / f"{arm}-s{seed}.json"
            if not report_path.exists():
                command = [*STRATA, "replay", "run", "--simulate", "--decisions", "--stream", str(stream), "--category",
                           "faq", "--json", str(report_path)] + (["--intents", str(team)] if team else [])
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                (out / f"{arm}-s{seed}.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
                if done.returncode:
                    print(f"| {arm} | failed: see {out}/{arm}-s{seed}.txt |", file=sys.stderr)
                    continue
            report = msgspec.json.decode(report_path.read_bytes())
            f = figures(report, stream)
            share = f["semantic"] / max(1, f["requests"])
            said = (out / f"{arm}-s{seed}.txt").read_text(encoding="utf-8") if team else ""
            level = serving_confidence(said) if team else None
            ceiling = static_ceiling(team, stream, level, stand_in_reach(said)) \
                if team and level is not None and not args.no_ceiling else None
            of_ceiling = (f"{ceiling['captured']:.2f} at {level:.3f} ({ceiling['wrong'] / max(1, ceiling['served']):.2%}); "
                          f"{f['captured'] / max(1e-9, ceiling['captured']):.0%}") if ceiling else "-"
            best = (f"{ceiling['best_captured']:.2f} at {ceiling['best_level']:.3f} ({ceiling['best_wrong']:.2%}); "
                    f"{f['captured'] / max(1e-9, ceiling['best_captured']):.0%}") if ceiling else "-"
            if ceiling and ceiling["best_captured"] < 0.005:
                best = "no level serves within 1%"
            guarded = (f"{ceiling['guarded_captured']:.2f} ({ceiling['guarded_wrong']:.2%}); "
                       f"{f['captured'] / max(1e-9, ceiling['guarded_captured']):.0%}") if ceiling else "-"
            kept = (f"{ceiling['kept_captured']:.2f} ({ceiling['kept_wrong']:.2%}); "
                    f"{f['captured'] / max(1e-9, ceiling['kept_captured']):.0%}") if ceiling else "-"
            print(f"| {arm} | {team.name if team else 'none'} | {seed} | {share:.1%} | "
                  f"{f['wrong']} ({f['wrong'] / max(1, f['semantic']):.2%}) | {f['captured']:.2f} | {f['intent_hits']} "
                  f"({f['probation_hits']}; {f['intent_wrong']}) | {f['worst_window']:.2%} | "
                  f"{f['oos_by_intent']} / {f['oos_any']} | {f['model_calls']} | {of_ceiling} | {guarded} | {kept} | {best} |",
                  flush=True)
            if ceiling:
                losses[f"{arm} s{seed}"] = lost(report, stream, ceiling["right_at"])
                losses[f"{arm} s{seed} kept"] = lost(report, stream, ceiling["kept_right_at"])
    for arm, where in losses.items():  # item 0: where the pipeline loses what its head reads
        parts: dict[str, int] = {}
        for why, n in where:
            parts[coarse(why)] = parts.get(coarse(why), 0) + n
        of = "with the guards and the out-of-scope check " if arm.endswith(" kept") else ""
        print(f"\n{arm}: of the static head's right hits at its serving confidence {of}the pipeline lost "
              f"{sum(n for _, n in where)}: " + ", ".join(f"{why} {n}" for why, n in sorted(parts.items(), key=lambda t: -t[1])))
        (out / f"{arm.replace(' ', '-')}-lost.txt").write_text("\n".join(f"{n} {why}" for why, n in where), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
