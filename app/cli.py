"""The ``strata`` command.

    strata calibrate evaluate --pairs FILE.csv [--category NAME] [--every K]
    strata calibrate fit --pairs FILE.csv --target-precision 0.99 [--margin Z] [--category NAME ...] [--plot FILE.png]
    strata calibrate train [--data-dir DIR] [--out schemas/verifier.json]
    strata calibrate qqp-hard --split eval|train --out FILE.csv [--pool N] [--data-dir DIR]
    strata replay build --source clinc|afqmc --out FILE.jsonl [--requests N] [--seed S] [--oos-share X]
    strata replay run --stream FILE (--url URL | --simulate [--faq FILE.yaml]) [--category NAME] [--policy FILE] [--plot FILE.png]
    strata replay faq --out FILE.yaml [--per-intent N] [--category NAME]
    strata faq load FILE.csv|FILE.yaml [--name NAME]
    strata keys [--file KEYS.json] add --tenant NAME [--user ID] [--may-refresh] [--operator] | revoke KEY_ID | list
    strata admin-token ensure|show|rotate [--file PATH]
    strata intents load FILE [--tenant NAME] [--category NAME] [--name NAME] | refit | show | remove
    strata cache invalidate ... | audit ...   (app/ops.py)
    strata top [--url URL]                    (app/top.py)

Settings (embedder, policy file, verifier files) come from the same ``STRATA_*`` environment
variables as the service, so the decisions are the ones the service would make.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from app.calibrate.pairs import QQP_POOL_SIZE
from app.console import fail
from app.replay.streams import CLINC_DOMAINS
from app.settings import DEFAULT_ADMIN_TOKEN_FILE, DEFAULT_KEYS_FILE, PROJECT_ROOT, Settings

if TYPE_CHECKING:  # the CLI imports numpy and the models only when a command needs them
    from app.cache.decision.verify import PairVerifier
    from app.cache.storage.contract import Verdict
    from app.calibrate.pairs import Pair
    from app.embed import Encoder
    from app.policy import Policy, SemanticPolicy
    from app.replay.run import Report

DEFAULT_DATA = PROJECT_ROOT.parent / "shared" / "data"


def _context(settings: Settings) -> tuple[Policy, Encoder, PairVerifier]:
    from app.cache.decision.verify import load_verifier
    from app.embed import load_encoder
    from app.policy import Policy

    options = settings.semantic
    return (Policy.load(settings.resolve(settings.policy_file)), load_encoder(options.embedder, options.embedder_model),
            load_verifier(settings))


async def _judge(pairs: Sequence[Pair], verdicts: list[Verdict], policy: SemanticPolicy,
                 settings: Settings) -> tuple[list[Verdict], list[float]]:
    """Run the judge step over the verdicts through the configured upstream, with the hook the
    service builds (app/lifespan.py)."""
    import msgspec

    from app.cache.decision.verify import CandidateCheck, load_verifier
    from app.cache.readers.judge import LLMJudge
    from app.calibrate.evaluate import judge_all
    from app.upstream import Upstream

    options = settings.semantic
    upstream = Upstream(settings.upstream)
    try:
        model = options.judge_model
        if not model:  # the service asks the model a request names; here, the first one served
            model = msgspec.json.decode(await upstream.models())["data"][0]["id"]
        check = CandidateCheck(load_verifier(settings),
                               confirm=LLMJudge.on_upstream(upstream, options.judge_timeout_s, options.judge_model))
        # `model` stands in for the model a request would name.
        return await judge_all(pairs, verdicts, check, policy, model)
    finally:
        await upstream.close()


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    from app.calibrate.evaluate import evaluate, similarities, verify_all
    from app.calibrate.pairs import PairsFileError, read_pairs
    from app.policy import AdaptiveSemantic, FixedSemantic

    try:
        pairs = read_pairs(Path(args.pairs))
    except PairsFileError as exc:
        return fail(str(exc))
    if args.every < 1:
        return fail("--every must be >= 1")
    pairs = pairs[:: args.every]
    policy, encoder, verifier = _context(settings)
    try:
        category = policy.category(args.category)
    except ValueError as exc:
        return fail(str(exc))
    started = time.perf_counter()
    sims = similarities(pairs, encoder)
    rules = category.semantic
    verdicts = verify_all(pairs, sims, verifier, rules)
    judge_line = None
    if rules.judge_before_serving:
        from app.errors import StrataError

        try:
            verdicts, latencies = asyncio.run(_judge(pairs, verdicts, rules, settings))
        except (StrataError, KeyError, IndexError, ValueError) as exc:
            return fail(f"category {category.name!r} uses the LLM judge, but the upstream at "
                         f"{settings.upstream.url} cannot name a model: {exc}")
        if latencies:
            ms = sorted(1000 * s for s in latencies)
            judge_line = (f"LLM judge: {len(ms)} calls, latency p50 {ms[len(ms) // 2]:.0f} ms, "
                          f"p95 {ms[min(len(ms) - 1, int(len(ms) * 0.95))]:.0f} ms")
        else:
            judge_line = "LLM judge: no candidate reached it"
    result, reasons = evaluate(pairs, verdicts)
    elapsed = time.perf_counter() - started
    print(f"pairs file: {args.pairs}")
    fixed = (f", min_probability {rules.min_probability}, judge {rules.judge}"
             if isinstance(rules, FixedSemantic) else f", error_bound {rules.error_bound}")
    print(f"category: {category.name} (threshold {rules.threshold}, accept_above {rules.accept_above}{fixed}); "
          f"embedder: {encoder.name}")
    if judge_line:
        print(judge_line)
    if isinstance(rules, AdaptiveSemantic):
        print(f"adaptive category (error bound {rules.error_bound}): pairs show its cold start, the guards and "
              f"accept_above {rules.accept_above}; what it learns from traffic shows in `strata replay`")
    print("decisions by reason: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))
    print(f"took {elapsed:.1f} s")
    print(result.line())
    return 0


def cmd_fit(args: argparse.Namespace, settings: Settings) -> int:
    from app.calibrate.evaluate import similarities
    from app.calibrate.fit import cosine_only_recall, fit, tabulate
    from app.calibrate.pairs import PairsFileError, read_pairs
    from app.calibrate.plot import plot

    if not 0.0 < args.target_precision <= 1.0:
        return fail("--target-precision must be in (0, 1]")
    try:
        pairs = read_pairs(Path(args.pairs))
    except PairsFileError as exc:
        return fail(str(exc))
    policy, encoder, verifier = _context(settings)
    categories = args.category or sorted(policy.categories)
    unknown = [c for c in categories if c not in policy.categories]
    if unknown:
        return fail(f"unknown category {unknown[0]!r}; known: {', '.join(sorted(policy.categories))}")
    if args.margin < 0:
        return fail("--margin must be >= 0")
    table = tabulate(pairs, similarities(pairs, encoder), verifier)
    margins = {0.0: "best threshold"} | ({args.margin: f"margin {args.margin:g}"} if args.margin else {})
    for margin, label in margins.items():
        cosine_recall, cosine_threshold = cosine_only_recall(table, args.target_precision, margin=margin)
        where = f"threshold {cosine_threshold:.3f}" if cosine_threshold is not None else "no threshold reaches it"
        print(f"cosine alone at precision >= {args.target_precision} ({label}): recall {cosine_recall:.4f} ({where})")
    best = fit(table, args.target_precision, margin=args.margin)
    if best is None:
        print(f"no policy reaches precision {args.target_precision} (margin {args.margin:g}) with at least 20 hits "
              f"on {args.pairs}")
        print("recommendation: keep the semantic layer off for these categories (semantic.enabled: false)")
        return 0
    chosen, result = best
    print(f"guards + verifier: {result.line()}")
    print("recommended policy (schemas/policy.yaml):")
    for name in categories:
        print(f"  {name}:\n    semantic: {{enabled: true, threshold: {chosen.threshold:.2f}, "
              f"accept_above: {chosen.accept_above:.3f}, min_probability: {chosen.min_probability:.3f}}}")
    plot(table, chosen, Path(args.plot), f"{Path(args.pairs).name}: target precision {args.target_precision}",
         args.target_precision)
    print(f"precision-recall plot: {args.plot}")
    return 0


def cmd_train(args: argparse.Namespace, settings: Settings) -> int:
    import msgspec

    from app.cache.decision.verify import load_verifier
    from app.calibrate.evaluate import similarities
    from app.calibrate.pairs import read_pairs, split_pairs, write_pairs
    from app.calibrate.qqp import qqp_hard
    from app.calibrate.train import train
    from app.embed import load_encoder

    data = Path(args.data_dir)
    afqmc_file, qqp_file = data / "afqmc_train.csv", data / "qqp_similar.json"
    for needed in (afqmc_file, qqp_file):
        if not needed.exists():
            return fail(f"training data not found: {needed}")
    encoder = load_encoder(settings.semantic.embedder, settings.semantic.embedder_model)
    untrained = msgspec.structs.replace(settings.semantic, verifier_artifact="")
    verifier = load_verifier(msgspec.structs.replace(settings, semantic=untrained))
    afqmc_fit, afqmc_calibration = split_pairs(read_pairs(afqmc_file), args.held_out)
    qqp_fit, qqp_calibration = split_pairs(qqp_hard(qqp_file, "train"), args.held_out)
    calibration_dir = PROJECT_ROOT / ".run" / "calibration"
    write_pairs(afqmc_calibration, calibration_dir / "afqmc_train_heldout.csv")
    write_pairs(qqp_calibration, calibration_dir / "qqp_hard_train_heldout.csv")
    sources = {"afqmc_train": afqmc_fit, "qqp_hard_train": qqp_fit}
    print(f"training on {len(afqmc_fit)} AFQMC train pairs and {len(qqp_fit)} QQP-hard train pairs; "
          f"held out for fitting the policy: {len(afqmc_calibration)} + {len(qqp_calibration)} in {calibration_dir}")
    sims = {name: similarities(pairs, encoder) for name, pairs in sources.items()}
    artifact = train(sources, sims, verifier, "make train-verifier",
                     {"afqmc_train": afqmc_file, "qqp_hard_train": qqp_file}, encoder.name)
    Path(args.out).write_bytes(msgspec.json.format(msgspec.json.encode(artifact), indent=1))
    trees = len(artifact.model.value)
    print(f"wrote {args.out} ({trees} trees, {Path(args.out).stat().st_size // 1024} KiB)")
    return 0


def cmd_qqp_hard(args: argparse.Namespace, settings: Settings) -> int:
    from app.calibrate.pairs import write_pairs
    from app.calibrate.qqp import qqp_hard

    source = Path(args.data_dir) / "qqp_similar.json"
    if not source.exists():
        return fail(f"not found: {source}")
    pairs = qqp_hard(source, args.split, args.pool)
    write_pairs(pairs, Path(args.out))
    print(f"wrote {len(pairs)} pairs ({sum(p.label for p in pairs)} positives) to {args.out}")
    return 0


def cmd_replay_build(args: argparse.Namespace, settings: Settings) -> int:
    from app.replay.streams import StreamFileError, clinc_stream, faqset_stream, pairs_stream, write_stream

    if args.source == "faqset":
        if not args.file:
            return fail("--source faqset needs --file (a FAQ set such as bench/data/zh_shop_bank_faq.yaml)")
        try:
            stream = faqset_stream(Path(args.file), args.requests, args.seed, args.held)
        except StreamFileError as exc:
            return fail(str(exc))
        write_stream(stream, Path(args.out))
        print(f"wrote {len(stream)} requests ({len({r.label for r in stream})} labels) to {args.out}")
        return 0
    source = Path(args.data_dir) / ("clinc150.csv" if args.source == "clinc" else "afqmc_train.csv")
    if not source.exists():
        return fail(f"not found: {source}")
    if args.source == "clinc":
        stream = clinc_stream(source, args.requests, args.seed, args.oos_share, args.intents, domain=args.domain,
                              splits=tuple(args.split.split(",")) if args.split else ())
    else:
        stream = pairs_stream(source, args.requests, args.seed)
    write_stream(stream, Path(args.out))
    print(f"wrote {len(stream)} requests ({len({r.label for r in stream})} labels) to {args.out}")
    return 0


def cmd_replay_intents(args: argparse.Namespace, settings: Settings) -> int:
    """A team's intents file from CLINC150's train split or a FAQ set: CSV text,intent, or with
    ``--out`` ending in .yaml, each intent's phrasings and its answer (a FAQ as intents)."""
    import csv

    import yaml

    from app.replay.streams import StreamFileError, intents_with_answers, team_intents

    source = Path(args.file) if args.source == "faqset" else Path(args.data_dir) / "clinc150.csv"
    if args.source == "faqset" and not args.file:
        return fail("--source faqset needs --file")
    try:
        rows = team_intents(args.source, source, args.per_intent, args.seed, args.domain, args.intents,
                            out_of_scope=args.out_of_scope)
    except (StreamFileError, OSError) as exc:
        return fail(str(exc))
    if Path(args.out).suffix.lower() in (".yaml", ".yml"):
        Path(args.out).write_text(yaml.safe_dump(intents_with_answers(rows), allow_unicode=True, sort_keys=False),
                                  encoding="utf-8")
        print(f"wrote {len(rows)} phrasings of {len({i for _, i in rows})} intents, the shared ones with their answer, to {args.out}")
        return 0
    with Path(args.out).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "intent"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} phrasings of {len({i for _, i in rows})} intents to {args.out}")
    return 0


