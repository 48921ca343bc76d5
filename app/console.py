"""What every ``strata`` command prints the same way: a failure, and a table."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

# The exit status of a command that was given something it cannot use.
USAGE_ERROR = 2


def fail(message: str) -> int:
    """Print ``strata: message`` to stderr; returns the exit status of a usage error."""
    print(f"strata: {message}", file=sys.stderr)
    return USAGE_ERROR


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (the default output of the cache commands)."""
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)
