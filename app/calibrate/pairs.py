"""Labelled question pairs: the CSV format, stable splits. No numpy here, so ``strata --help`` stays fast."""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Pairs per pool in which QQP-hard negatives are searched (app/calibrate/qqp.py).
QQP_POOL_SIZE = 2000

REQUIRED_COLUMNS = ("sentence1", "sentence2", "label")


class PairsFileError(ValueError):
    """A pairs file that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Pair:
    cached: str
    asked: str
    label: int


def read_pairs(path: Path) -> list[Pair]:
    """Read a ``sentence1,sentence2,label`` CSV (UTF-8, byte-order mark allowed).

    Raises:
        PairsFileError: Unreadable, not UTF-8, missing columns, a label other than 0/1, or no rows.
    """
    text = read_utf8(path, PairsFileError)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise PairsFileError(f"{path}: missing column(s) {', '.join(missing)}; the header must be sentence1,sentence2,label")
    pairs = []
    for line, row in enumerate(reader, start=2):
        label = (row["label"] or "").strip()
        if label not in ("0", "1"):
            raise PairsFileError(f"{path}:{line}: label must be 0 or 1, got {label!r}")
        cached, asked = (row["sentence1"] or "").strip(), (row["sentence2"] or "").strip()
        if not cached or not asked:
            raise PairsFileError(f"{path}:{line}: empty sentence")
        pairs.append(Pair(cached=cached, asked=asked, label=int(label)))
    if not pairs:
        raise PairsFileError(f"{path}: no pairs")
    return pairs


def read_utf8(path: Path, error: type[ValueError]) -> str:
    """A UTF-8 text file (byte-order mark allowed); ``error`` with a one-line message otherwise."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from exc


class Clusters:
    """Disjoint sets of texts linked as paraphrases; each set is named by its smallest text."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}

    def find(self, text: str) -> str:
        parent = self._parent
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    def link(self, a: str, b: str) -> None:
        first, second = self.find(a), self.find(b)
        if first != second:
            self._parent[max(first, second)] = min(first, second)

    def texts(self) -> list[str]:
        return list(self._parent)


def write_pairs(pairs: Sequence[Pair], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUIRED_COLUMNS)
        for pair in pairs:
            writer.writerow([pair.cached, pair.asked, pair.label])


def stable_bucket(text: str) -> int:
    """A stable 0..99 bucket of a text: deterministic splits without a random generator."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100


def split_pairs(pairs: Sequence[Pair], held_out_percent: int) -> tuple[list[Pair], list[Pair]]:
    """(kept, held out), by a stable hash of the cached sentence, so a sentence stays on one side."""
    kept: list[Pair] = []
    held: list[Pair] = []
    for pair in pairs:
        (held if stable_bucket(pair.cached) < held_out_percent else kept).append(pair)
    return kept, held
