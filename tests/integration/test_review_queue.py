"""The review queue's store (app/cache/learning/review.py) on the test Redis: ranked by traffic, bounded,
and a settled pair not queued again."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio import Redis

from app.cache.learning.review import ReviewItem, ReviewQueue, item_id
from app.cache.storage.keys import KEYS

TAG = "v1"


def pair(asked: str, cached: str = "how do I reset my password") -> ReviewItem:
    asked_document = f"strata:v1:sem:{asked}"
    return ReviewItem(id=item_id(asked_document, "strata:v1:sem:root"), tenant="default", category="faq",
                      asked=asked, asked_document=asked_document, asked_answer="another answer", cached=cached,
                      document="strata:v1:sem:root", root="strata:v1:sem:root", cached_answer="the answer",
                      similarity=0.81, score_bin=81, reason="outside_bound")


@pytest.fixture
def queue_url(redis_url: str, redis_sync: redis.Redis) -> str:
    if redis_url.startswith("redis+cluster://"):
        pytest.skip("the store is one bucket's; the cluster suite covers buckets elsewhere")
    return redis_url


def test_items_rank_by_traffic_and_a_settled_pair_is_not_queued_again(queue_url: str,
                                                                         redis_sync: redis.Redis) -> None:
    async def scenario() -> tuple[list[str], list[str], ReviewItem | None]:
        client = Redis.from_url(queue_url)
        queue = ReviewQueue(client)
        once, twice = pair("how can I change my password"), pair("password reset how")
        await queue.add(TAG, once)
        await queue.add(TAG, twice)
        await queue.add(TAG, twice)
        ranked = [item.asked for item in await queue.items(TAG, "faq", "default")]
        await queue.remove(TAG, twice, "reject")
        await queue.add(TAG, twice)  # asked again after the reviewer's no: not asked of them again
        after = [item.asked for item in await queue.items(TAG, "faq", "default")]
        gone = await queue.get(TAG, twice.id)
        await client.aclose()
        return ranked, after, gone

    ranked, after, gone = asyncio.run(scenario())
    assert ranked == ["password reset how", "how can I change my password"]
    assert after == ["how can I change my password"] and gone is None
    tombstone = redis_sync.hgetall(KEYS.review_item_key(TAG, pair("password reset how").id))
    assert tombstone[b"settled"] == b"reject" and redis_sync.ttl(KEYS.review_item_key(TAG, pair("x").id)) == -2
    assert 0 < redis_sync.ttl(KEYS.review_item_key(TAG, pair("password reset how").id))
