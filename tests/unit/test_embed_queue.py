"""The embedding queue: fair between owners, bounded, and never embedding for a caller that gave up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from app.embed import BatchingEmbedder, EmbedderBusy


class GatedEncoder:
    """Records each batch; the first batch waits until the test opens the gate."""

    name, dims = "gated", 2

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not self.batches:
            self.gate.wait(10)
        self.batches.append(list(texts))
        return np.ones((len(texts), self.dims), dtype=np.float32)


def test_a_tenants_backlog_does_not_delay_another_tenants_lookup() -> None:
    async def scenario() -> list[list[str]]:
        encoder = GatedEncoder()
        embedder = BatchingEmbedder(encoder, max_batch=4)
        first = asyncio.create_task(embedder.embed(["warm"], owner="a"))  # occupies the model
        await asyncio.sleep(0.05)
        flood = [asyncio.create_task(embedder.embed([f"noisy {i}"], owner="noisy")) for i in range(20)]
        await asyncio.sleep(0)
        quiet = asyncio.create_task(embedder.embed(["quiet"], owner="quiet"))
        await asyncio.sleep(0)
        encoder.gate.set()
        await asyncio.gather(first, quiet, *flood)
        embedder.close()
        return encoder.batches

    batches = asyncio.run(scenario())
    # The quiet tenant's text goes in the very next batch, beside one share of the noisy tenant's.
    assert batches[0] == ["warm"] and "quiet" in batches[1]
    assert sum(len(b) for b in batches) == 22


def test_a_caller_that_gave_up_is_never_embedded_and_the_queue_is_bounded() -> None:
    async def scenario() -> tuple[list[list[str]], bool, int]:
        encoder = GatedEncoder()
        embedder = BatchingEmbedder(encoder, max_pending=3)
        first = asyncio.create_task(embedder.embed(["warm"]))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await embedder.embed(["given up"], owner="t")
        waiting = [asyncio.create_task(embedder.embed([f"w{i}"], owner="t")) for i in range(2)]
        await asyncio.sleep(0)
        try:
            await embedder.embed(["one too many"], owner="t")
            busy = False
        except EmbedderBusy:
            busy = True
        encoder.gate.set()
        await asyncio.gather(first, *waiting)
        pending = embedder.pending
        embedder.close()
        return encoder.batches, busy, pending

    batches, busy, pending = asyncio.run(scenario())
    assert busy and pending == 0
    assert all("given up" not in b for b in batches) and ["w0", "w1"] in batches
