"""The write-back runs after the response has gone out, and nothing is lost by it: Strata served
exactly as in production (no test wrapper), with every cache write held back on purpose."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from app.cache.storage.entry import EntryWriter
from tests.support import FakeUpstream, chat, eventually, scan, serve_strata, strata_settings

WRITE_DELAY_S = 1.0


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every entry write waits a second first: long after its response has been read."""
    write = EntryWriter.write

    async def late_write(self: EntryWriter, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(WRITE_DELAY_S)
        return await write(self, *args, **kwargs)

    monkeypatch.setattr(EntryWriter, "write", late_write)
    yield


def exact_keys(redis_sync: redis.Redis) -> list[bytes]:
    return scan(redis_sync, "strata:v1:exact:*")




@pytest.mark.usefixtures("slow_writes")
def test_a_miss_is_answered_before_its_write_back_and_no_request_asks_twice(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.reset()
    settings = strata_settings(redis_url, fake_upstream.url)
    with serve_strata(settings, written_first=False) as one, serve_strata(settings, written_first=False) as two:
        started = time.monotonic()
        first = httpx.post(one.url + "/v1/chat/completions", json=chat("written later"), timeout=10)
        answered_in = time.monotonic() - started
        assert first.headers["x-cache"] == "miss"
        assert answered_in < WRITE_DELAY_S, "the response waited for the write-back"
        assert exact_keys(redis_sync) == []  # not written yet
        # The same worker serves the answer it is writing at once; another worker waits for it
        # (the lease is released only after the write): one upstream call in all.
        again = httpx.post(one.url + "/v1/chat/completions", json=chat("written later"), timeout=10)
        elsewhere = httpx.post(two.url + "/v1/chat/completions", json=chat("written later"), timeout=10)
        assert again.headers["x-cache"] == "exact-hit" and "x-cache-coalesced" not in again.headers  # no waiting
        assert elsewhere.headers["x-cache"] == "exact-hit" and elsewhere.headers["x-cache-coalesced"] == "true"
        content = first.json()["choices"][0]["message"]["content"]
        for response in (again, elsewhere):
            assert response.json()["choices"][0]["message"]["content"] == content
        assert len(fake_upstream.calls) == 1
        assert eventually(lambda: exact_keys(redis_sync))
        assert eventually(lambda: not scan(redis_sync, "strata:v1:lease:*"))