def cmd_replay_faq(args: argparse.Namespace, settings: Settings) -> int:
    import yaml

    from app.replay.streams import StreamFileError, clinc_faq, faqset_faq

    if args.source == "faqset":
        if not args.file:
            return fail("--source faqset needs --file")
        try:
            items = faqset_faq(Path(args.file), args.per_intent, args.category)
        except StreamFileError as exc:
            return fail(str(exc))
    else:
        source = Path(args.data_dir) / "clinc150.csv"
        if not source.exists():
            return fail(f"not found: {source}")
        items = clinc_faq(source, args.per_intent, args.seed, args.category)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(items, allow_unicode=True, sort_keys=False), encoding="utf-8")
    variants = sum(len(cast("list[str]", i["variants"])) for i in items)
    print(f"wrote {len(items)} curated answers ({variants} variants) to {out}")
    return 0


def cmd_replay_run(args: argparse.Namespace, settings: Settings) -> int:
    import httpx

    from app.policy import Policy
    from app.replay.run import plot, replay
    from app.replay.streams import StreamFileError, read_stream

    try:
        stream = read_stream(Path(args.stream))
    except StreamFileError as exc:
        return fail(str(exc))
    if args.policy:
        settings = _replace(settings, policy_file=str(Path(args.policy).resolve()))
    try:
        categories = Policy.load(settings.resolve(settings.policy_file)).categories
    except ValueError as exc:
        return fail(str(exc))
    if not 0.0 <= args.feedback <= 1.0:
        return fail("--feedback is a share, from 0 to 1")
    if not 0.0 <= args.judge_error <= 1.0:
        return fail("--judge-error is a share, from 0 to 1")
    if args.judge_error and not args.judge:
        args.judge = "oracle"  # the error is the oracle's
    if args.judge and not args.simulate:
        return fail("--judge goes with --simulate; a running Strata reads with STRATA_JUDGE_URL")
    if args.review and (not args.simulate or not 0 < args.review <= 1000):
        return fail("--review goes with --simulate: the queue items settled per 1,000 requests (1 to 1000)")
    if args.category not in categories:
        return fail(f"unknown category {args.category!r}; known: {', '.join(sorted(categories))}")
    started = time.perf_counter()
    faq = None
    if args.faq:
        if not args.simulate:
            return fail("--faq goes with --simulate; against a running Strata use `strata faq load` first")
        from app.faq import FaqFileError, read_faq

        try:
            faq = read_faq(Path(args.faq), Policy.load(settings.resolve(settings.policy_file)))
        except (FaqFileError, ValueError) as exc:
            return fail(str(exc))
    intents = None
    if args.intents:
        from app.intents import IntentsFileError, read_intents

        try:
            intents = read_intents(Path(args.intents))
        except IntentsFileError as exc:
            return fail(str(exc))
        if not args.simulate:
            # A running Strata: load the team's file into its Redis first (the service's settings).
            code = cmd_intents(argparse.Namespace(action="load", file=args.intents, name="replay", seed=0, tenant=None,
                                                  category=args.category), settings)
            if code:
                return code
    if args.simulate:
        from app.replay.simulate import run_simulated

        report = run_simulated(stream, settings=settings, category=args.category, faq=faq, feedback=args.feedback,
                               judge=args.judge, judge_error=args.judge_error, review=args.review, intents=intents,
                               decisions=args.decisions)
        where = "simulated (own Redis Stack, labelled upstream, in-process Strata)"
    else:
        async def go() -> Report:
            async with httpx.AsyncClient(base_url=args.url, timeout=300) as client:
                settle = (lambda: reads_settled(client)) if args.settle else None
                return await replay(stream, client, model=args.model, category=args.category, feedback=args.feedback,
                                    after_each=settle)

        try:
            report = asyncio.run(go())
        except httpx.HTTPError as exc:
            return fail(f"cannot reach Strata at {args.url}: {exc}")
        where = args.url
    print(f"stream: {args.stream}; against: {where}; category: {args.category}; took {time.perf_counter() - started:.0f} s")
    print(report.summary(args.window))
    if args.json:
        Path(args.json).write_bytes(report.to_json(args.window))
    if args.plot:
        plot(report, args.window, Path(args.plot), f"{Path(args.stream).name}: {args.category}")
        print(f"learning curve: {args.plot}")
    return 0


