"""The semantic index across restarts, version bumps and embedder changes."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from redis.asyncio import Redis

from app.cache.storage.index import index_dims
from app.embed import load_encoder
from tests.support import FakeUpstream, ask, indexes, keyspace, node_of, serve_strata, strata_settings


def test_a_missing_index_is_created_and_a_present_one_is_reused(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    assert indexes(redis_sync) == set()
    with serve_strata(settings, use_encoder) as server:
        assert ask(server.url, "怎么申请退款").headers["x-cache"] == "miss"
    keys = keyspace(redis_sync, "default", "faq")
    index = keys.semantic_index_name("v1")
    assert indexes(redis_sync) == {index}
    # A restart keeps the index and its entries.
    with serve_strata(settings, use_encoder) as server:
        assert ask(server.url, "退款怎么申请").headers["x-cache"] == "semantic-hit"
    assert int(node_of(redis_sync, index).ft(index).info()["num_docs"]) == 1
    assert redis_sync.get(keys.version_key) == b"1"


def test_an_embedder_with_other_dims_moves_to_a_new_version_instead_of_crashing(
    redis_url: str, redis_sync: redis.Redis, fake_upstream: FakeUpstream, use_encoder: Any
) -> None:
    fake_upstream.reset()
    use = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    with serve_strata(use, use_encoder) as server:
        ask(server.url, "How do I reset my password?")
    keys = keyspace(redis_sync, "default", "faq")
    assert redis_sync.get(keys.embedder_key).endswith(b":512")
    minilm = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True,
                             embedder="sentence-transformers")
    with serve_strata(minilm, load_encoder("sentence-transformers")) as server:
        assert redis_sync.get(keys.version_key) == b"2"
        assert ask(server.url, "How do I reset my password?").headers["x-cache"] == "miss"
        assert ask(server.url, "How can I reset my password?").headers["x-cache"] == "semantic-hit"
        assert keys.semantic_index_name("v2") in indexes(redis_sync)
    assert asyncio.run(dims_of(node_of(redis_sync, keys.version_key), keys.semantic_index_name("v2"))) == 384


async def dims_of(node: redis.Redis, index: str) -> int | None:
    address = node.connection_pool.connection_kwargs
    client = Redis(host=address.get("host", "localhost"), port=address.get("port", 6379))
    try:
        return await index_dims(client, index)
    finally:
        await client.aclose()
