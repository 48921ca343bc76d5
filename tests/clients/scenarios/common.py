"""What every client scenario shares: the two base URLs, a case recorder and the cleaning that
leaves only what a client may see differ between two answers (their ids and creation times).

Each scenario is a script run as ``python scenario.py STRATA_URL DIRECT_URL`` by
tests/clients/test_clients.py, in the virtual environment whose client library it tries; it
prints one JSON object: per case the miss, the hit, what the model server gives directly when
the case compares with it, and the ``X-Cache`` headers seen.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

STRATA, DIRECT = sys.argv[1], sys.argv[2]
MODEL = "fake-model"
# What differs between two responses by design: identities and times (tool-call ids included:
# the model server mints a new one per generation, a hit replays the one it stored).
VOLATILE = frozenset({"id", "created", "system_fingerprint_seen", "created_at", "run_id", "lc_run_id"})

cases: dict[str, dict[str, Any]] = {}


def clean(value: Any, *, tool_ids: bool = True) -> Any:
    """The value without its volatile fields, recursively (tool-call ids too unless told)."""
    if isinstance(value, dict):
        return {k: clean(v, tool_ids=tool_ids) for k, v in value.items()
                if k not in VOLATILE and not (tool_ids and k in ("tool_call_id",))}
    if isinstance(value, list):
        return [clean(v, tool_ids=tool_ids) for v in value]
    if isinstance(value, str) and value.startswith(("chatcmpl-tool-", "call_", "chatcmpl-", "run-", "lc_run")):
        return "<id>"
    return value


def twice(name: str, call: Callable[[], tuple[Any, str | None]], *, direct: Callable[[], Any] | None = None) -> None:
    """Make the same call twice through Strata (a miss, then a hit) and, optionally, once
    straight to the model server; record all three, cleaned."""
    try:
        first, first_cache = call()
        second, second_cache = call()
        case: dict[str, Any] = {"miss": clean(first), "hit": clean(second), "headers": [first_cache, second_cache]}
        if direct is not None:
            case["direct"] = clean(direct())
    except Exception as exc:  # the case's failure is the result: the test shows it
        case = {"error": f"{type(exc).__name__}: {exc}"}
    cases[name] = case


def record(name: str, value: Any) -> None:
    cases[name] = {"value": clean(value)}


def done() -> None:
    print(json.dumps({"cases": cases}, default=str))
