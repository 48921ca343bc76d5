"""The lifespan's background loops stop when cancelled, even where a client swallows the cancellation."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from app.lifespan import follow_cluster


class SwallowingBuckets:
    """A cluster client whose slot-map read eats a cancellation that lands mid-read, as redis-py's
    cluster client was seen to (a worker then never finished its shutdown)."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.swallowed = 0

    async def follow(self) -> int:
        self.reading.set()
        try:
            await asyncio.Event().wait()  # a read that answers only when cancelled
        except asyncio.CancelledError:
            if self.swallowed:
                raise  # once only, so that a failing test still ends
            self.swallowed += 1
        return 0


async def test_following_the_cluster_stops_when_cancelled_mid_read() -> None:
    buckets = SwallowingBuckets()
    resources = SimpleNamespace(settings=SimpleNamespace(redis=SimpleNamespace(cluster_refresh_s=0.0)),
                                cache=SimpleNamespace(buckets=buckets))
    task = asyncio.create_task(follow_cluster(cast(Any, resources)))
    await buckets.reading.wait()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)  # a bound for the failure only: it ends at once
    assert buckets.swallowed == 1 and task in done and task.cancelled()
