"""The reads after the response (issue #33): bounded, fair per tenant, and visible.

A candidate the reader is not trusted for yet is answered by the model at once; the reader
reads it afterwards, beside the learner's comparison of the two answers, and the pair of them is
one measurement of the reader. Reads in flight are bounded per worker and per tenant (one tenant's
burst cannot take every slot), and their number is the gauge ``strata_judge_pending``, so a
replay can wait for it to settle (``strata replay run --settle``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from app.cache.readers.base import READ_FAILED, READ_NO, READ_YES, Reader, ReadPair


class ReadQueue:
    """Admits reads after the response and counts them.

    Args:
        reader: The reader.
        max_pending: Reads in flight per worker; beyond it a read is dropped (counted).
        per_tenant_share: Share of ``max_pending`` one tenant may hold (at least one read).
        on_read: Counts a verdict ``(reader name, yes|no|failed|dropped)``.
        on_pending: Told the number of reads in flight whenever it changes.
    """

    def __init__(self, reader: Reader, max_pending: int = 64, per_tenant_share: float = 0.25,
                 on_read: Callable[[str, str], None] | None = None,
                 on_pending: Callable[[int], None] | None = None) -> None:
        self.reader = reader
        self._max_pending = max(1, max_pending)
        self._per_tenant = max(1, int(self._max_pending * per_tenant_share))
        self._in_flight: Counter[str] = Counter()
        self._on_read = on_read or (lambda reader, verdict: None)
        self._on_pending = on_pending or (lambda pending: None)

    @property
    def pending(self) -> int:
        """Reads in flight (the gauge ``strata_judge_pending``)."""
        return sum(self._in_flight.values())

    async def read(self, tenant: str, pair: ReadPair) -> bool | None:
        """The reader's verdict on a pair, or ``None`` (no verdict, or no room: dropped)."""
        if self.pending >= self._max_pending or self._in_flight[tenant] >= self._per_tenant:
            self._on_read(self.reader.name, "dropped")
            return None
        self._in_flight[tenant] += 1
        self._on_pending(self.pending)
        try:
            said = await self.reader.read(pair)
        finally:
            self._in_flight[tenant] -= 1
            if not self._in_flight[tenant]:
                del self._in_flight[tenant]
            self._on_pending(self.pending)
        self._on_read(self.reader.name, READ_FAILED if said is None else READ_YES if said else READ_NO)
        return said