SETTLE_TIMEOUT_S = 60.0


async def reads_settled(client: Any) -> None:
    """Wait until the reader's reads after the response are done (``strata_judge_pending`` 0 on
    /metrics), at most ``SETTLE_TIMEOUT_S``."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        pending = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("strata_judge_pending")]
        if not any(pending):
            return
        await asyncio.sleep(0.05)


def cli_operator() -> str:
    """Who the audit log names for a change made from this command line."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"


async def audited(cache: object, kind: str, target: str, request: dict[str, object], *, deleted: int = 0) -> None:
    """Record a change made from the command line in the audit log, as the console records its own."""
    from app.assembly import CacheParts
    from app.cache.storage.invalidation import Invalidated

    assert isinstance(cache, CacheParts)
    await cache.invalidator.audit_log.record_event(who=cli_operator(), done=Invalidated(kind=kind, target=target,
                                                                                          deleted=deleted),
                                                   request=request)


def cmd_faq_load(args: argparse.Namespace, settings: Settings) -> int:

    from app.cache.storage.keys import FAQ_SET_NAME
    from app.faq import FaqFileError, read_faq
    from app.policy import Policy

    path = Path(args.file)
    name = args.name or path.stem
    if not FAQ_SET_NAME.match(name):
        return fail(f"--name {name!r} must match {FAQ_SET_NAME.pattern}")
    try:
        policy = Policy.load(settings.resolve(settings.policy_file))
        items = read_faq(path, policy)
    except (FaqFileError, ValueError) as exc:
        return fail(str(exc))

    if not settings.semantic.enabled:
        return fail("curated answers are served by the semantic layer, which is off (STRATA_SEMANTIC_ENABLED=false)")

    from app.faq import FaqLoaded

    async def go() -> FaqLoaded:
        from app.assembly import open_cache, reconcile
        from app.curated import CuratedAnswers

        async with open_cache(settings, semantic=True) as cache:
            for each in cache.each:
                await reconcile(each.bucket.redis, each.versions, each.semantic)
            loaded = await CuratedAnswers(cache, policy).load(items, name)
            await audited(cache, "curated", f"load {name}", {"file": str(path), "entries": loaded.entries,
                                                             "replaced": loaded.replaced}, deleted=loaded.keys_removed)
            return loaded

    from redis.exceptions import RedisError

    try:
        loaded = asyncio.run(go())
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc}")
    print(f"loaded {loaded.entries} curated answers and {loaded.variants} variants from {path} as {name!r} "
          f"(cache version {loaded.tags}); {loaded.replaced} model answers to the same questions removed "
          f"({loaded.keys_removed} keys, exact and semantic)")
    return 0


