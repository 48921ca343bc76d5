"""Readers that answer from a stream's labels: ``strata replay run --simulate --judge oracle``
(and ``--judge-error P``), so the mechanism that trusts a reader is measured apart from this
machine's weak models."""

from __future__ import annotations

import random

from app.cache.readers.base import ReadPair
from app.cache.storage.keys import normalize_text


class OracleReader:
    """Says yes exactly when both questions carry the same label; with ``error``, the opposite on
    that share of the pairs it is asked, drawn at random (seeded: a rerun draws the same).

    Args:
        labels: The label of each question (normalised as Strata normalises).
        error: Share of pairs answered wrongly.
        seed: Seed of the error draws.
    """

    def __init__(self, labels: dict[str, str], error: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= error <= 1.0:
            raise ValueError("the oracle's error share must be within [0, 1]")
        self._labels = labels
        self._error = error
        self._draws = random.Random(seed)
        self.name = "oracle" if not error else f"oracle-error-{error:g}"
        self.asked = 0

    async def read(self, pair: ReadPair) -> bool | None:
        self.asked += 1
        asked, cached = self._labels.get(normalize_text(pair.asked)), self._labels.get(normalize_text(pair.cached))
        if asked is None or cached is None:
            return None  # a question outside the stream: the oracle cannot tell
        same = asked == cached
        if self._error and self._draws.random() < self._error:
            return not same
        return same
