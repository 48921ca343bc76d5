"""The semantic index across restarts, version bumps and embedder changes."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from redis.asyncio import Redis

from app.cache.semantic import index_dims
from app.embed import load_encoder
from tests.integration.conftest import strata_settings
from tests.support import FakeUpstream, ask, serve_strata


def test_a_missing_index_is_created_and_a_present_one_is_reused(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    assert redis_sync.execute_command("FT._LIST") == []
    with serve_strata(settings, use_encoder) as server:
        assert ask(server.url, "怎么申请退款").headers["x-cache"] == "miss"
    assert redis_sync.execute_command("FT._LIST") == [b"strata:v1:sem"]
    # A restart keeps the index and its entries.
    with serve_strata(settings, use_encoder) as server:
        assert ask(server.url, "退款怎么申请").headers["x-cache"] == "semantic-hit"
    assert int(redis_sync.ft("strata:v1:sem").info()["num_docs"]) == 1
    assert redis_sync.get("strata:meta:version") == b"1"


def test_an_embedder_with_other_dims_moves_to_a_new_version_instead_of_crashing(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    fake_upstream.reset()
    use = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    with serve_strata(use, use_encoder) as server:
        ask(server.url, "How do I reset my password?")
    assert redis_sync.get("strata:meta:embedder").endswith(b":512")
    minilm = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True,
                             embedder="sentence-transformers")
    with serve_strata(minilm, load_encoder("sentence-transformers")) as server:
        assert redis_sync.get("strata:meta:version") == b"2"
        assert ask(server.url, "How do I reset my password?").headers["x-cache"] == "miss"
        assert ask(server.url, "How can I reset my password?").headers["x-cache"] == "semantic-hit"
        assert b"strata:v2:sem" in redis_sync.execute_command("FT._LIST")
    assert asyncio.run(dims_of(redis_url, "strata:v2:sem")) == 384


async def dims_of(redis_url: str, index: str) -> int | None:
    client = Redis.from_url(redis_url)
    try:
        return await index_dims(client, index)
    finally:
        await client.aclose()
