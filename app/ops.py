"""Operators' commands on a running cache, straight against its Redis (``redis-cli`` in words):

    strata cache invalidate --all | --category C [--tenant T] | --tenant T | --key K
                            | --question Q --model M [--category C] [--tenant T] [--system S] | --faq NAME
    strata cache audit [--count N] [--json]

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
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from app.settings import Settings


def _fail(message: str) -> int:
    print(f"strata: {message}", file=sys.stderr)
    return 2


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (cli)"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (the default output of the cache commands)."""
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


@asynccontextmanager
async def _invalidator(settings: Settings, *, with_semantic: bool) -> AsyncIterator[Any]:
    from app.cache.invalidation import CacheInvalidator
    from app.cache.version import ScopeGenerations, VersionTag
    from app.lifespan import connect_redis
    from app.policy import Policy

    policy = Policy.load(settings.resolve(settings.policy_file))
    redis = connect_redis(msgspec.structs.replace(settings.redis, timeout_s=10.0))
    embedder = semantic = None
    try:
        if with_semantic and settings.semantic.enabled:
            from app.cache.semantic import SemanticCache
            from app.embed import BatchingEmbedder, load_encoder

            options = settings.semantic
            encoder = await asyncio.to_thread(load_encoder, options.embedder, options.embedder_model)
            embedder = BatchingEmbedder(encoder)
            semantic = SemanticCache(redis, embedder, settings.resolve(options.index_schema))
        yield CacheInvalidator(redis, VersionTag(redis), ScopeGenerations(redis), policy, semantic)
    finally:
        await redis.aclose()
        if embedder is not None:
            embedder.close()


def cmd_invalidate(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    from app.cache.invalidation import Invalidation, InvalidationError, NothingThere, sweep_stale_generations
    from app.cache.version import sweep_stale_versions

    what = Invalidation(category=args.category, tenant=args.tenant, key=args.key, question=args.question,
                        model=args.model, system=args.system, faq=args.faq)
    if what.kind == "everything" and not args.all:
        return _fail("say what to invalidate: --all, --category, --tenant, --key, --question or --faq")
    if args.all and what.kind != "everything":
        return _fail("--all goes alone")

    async def go() -> tuple[Any, int]:
        async with _invalidator(settings, with_semantic=what.kind in ("question", "key")) as invalidator:
            done = await invalidator.invalidate(what, who=_operator())
            swept = 0
            if done.kind == "everything":
                swept = await sweep_stale_versions(invalidator.redis, done.version)
            elif done.kind == "scope":
                swept = await sweep_stale_generations(invalidator.redis, await invalidator.versions.refresh())
            return done, swept

    try:
        done, swept = asyncio.run(go())
    except InvalidationError as exc:
        return _fail(str(exc))
    except NothingThere as exc:
        print(f"strata: {exc}", file=sys.stderr)
        return 1
    except (RedisError, OSError) as exc:
        return _fail(f"Redis at {settings.redis.url}: {exc}")
    result = {**msgspec.to_builtins(done), "swept": swept}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"invalidated {done.kind} {done.target}: {done.deleted + swept} entries deleted")
    return 0


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import RedisError

    if not 1 <= args.count <= 10_000:
        return _fail("--count must be between 1 and 10000")

    async def go() -> list[dict[str, str]]:
        async with _invalidator(settings, with_semantic=False) as invalidator:
            return await invalidator.audit(args.count)

    try:
        rows = asyncio.run(go())
    except (RedisError, OSError) as exc:
        return _fail(f"Redis at {settings.redis.url}: {exc}")
    if args.json:
        print(json.dumps(rows))
        return 0
    import datetime

    for row in rows:
        row["when"] = datetime.datetime.fromtimestamp(int(row.get("at") or 0), datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    print(table(rows, ["when", "who", "kind", "target", "deleted"]) if rows else "no invalidations recorded")
    return 0


def register(commands: Any) -> None:
    """Add ``strata cache ...`` to the command's subparsers."""
    cache = commands.add_parser("cache", help="operate the cache: invalidate, audit")
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
    invalidate.add_argument("--json", action="store_true")
    invalidate.set_defaults(run=cmd_invalidate)
    audit = steps.add_parser("audit", help="the latest invalidations, newest first")
    audit.add_argument("--count", type=int, default=20)
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(run=cmd_audit)
