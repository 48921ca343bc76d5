"""What Redis Cluster with RediSearch 2.10 (no coordinator) allows, on a real 3-master cluster:
the facts the cluster design of issue #13 rests on (docs/SCALING.md): why the single-node key
layout cannot run on a cluster, and what a bucket must be (test_cluster_mode.py runs Strata on it).

- a script over keys of different slots is refused (CROSSSLOT): today's exact lookup is one;
- an index sees only the keys of the master that owns its name's slot;
- a bucket, one hash tag for the index name, its prefix and every key a script touches, reached
  through a connection to the master that owns the tag, behaves as a single Redis;
- redisvl's index creation through the cluster client is sent to the wrong master.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, ResponseError
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import VectorQuery

from app.cache.storage.exact import _LOOKUP_SCRIPT
from app.cache.storage.keys import KEYS

VERSION_KEY, SCOPES_KEY = KEYS.version_key, KEYS.scopes_key

VECTOR = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32).tobytes()


def schema(name: str, prefix: str) -> dict[str, object]:
    return {"index": {"name": name, "prefix": prefix, "storage_type": "hash"},
            "fields": [{"name": "question", "type": "text"},
                       {"name": "embedding", "type": "vector",
                        "attrs": {"dims": 4, "algorithm": "hnsw", "distance_metric": "cosine", "datatype": "float32"}}]}


@pytest.fixture
async def cluster(cluster_ports: list[int]) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster_ports[0], protocol=2)  # redisvl's calls need RESP2
    await client.initialize()
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    await client.aclose()


def tags_on_every_master(cluster: RedisCluster, count: int) -> list[str]:
    """Hash tags ``b0``, ``b1``, ... until every master owns one; the first ``count`` found per master."""
    found: dict[int, str] = {}
    for i in range(1000):
        node = cluster.get_node_from_key(f"{{b{i}}}")
        found.setdefault(node.port, f"b{i}")
        if len(found) == count:
            return list(found.values())
    raise AssertionError("no tag found for every master")


async def knn(index: AsyncSearchIndex) -> list[str]:
    rows = await index.query(VectorQuery(vector=VECTOR, vector_field_name="embedding", return_fields=["question"],
                                         num_results=10))
    return sorted(row["id"] for row in rows)


async def test_todays_exact_lookup_script_is_refused_across_slots(cluster: RedisCluster) -> None:
    entry = "strata:v1:exact:" + "0" * 64
    assert cluster.keyslot(VERSION_KEY) != cluster.keyslot(entry)
    with pytest.raises((RedisClusterException, ResponseError), match="slot"):
        await cluster.eval(_LOOKUP_SCRIPT, 3, VERSION_KEY, entry, SCOPES_KEY, "1", "0.0.0", "a", "b", "c")


async def test_an_index_sees_only_the_keys_of_its_own_master(cluster: RedisCluster) -> None:
    home, other = tags_on_every_master(cluster, 2)
    node = cluster.get_node_from_key(f"{{{home}}}")
    direct = aredis.Redis(host=node.host, port=node.port, protocol=2)
    try:
        # One prefix for keys of any slot: the index is on the master of its name's slot only.
        index = AsyncSearchIndex.from_dict(schema(f"idx:{{{home}}}", "doc:"), redis_client=direct)
        await index.create(overwrite=True)
        for tag in (home, other):
            await cluster.hset(f"doc:{{{tag}}}:1", mapping={"question": tag, "embedding": VECTOR})
        await asyncio.sleep(0.1)
        assert await knn(index) == [f"doc:{{{home}}}:1"]
    finally:
        await direct.aclose()


async def test_a_bucket_is_one_tag_on_one_master_and_behaves_as_a_single_redis(cluster: RedisCluster) -> None:
    for tag in tags_on_every_master(cluster, 3):
        node = cluster.get_node_from_key(f"{{{tag}}}")
        direct = aredis.Redis(host=node.host, port=node.port, protocol=2)
        try:
            index = AsyncSearchIndex.from_dict(schema(f"strata:{{{tag}}}:v1:sem", f"strata:{{{tag}}}:v1:sem:"),
                                               redis_client=direct)
            await index.create(overwrite=True)
            key = f"strata:{{{tag}}}:v1:sem:1"
            await direct.hset(key, mapping={"question": tag, "embedding": VECTOR})
            await asyncio.sleep(0.1)
            assert await knn(index) == [key]
            # A bucket's copy of the version and its entries share a slot: one script reads both.
            version = f"strata:{{{tag}}}:meta:version"
            await direct.set(version, 1)
            read = "return {redis.call('GET', KEYS[1]), redis.call('HGET', KEYS[2], 'question')}"
            assert await direct.eval(read, 2, version, key) == [b"1", tag.encode()]
        finally:
            await direct.aclose()


async def test_redisvl_creates_an_index_through_the_cluster_client_on_the_wrong_master(cluster: RedisCluster) -> None:
    # If this starts passing, redisvl routes FT.CREATE by the index name's slot itself and a
    # bucket no longer needs its own connection for index calls.
    misrouted = 0
    for tag in tags_on_every_master(cluster, 3):
        index = AsyncSearchIndex.from_dict(schema(f"strata:{{{tag}}}:v1:sem", f"strata:{{{tag}}}:v1:sem:"),
                                           redis_client=cluster)
        try:
            await index.create(overwrite=True)
        except RedisSearchError as exc:
            assert "127.0.0.1" in str(exc)  # a MOVED reply naming the owner
            misrouted += 1
    assert misrouted >= 2  # sent to one default master: right for at most one of three tags
