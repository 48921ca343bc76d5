"""The house (issue #45): app/cache's rooms import only downwards, and no two packages of app/
import each other, directly or round about. Imports under ``if TYPE_CHECKING:`` are for types
only and are not counted."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from app.settings import PROJECT_ROOT

APP = PROJECT_ROOT / "app"
# The rooms of app/cache, lowest first: a module may import its own room and lower ones only.
ROOMS = ("app.cache.storage", "app.cache.readers", "app.cache.decision", "app.cache.learning", "app.cache")


def module_of(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> Iterator[str]:
    """The app modules a file imports at run time (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
                   and isinstance(branch.test, ast.Name) and branch.test.id == "TYPE_CHECKING"
                   for statement in branch.body for node in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app"):
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("app"))


def room(module: str) -> int | None:
    return next((rank for rank, name in enumerate(ROOMS) if module == name or module.startswith(name + ".")), None)


def test_no_room_of_the_cache_imports_a_higher_one() -> None:
    upward = []
    for path in sorted((APP / "cache").rglob("*.py")):
        importer = module_of(path)
        for imported in runtime_imports(path):
            own, theirs = room(importer), room(imported)
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{importer} imports {imported}")
    assert upward == []


def package_of(module: str) -> str:
    """A module's unit: a room of app/cache, another package of app, or a module of app itself."""
    rank = room(module)
    if rank is not None and ROOMS[rank] != "app.cache":
        return ROOMS[rank]
    parts = module.split(".")
    return ".".join(parts[:2])


def import_graph() -> dict[str, set[str]]:
    """Which unit of app/ imports which: the rooms of app/cache, the other packages, the modules."""
    edges: dict[str, set[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        importer = package_of(module_of(path))
        for imported in runtime_imports(path):
            target = package_of(imported)
            if target not in (importer, "app"):
                edges.setdefault(importer, set()).add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of units that import each other, directly or round about (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            strong(node)
    return found


def test_no_two_packages_or_modules_of_app_import_each_other_even_round_about() -> None:
    assert cycles(import_graph()) == []


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The rooms' test can fail: a storage module importing the decision is reported."""
    assert room("app.cache.storage.keys") == 0 and room("app.cache.decision.rules") == 2
    assert room("app.cache.semantic") == 4 and room("app.policy") is None
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nfrom app.cache.decision.rules import Ruling\n"
                      "if TYPE_CHECKING:\n    from app.cache.semantic import SemanticCache\n")
    assert list(runtime_imports(sample)) == ["app.cache.decision.rules"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_setting_a_docstring_names_exists() -> None:
    """A ``semantic.<field>`` in app/'s text names a field of a category's semantic policy or of
    the service's semantic settings (issue #56 item 6: two named settings that were gone)."""
    import re

    import msgspec

    from app.policy import AdaptiveSemantic, FixedSemantic
    from app.settings import SemanticSettings

    known = {f.name for kind in (AdaptiveSemantic, FixedSemantic, SemanticSettings) for f in msgspec.structs.fields(kind)}
    named = {(path.name, name) for path in APP.rglob("*.py")
             for name in re.findall(r"``semantic\.([a-z_]+)``", path.read_text(encoding="utf-8"))}
    assert {(where, name) for where, name in named if name not in known} == set()


def test_the_semantic_page_reads_in_one_pass() -> None:
    """docs/SEMANTIC.md stays a page a newcomer reads at once; the intents' detail has its own."""
    lines = (PROJECT_ROOT / "docs" / "SEMANTIC.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, lines
    assert (PROJECT_ROOT / "docs" / "INTENTS.md").exists()