def _replace(settings: Settings, **changes: object) -> Settings:
    import msgspec

    return msgspec.structs.replace(settings, **changes)


def _keys_path(args: argparse.Namespace, settings: Settings) -> Path:
    if args.file:
        return Path(args.file)
    return settings.resolve(settings.keys_file or DEFAULT_KEYS_FILE)


def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    from app.auth import add_key, read_keys, revoke_key

    path = _keys_path(args, settings)
    try:
        if args.action == "add":
            existed = path.exists()
            key, record = add_key(path, args.tenant, user=args.user, may_refresh=args.may_refresh, operator=args.operator)
            whose = f"user {record.user!r} of tenant {record.tenant!r}" if record.user else f"tenant {record.tenant!r}"
            whose += " (operator: signs in to /console)" if record.operator else ""
            print(f"key id {record.id} for {whose} (shown once, store it now):")
            print(key)
            print(f"kept (hashed) in {path}", file=sys.stderr)
            if not settings.keys_file and not existed:
                print(f"keys are not checked yet: Strata checks them when started with STRATA_KEYS_FILE={path} "
                      "(`make strata-stop up` does so once this file exists). From then on every API request "
                      "needs a key (Authorization: Bearer sk-strata-...): requests without one are refused with 401, "
                      "and each key's tenant shares nothing with another.", file=sys.stderr)
        elif args.action == "revoke":
            if not revoke_key(path, args.key_id):
                return fail(f"no active key with id {args.key_id!r} in {path}")
            print(f"revoked {args.key_id} (a running Strata refuses it within a second; its console sessions end)")
        else:
            for record in read_keys(path).keys:
                state = "revoked" if record.revoked else "active"
                print(f"{record.id}\t{state}\t{record.tenant}\t{record.user or '-'}\t"
                      f"{'may-refresh' if record.may_refresh else '-'}\t{'operator' if record.operator else '-'}\t"
                      f"{time.strftime('%Y-%m-%d', time.gmtime(record.created_at))}")
    except ValueError as exc:
        return fail(str(exc))
    return 0


