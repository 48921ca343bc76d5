"""Cluster buckets: the URL, the choice of tags, and which bucket a request goes to."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest

from app.cache.storage.buckets import bucket_of, choose_tags, cluster_credentials, cluster_nodes


def test_cluster_nodes_are_read_from_the_url() -> None:
    assert cluster_nodes("redis+cluster://10.0.0.1:7001,10.0.0.2:7002") == [("10.0.0.1", 7001), ("10.0.0.2", 7002)]
    assert cluster_nodes("redis+cluster://user:pw@h:1") == [("h", 1)]
    for bad in ("redis://h:1", "redis+cluster://", "redis+cluster://h", "redis+cluster://h:x"):
        with pytest.raises(ValueError):
            cluster_nodes(bad)
    assert cluster_credentials("redis+cluster://app:s%40cret@h:1,h:2") == {"username": "app", "password": "s@cret"}
    assert cluster_credentials("redis+cluster://:only-a-password@h:1") == {"password": "only-a-password"}
    assert cluster_credentials("redis+cluster://h:1") == {}


def owner_of(masters: list[str]):
    """A stand-in slot map: a tag's master by a hash of it (as a cluster's, unevenly)."""
    return lambda tag: masters[zlib.crc32(tag.encode()) % 7 % len(masters)]


def test_tags_are_spread_evenly_over_the_masters_and_taken_in_turn() -> None:
    masters = ["h:1", "h:2", "h:3"]
    owner = owner_of(masters)
    tags = choose_tags(9, owner, masters)
    assert len(set(tags)) == 9 and all(t.startswith("b") for t in tags)
    assert Counter(owner(t) for t in tags) == {m: 3 for m in masters}
    assert [owner(t) for t in tags[:3]] == masters  # one master after the other
    assert choose_tags(9, owner, masters) == tags  # every instance finds the same
    assert Counter(owner(t) for t in choose_tags(4, owner, masters)).most_common(1)[0][1] == 2


def test_a_tenants_category_always_goes_to_one_bucket_and_tenants_spread() -> None:
    assert bucket_of("acme", "faq", 9) == bucket_of("acme", "faq", 9)
    spread = Counter(bucket_of(f"tenant-{i}", "faq", 9) for i in range(900))
    assert len(spread) == 9 and min(spread.values()) > 60


def test_an_unreachable_cluster_is_a_clear_error_at_start() -> None:
    import asyncio

    from app.cache.storage.buckets import ClusterUnavailable, open_buckets
    from app.settings import RedisSettings
    from tests.support import free_port

    url = f"redis+cluster://:pass-word-1@127.0.0.1:{free_port()}"
    with pytest.raises(ClusterUnavailable, match=r"3 attempts.*needs the cluster at start-up") as raised:
        asyncio.run(open_buckets(RedisSettings(url=url, timeout_s=0.2)))
    # Messages reach logs: the URL's password does not.
    assert "pass-word-1" not in str(raised.value) and ":***@127.0.0.1" in str(raised.value)
