"""Operators' commands on a running cache, straight against its Redis (``redis-cli`` in words):

    strata cache invalidate --all | --category C [--tenant T] | --tenant T | --key K
                            | --question Q --model M [--category C] [--tenant T] [--system S] | --faq NAME
                            | --user U --tenant T [--category C]
    strata cache audit [--count N] [--json]
    strata cache stats [--top N] [--json]
    strata cache inspect KEY | --question Q --model M [--category C] [--tenant T] [--system S] [--json]

They use the service's settings (``STRATA_REDIS_URL``, the policy file) and the same code as
``POST /admin/cache/invalidate``; each invalidation is audited with the operator's login.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
import time
from typing import Any

import msgspec

from app.console import fail, table
from app.settings import Settings


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (cli)"


def cmd_invalidate(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from app.cache.storage.invalidation import Invalidation, InvalidationError, NothingThere, sweep_stale_generations
    from app.cache.storage.version import sweep_stale_versions

    what = Invalidation(category=args.category, tenant=args.tenant, key=args.key, question=args.question,
                        model=args.model, system=args.system, faq=args.faq, user=args.user)
    if what.kind == "everything" and not args.all:
        return fail("say what to invalidate: --all, --category, --tenant, --key, --question, --faq or --user")
    if args.all and what.kind != "everything":
        return fail("--all goes alone")

    async def go() -> tuple[Any, int]:
        from app.assembly import open_cache

        async with open_cache(settings, semantic=what.kind in ("question", "key")) as cache:
            done = await cache.invalidator.invalidate(what, who=_operator())
            swept = 0
            for each in cache.each if done.kind in ("everything", "scope") else ():
                bucket, current = each.bucket, await each.versions.refresh()
                if done.kind == "everything":
                    swept += await sweep_stale_versions(bucket.redis, current, keys=bucket.keys)
                else:
                    swept += await sweep_stale_generations(bucket.redis, current, keys=bucket.keys)
            return done, swept

    try:
        done, swept = asyncio.run(go())
    except InvalidationError as exc:
        return fail(str(exc))
    except NothingThere as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 1
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc}")
    result = {**msgspec.to_builtins(done), "swept": swept}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"invalidated {done.kind} {done.target}: {done.deleted + swept} entries deleted")
    return 0


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    if not 1 <= args.count <= 10_000:
        return fail("--count must be between 1 and 10000")

    async def go() -> list[dict[str, str]]:
        from app.assembly import open_cache

        async with open_cache(settings, semantic=False) as cache:
            return await cache.invalidator.audit(args.count)

    try:
        rows = asyncio.run(go())
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc}")
    if args.json:
        print(json.dumps(rows))
        return 0
    import datetime

    for row in rows:
        row["when"] = datetime.datetime.fromtimestamp(int(row.get("at") or 0), datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    print(table(rows, ["when", "who", "kind", "target", "deleted"]) if rows else "no invalidations recorded")
    return 0


async def collect_stats(buckets: list[tuple[Any, Any, str]], shared: Any, top: int) -> dict[str, Any]:
    """Entries, aliases, curated answers and memory per (category, tenant) of the current
    version, requests by category and outcome over the last hour, and the most-hit questions.

    Args:
        buckets: (Redis, keyspace, current version tag) of each bucket (one on a single Redis).
        shared: The Redis of the usage counts.
        top: Most-hit questions listed.
    """
    from app.cache.storage.keys import FIELD_CATEGORY, FIELD_HITS, FIELD_QUESTION, FIELD_ROOT, FIELD_TENANT
    from app.cache.storage.usage import last_hour

    groups: dict[tuple[str, str], dict[str, int]] = {}
    hits: list[tuple[int, str, str, str]] = []
    scanned = [(redis, prefix) for redis, keys, tag in buckets for prefix in (keys.exact_prefix(tag), keys.semantic_prefix(tag))]
    for redis, prefix in scanned:
        layer = "exact" if prefix.endswith(":exact:") else "semantic"
        keys = [k async for k in redis.scan_iter(match=prefix + "*", count=1000)]
        for start in range(0, len(keys), 500):
            chunk = keys[start:start + 500]
            async with redis.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hmget(key, [FIELD_CATEGORY, FIELD_TENANT, FIELD_ROOT, FIELD_HITS, FIELD_QUESTION])
                    pipe.memory_usage(key, samples=0)
                rows = await pipe.execute()
            for key, (category, tenant, root, hit_count, question), memory in zip(
                    chunk, rows[::2], rows[1::2], strict=True):
                if category is None:
                    continue  # expired meanwhile
                name = key.decode()
                group = groups.setdefault((category.decode(), tenant.decode()), {
                    "exact": 0, "semantic": 0, "aliases": 0, "curated": 0, "memory_bytes": 0})
                group["memory_bytes"] += int(memory or 0)
                if ":faq-" in name:
                    group["curated"] += 1
                elif layer == "semantic" and root is not None and root.decode() != name:
                    group["aliases"] += 1
                else:
                    group[layer] += 1
                if hit_count and int(hit_count) > 0:
                    hits.append((int(hit_count), (question or b"").decode(), layer, name))
    usage = await last_hour(shared)
    by_category: dict[str, dict[str, int]] = {}
    for (category, outcome), count in usage.items():
        by_category.setdefault(category, {})[outcome] = count
    hits.sort(key=lambda h: (-h[0], h[3]))
    return {
        "version": ", ".join(sorted({tag for _, _, tag in buckets})),
        "entries": [{"category": c, "tenant": t, **g} for (c, t), g in sorted(groups.items())],
        "last_hour": [{"category": c, "requests": sum(o.values()), **o} for c, o in sorted(by_category.items())],
        "most_hit": [{"hits": n, "question": q, "layer": layer, "key": k} for n, q, layer, k in hits[:top]],
    }


def _ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    async def go() -> dict[str, Any]:
        from app.assembly import open_cache

        async with open_cache(settings, semantic=False) as cache:
            return await collect_stats([(b.bucket.redis, b.bucket.keys, await b.versions.refresh()) for b in cache.each],
                                       cache.shared, args.top)

    try:
        stats = asyncio.run(go())
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc}")
    if args.json:
        print(json.dumps(stats))
        return 0
    entries = [{**row, "memory": f"{row['memory_bytes'] / 1024:.1f} KiB"} for row in stats["entries"]]
    print(f"cache version {stats['version']}\n")
    print(table(entries, ["category", "tenant", "exact", "semantic", "aliases", "curated", "memory"])
          if entries else "no entries")
    rows = [{**row, "exact hits": _ratio(row.get("exact-hit", 0), row["requests"]),
             "semantic hits": _ratio(row.get("semantic-hit", 0), row["requests"]),
             "misses": _ratio(row.get("miss", 0), row["requests"])} for row in stats["last_hour"]]
    print("\nlast hour")
    print(table(rows, ["category", "requests", "exact hits", "semantic hits", "misses"]) if rows else "no requests")
    print("\nmost hit")
    print(table(stats["most_hit"], ["hits", "layer", "question"]) if stats["most_hit"] else "no hits yet")
    return 0


async def describe_entry(redis: Any, semantic: Any, key: str) -> dict[str, Any]:
    """An entry as an operator wants to read it: fields (no vector), its answer's text, TTL,
    what it learnt (observations, confirmations, wrong_above) and its aliases."""
    from app.cache.storage.keys import FIELD_ANSWER, FIELD_EMBEDDING, FIELD_QUESTION, FIELD_ROOT

    raw = await redis.hgetall(key)
    if not raw:
        raise LookupError(f"no entry {key}")
    fields = {k.decode(): v for k, v in raw.items()}
    answer = fields.pop(FIELD_ANSWER, b"")
    fields.pop(FIELD_EMBEDDING, None)
    text = {k: v.decode(errors="replace") for k, v in fields.items()}
    learnt = {k: int(v) for k, v in text.items() if k.split(":")[0] in ("ok", "wrong", "confirmed")}
    for name in learnt:
        text.pop(name)
    try:
        content = json.loads(answer)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        content = None
    described: dict[str, Any] = {"key": key, "ttl_s": await redis.ttl(key), **text, "answer_text": content,
                                 "observations": learnt}

    root = text.get(FIELD_ROOT)
    if semantic is not None and ":sem:" in key and root:
        from app.cache.storage.invalidation import ENTRY_KEY

        match = ENTRY_KEY.match(key)
        assert match is not None  # checked by the caller
        documents = sorted(await semantic.documents_of(match["tag"], root))
        async with redis.pipeline(transaction=False) as pipe:
            for document in documents:
                pipe.hget(document, FIELD_QUESTION)
            questions = await pipe.execute()
        described["documents"] = [{"key": d, "question": (q or b"").decode(), "entry": d == root}
                                  for d, q in zip(documents, questions, strict=True)]
    return described


def cmd_inspect(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from app.cache.storage.invalidation import ENTRY_KEY, Invalidation, InvalidationError, NothingThere

    if (args.key is None) == (args.question is None):
        return fail("name an entry: a KEY or --question (with --model)")
    if args.key is not None and not ENTRY_KEY.match(args.key):
        return fail(f"not a Strata entry key: {args.key!r}")

    async def go() -> dict[str, Any]:
        from app.assembly import open_cache

        async with open_cache(settings, semantic=True) as cache:
            invalidator = cache.invalidator
            key = args.key
            if key is None:
                what = Invalidation(question=args.question, model=args.model, category=args.category,
                                    tenant=args.tenant, system=args.system)
                invalidator.check(what)
                key = await invalidator.entry_of_question(what)
            home = invalidator.for_key(key)
            return await describe_entry(home.redis, home.semantic, key)

    try:
        described = asyncio.run(go())
    except InvalidationError as exc:
        return fail(str(exc))
    except (NothingThere, LookupError) as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 1
    except (RedisError, OSError) as exc:
        return fail(f"Redis at {settings.redis.shown_url}: {exc}")
    if args.json:
        print(json.dumps(described, ensure_ascii=False))
        return 0
    documents = described.pop("documents", [])
    observations = described.pop("observations")
    for name in ("created_at", "expires_at"):
        value = str(described.get(name, ""))
        if value.isdigit():  # readable beside the Unix seconds Strata stores
            described[name] = f"{value} ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(int(value)))})"
    width = max(len(k) for k in described)
    for name, value in described.items():
        print(f"{name.ljust(width)}  {value}")
    if observations:
        print("\nobservations  " + "  ".join(f"{k}={v}" for k, v in sorted(observations.items())))
    if documents:
        print(f"\ndocuments of this entry ({len(documents)})")
        print(table([{**d, "entry": "entry" if d["entry"] else "alias"} for d in documents], ["entry", "question", "key"]))
    return 0


def register(commands: Any) -> None:
    """Add ``strata cache ...`` to the command's subparsers."""
    cache = commands.add_parser("cache", help="operate the cache: invalidate, audit, stats, inspect")
    steps = cache.add_subparsers(dest="step", required=True)
    invalidate = steps.add_parser("invalidate", help="make entries unreachable at once (audited)")
    invalidate.add_argument("--all", action="store_true", help="everything: bump the version")
    invalidate.add_argument("--category", help="a category (every tenant, or --tenant's)")
    invalidate.add_argument("--tenant", help="a tenant (every category, or --category's)")
    invalidate.add_argument("--key", help="one entry by its Redis key, with its aliases")
    invalidate.add_argument("--question", help="the entry this question would be served (with --model)")
    invalidate.add_argument("--model", help="the model of --question's requests")
    invalidate.add_argument("--system", help="the system prompt of --question's requests")
    invalidate.add_argument("--faq", help="the entries of one `strata faq load` file, by name")
    invalidate.add_argument("--user", help="every answer of one user of --tenant (per-user categories)")
    invalidate.add_argument("--json", action="store_true")
    invalidate.set_defaults(run=cmd_invalidate)
    audit = steps.add_parser("audit", help="the latest invalidations, newest first")
    audit.add_argument("--count", type=int, default=20)
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(run=cmd_audit)
    stats = steps.add_parser("stats", help="entries, aliases and memory by category and tenant; last hour's hits")
    stats.add_argument("--top", type=int, default=10, help="most-hit questions to list")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(run=cmd_stats)
    inspect = steps.add_parser("inspect", help="one entry: fields, answer, TTL, observations, aliases")
    inspect.add_argument("key", nargs="?", help="the entry's Redis key")
    inspect.add_argument("--question", help="the entry this question would be served (with --model)")
    inspect.add_argument("--model")
    inspect.add_argument("--category")
    inspect.add_argument("--tenant")
    inspect.add_argument("--system")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(run=cmd_inspect)