def cmd_export_reader(args: argparse.Namespace, settings: Settings) -> int:
    """``strata intents export-reader``: all-MiniLM-L6-v2 as an ONNX folder (app/cache/readers/onnx_vectors.py)."""
    try:
        from app.cache.readers.onnx_vectors import export_minilm

        out = export_minilm(settings.resolve(args.out), int8=not args.fp32)
    except ImportError as exc:
        return fail(f"exporting needs torch, transformers and onnx (make deps installs them): {exc}")
    print(f"wrote {out} ({'float32' if args.fp32 else 'int8'}); the heads of English files read it as "
          f"STRATA_INTENT_READER_EN={args.out} (the default folder: .run/models/minilm-l6-onnx-int8), "
          f"every head as STRATA_INTENT_EMBEDDER={args.out}")
    return 0


def cmd_intents(args: argparse.Namespace, settings: Settings) -> int:
    """``strata intents load|show|remove``: a team's intents (app/intents.py)."""
    import msgspec
    from redis.exceptions import RedisError

    from app.auth import DEFAULT_TENANT
    from app.intents import IntentsFileError, load_intents, read_intents
    from app.policy import Policy

    tenant, category = args.tenant or DEFAULT_TENANT, args.category
    try:
        policy = Policy.load(settings.resolve(settings.policy_file))
    except ValueError as exc:
        return fail(str(exc))
    if category not in policy.categories:
        return fail(f"unknown category {category!r}; known: {', '.join(sorted(policy.categories))}")
    items = None
    if args.action in ("load", "refit") and not settings.semantic.enabled:
        return fail("intents serve the semantic layer, which is off (STRATA_SEMANTIC_ENABLED=false)")
    if args.action == "load":
        path = Path(args.file)
        name = args.name or path.stem
        try:
            items = read_intents(path)
        except IntentsFileError as exc:
            return fail(str(exc))
        if not settings.semantic.enabled:
            return fail("intents serve the semantic layer, which is off (STRATA_SEMANTIC_ENABLED=false)")

    if args.action in ("load", "refit") and "STRATA_INTENT_EMBEDDER_THREADS" not in os.environ:
        # A load embeds every phrasing once: the machine's cores, not a worker's one thread
        # (CLINC150's 15,000 here: 97 s with one, 77 s with two).
        settings = msgspec.structs.replace(settings, semantic=msgspec.structs.replace(
            settings.semantic, intent_embedder_threads=os.cpu_count() or 1))

    async def go() -> str:
        from app.assembly import open_cache, reconcile
        from app.cache.storage.intents import IntentStore

        async with open_cache(settings, semantic=args.action in ("load", "refit")) as cache:
            if cache.shared is None:
                raise IntentsFileError("Redis did not answer")
            store = IntentStore(cache.shared)
            scope = {"tenant": tenant, "category": category}
            if args.action == "load":
                assert items is not None
                for each in cache.each:
                    await reconcile(each.bucket.redis, each.versions, each.semantic)
                loaded = await load_intents(cache, policy, items, tenant=tenant, category=category, name=name,
                                            seed=args.seed)
                await audited(cache, "intents", f"load {name} {category} {tenant}", {**scope, "file": str(path)})
                return loaded.line()
            if args.action == "refit":
                from app.intents import refit_intents

                for each in cache.each:
                    await reconcile(each.bucket.redis, each.versions, each.semantic)
                refit = await refit_intents(cache, policy, tenant=tenant, category=category)
                await audited(cache, "intents", f"refit {category} {tenant}", scope)
                return f"refit with {refit.approvals} approved pairs of the review queue: {refit.loaded.line()}"
            if args.action == "remove":
                if not await store.remove(category, tenant):
                    raise IntentsFileError(f"no intents loaded for tenant {tenant!r} in {category!r}")
                await audited(cache, "intents", f"remove {category} {tenant}", scope)
                return f"removed the intents of tenant {tenant!r} in {category!r} (served nowhere within seconds)"
            head = await store.get(category, tenant)
            if head is None:
                raise IntentsFileError(f"no intents loaded for tenant {tenant!r} in {category!r}")
            m = head.meta
            return "\n".join([
                f"{m.name!r} for tenant {m.tenant!r} in {m.category!r}, loaded "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(m.loaded_at))}, embedder {m.fingerprint}",
                f"{m.in_scope_intents} intents, {m.in_scope_phrasings} phrasings"
                f"{f' (and {m.phrasings - m.in_scope_phrasings} out of scope)' if m.phrasings > m.in_scope_phrasings else ''}; "
                f"cross-validated accuracy {m.accuracy:.1%}",
                f"rule: {m.rule}",
                f"held out: {m.served_share:.1%} of the phrasings served, {m.held_out_wrong:.2%} of them wrong",
                "not shared (never served by the head): " + (", ".join(i for i, shared in zip(m.intents, m.shared, strict=True)
                                                                       if not shared) or "none")])

    try:
        print(asyncio.run(go()))
    except IntentsFileError as exc:
        return fail(str(exc))
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc} (the intents in force are unchanged)")
    return 0


def cmd_admin_token(args: argparse.Namespace, settings: Settings) -> int:
    """The console's admin token file: made if missing (``make up``), shown, or rotated."""
    from app.auth import new_admin_token

    if settings.admin_token:
        return fail("STRATA_ADMIN_TOKEN is set: the token is that variable's, not a file's")
    path = Path(args.file) if args.file else settings.resolve(settings.admin_token_file or DEFAULT_ADMIN_TOKEN_FILE)
    try:
        token, written = new_admin_token(path, rotate=args.action == "rotate")
    except OSError as exc:
        return fail(f"{path}: {exc}")
    if args.action == "show":
        print(token)
    elif args.action == "rotate":
        print(f"rotated: {path} holds a new token; a Strata reading it ends every admin session within a second")
    elif written:
        print(f"console: admin token written to {path} (0600)")
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="strata", description="Strata command line.")
    commands = root.add_subparsers(dest="command", required=True)
    calibrate = commands.add_parser("calibrate", help="measure and tune the semantic layer on labelled pairs")
    steps = calibrate.add_subparsers(dest="step", required=True)

    evaluate = steps.add_parser("evaluate", help="precision and recall of the service's decisions on a pairs file")
    evaluate.add_argument("--pairs", required=True, help="CSV with header sentence1,sentence2,label")
    evaluate.add_argument("--category", default=None, help="policy category (default: the policy's default)")
    evaluate.add_argument("--every", type=int, default=1,
                          help="score every K-th pair only, a deterministic sample (the LLM judge is slow)")
    evaluate.set_defaults(run=cmd_evaluate)

    fit_step = steps.add_parser("fit", help="recommend thresholds for a target precision, and plot the trade-off")
    fit_step.add_argument("--pairs", required=True)
    fit_step.add_argument("--target-precision", type=float, required=True)
    fit_step.add_argument("--category", action="append", help="category to recommend for (repeatable; default all)")
    fit_step.add_argument("--margin", type=float, default=1.0,
                          help="standard errors the Wilson lower bound of precision keeps below the point "
                               "estimate (0: point precision)")
    fit_step.add_argument("--plot", default="calibration.png", help="PNG to write")
    fit_step.set_defaults(run=cmd_fit)

    train_step = steps.add_parser("train", help="train the learned verifier (make train-verifier)")
    train_step.add_argument("--data-dir", default=str(DEFAULT_DATA))
    train_step.add_argument("--out", default=str(PROJECT_ROOT / "schemas" / "verifier.json"))
    train_step.add_argument("--held-out", type=int, default=20, help="percent of each source kept out for fitting")
    train_step.set_defaults(run=cmd_train)

    qqp = steps.add_parser("qqp-hard", help="write the deterministic QQP pairs with hard negatives")
    qqp.add_argument("--split", choices=("train", "eval"), default="eval")
    qqp.add_argument("--out", required=True)
    qqp.add_argument("--pool", type=int, default=QQP_POOL_SIZE,
                     help="pairs per pool in which negatives are searched; 0 for the whole split (harsher)")
    qqp.add_argument("--data-dir", default=str(DEFAULT_DATA))
    qqp.set_defaults(run=cmd_qqp_hard)

    replay_cmd = commands.add_parser("replay", help="replay a labelled traffic stream against Strata")
    replay_steps = replay_cmd.add_subparsers(dest="step", required=True)
    build = replay_steps.add_parser("build", help="write a seeded stream from ../shared/data")
    build.add_argument("--source", choices=("clinc", "afqmc", "faqset"), default="clinc")
    build.add_argument("--file", help="with --source faqset: the FAQ set (bench/data/zh_shop_bank_faq.yaml)")
    build.add_argument("--held", type=int, default=0,
                       help="with --source faqset: wordings per label left to the curated file (strata replay faq)")
    build.add_argument("--out", required=True, help="JSONL file to write")
    build.add_argument("--requests", type=int, default=3000)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--oos-share", type=float, default=0.0, help="share of out-of-scope CLINC queries (each its own label)")
    build.add_argument("--intents", type=int, default=0, help="keep only the first N CLINC intents (0: all)")
    build.add_argument("--domain", choices=sorted(CLINC_DOMAINS), default="",
                       help="keep only one CLINC domain's intents (bank: banking and credit cards, 30 intents)")
    build.add_argument("--data-dir", default=str(DEFAULT_DATA))
    build.add_argument("--split", default="", help="CLINC150 splits to draw in-scope questions from (test; default: all), "
                                                   "out-of-scope ones from oos_<split>")
    build.set_defaults(run=cmd_replay_build)
    run_step = replay_steps.add_parser("run", help="send a stream and report hits by layer, wrong hits, learning curve")
    run_step.add_argument("--stream", required=True, help="JSONL ({text, label} per line) or CSV (text,label)")
    target = run_step.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running Strata, e.g. http://127.0.0.1:8080")
    target.add_argument("--simulate", action="store_true",
                        help="in process: own Redis Stack, an upstream answering one answer per label")
    run_step.add_argument("--category", default="faq")
    run_step.add_argument("--model", default="SmolLM2-135M-Instruct", help="model to name (with --url)")
    run_step.add_argument("--policy", help="policy file instead of STRATA_POLICY_FILE")
    run_step.add_argument("--window", type=int, default=500)
    run_step.add_argument("--plot", help="PNG of the learning curve (needs the calibrate extra)")
    run_step.add_argument("--json", help="write the report as JSON")
    run_step.add_argument("--faq", help="with --simulate: a curated-answer file to load first (strata replay faq)")
    run_step.add_argument("--intents", help="a team's intents file to load first (strata intents load; strata replay intents)")
    run_step.add_argument("--feedback", type=float, default=0.0, metavar="RATE",
                          help="share of wrong semantic hits the asker reports with POST /v1/feedback (0 to 1)")
    run_step.add_argument("--judge", choices=("oracle",), default="",
                          help="with --simulate: the grey zone's reader answers from the stream's labels")
    run_step.add_argument("--judge-error", type=float, default=0.0, metavar="P",
                          help="with --simulate: the oracle judge is wrong on this share of the pairs it reads")
    run_step.add_argument("--review", type=int, default=0, metavar="N",
                          help="with --simulate: a reviewer settles the N most asked review-queue items per 1,000 "
                               "requests, knowing the stream's labels (the console's review queue)")
    run_step.add_argument("--decisions", action="store_true",
                          help="with --simulate: keep each request's decision (the rule and verdict of its semantic "
                               "lookup, from its trace) in the JSON report")
    run_step.add_argument("--settle", action="store_true",
                          help="with --url: after each request, wait until strata_judge_pending on /metrics is 0")
    run_step.set_defaults(run=cmd_replay_run)
    intents_step = replay_steps.add_parser("intents", help="write a team's intents file (CSV text,intent) for replays")
    intents_step.add_argument("--source", choices=("clinc", "faqset"), default="clinc")
    intents_step.add_argument("--file", help="with --source faqset: the FAQ set")
    intents_step.add_argument("--per-intent", type=int, default=0, help="phrasings per intent (0: the whole train split)")
    intents_step.add_argument("--domain", choices=sorted(CLINC_DOMAINS), default="")
    intents_step.add_argument("--intents", type=int, default=0,
                              help="keep only the first N CLINC intents, as `replay build --intents` (0: all)")
    intents_step.add_argument("--out-of-scope", action="store_true",
                              help="CLINC150's oos_train questions too, labelled out_of_scope")
    intents_step.add_argument("--seed", type=int, default=0)
    intents_step.add_argument("--data-dir", default=str(DEFAULT_DATA))
    intents_step.add_argument("--out", required=True, help="CSV text,intent; .yaml: phrasings and an answer per intent")
    intents_step.set_defaults(run=cmd_replay_intents)

    faq_step = replay_steps.add_parser("faq", help="write a curated-answer file of CLINC150 train utterances for replays")
    faq_step.add_argument("--out", required=True, help="YAML file to write")
    faq_step.add_argument("--per-intent", type=int, default=10, help="utterances per intent: a question and its variants")
    faq_step.add_argument("--source", choices=("clinc", "faqset"), default="clinc")
    faq_step.add_argument("--file", help="with --source faqset: the FAQ set")
    faq_step.add_argument("--category", default="faq")
    faq_step.add_argument("--seed", type=int, default=0)
    faq_step.add_argument("--data-dir", default=str(DEFAULT_DATA))
    faq_step.set_defaults(run=cmd_replay_faq)

    faq = commands.add_parser("faq", help="curated answers in the semantic layer")
    faq_steps = faq.add_subparsers(dest="step", required=True)
    faq_load = faq_steps.add_parser("load", help="load (or reload, replacing) a CSV or YAML file of curated answers")
    faq_load.add_argument("file", help="CSV (category,tenant,question,variants,answer; variants split by |) or YAML list")
    faq_load.add_argument("--name", help="the name its entries are kept under (default: the file's stem)")
    faq_load.set_defaults(run=cmd_faq_load)

    keys = commands.add_parser("keys", help="API keys of tenants (stored as salted hashes)")
    keys.add_argument("--file", help=f"keys file (default: STRATA_KEYS_FILE, else {DEFAULT_KEYS_FILE})")
    actions = keys.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="create a key for a tenant and print it once")
    add.add_argument("--tenant", required=True)
    add.add_argument("--user", help="a key of one user: the identity of per-user categories (scope: user)")
    add.add_argument("--may-refresh", action="store_true",
                     help="Cache-Control: no-cache from this key rewrites the tenant's shared entries")
    add.add_argument("--operator", action="store_true",
                     help="a tenant operator's key: signs in to the console (/console) for this tenant only")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    actions.add_parser("list", help="key ids, state and tenants (never the keys)")
    keys.set_defaults(run=cmd_keys)

    intents = commands.add_parser("intents", help="a team's intents: labelled phrasings that make semantic hits safe")
    intents_steps = intents.add_subparsers(dest="action", required=True)
    for action, text in (("load", "fit, calibrate and serve a file of labelled phrasings (CSV text,intent or YAML)"),
                         ("refit", "fit and calibrate again with the review queue's approvals folded in"),
                         ("show", "what is loaded for a tenant and category"), ("remove", "stop serving them")):
        step = intents_steps.add_parser(action, help=text)
        if action == "load":
            step.add_argument("file", help="CSV with the header text,intent, or a YAML list of {intent, phrasings, answer?, shared?}")
            step.add_argument("--name", help="the load's name (default: the file's stem)")
            step.add_argument("--seed", type=int, default=0, help="the folds' seed")
        step.add_argument("--tenant", help="default: the tenant of requests sent without a key")
        step.add_argument("--category", default="faq", help="an adaptive category (default: faq)")
        step.set_defaults(run=cmd_intents)
    export = intents_steps.add_parser("export-reader", help="write all-MiniLM-L6-v2 as an ONNX reader for English heads "
                                                            "(STRATA_INTENT_READER_EN; make up does)")
    export.add_argument("--out", default=".run/models/minilm-l6-onnx-int8", help="the folder to write")
    export.add_argument("--fp32", action="store_true", help="keep the weights in float32 (no int8 quantisation)")
    export.set_defaults(run=cmd_export_reader)

    admin_token = commands.add_parser("admin-token", help="the console's admin token file (make up makes it)")
    admin_token.add_argument("action", choices=["ensure", "show", "rotate"],
                             help="ensure: make it if missing; show: print it; rotate: write a new one")
    admin_token.add_argument("--file", help=f"default: STRATA_ADMIN_TOKEN_FILE, else {DEFAULT_ADMIN_TOKEN_FILE}")
    admin_token.set_defaults(run=cmd_admin_token)
    from app import ops, top

    ops.register(commands)
    top.register(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        return fail(str(exc))
    # Every command that writes a file (--out) makes its folder first, or says why it cannot.
    out = getattr(args, "out", None)
    if out:
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return fail(f"cannot write --out {out}: cannot make its folder {Path(out).parent} ({exc.strerror or exc})")
    try:
        return int(args.run(args, settings))
    except (IsADirectoryError, PermissionError) as exc:
        if out and exc.filename is not None and Path(str(exc.filename)) == Path(out):
            return fail(f"cannot write --out {out}: {exc.strerror}")
        raise


if __name__ == "__main__":
    sys.exit(main())
