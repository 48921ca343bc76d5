"""The review queue (issue #35): the grey-zone candidates the decision refused, for people to settle.

Each answered miss whose nearest candidate the decision refused (outside the bound, the record
unproven, the reader's no) is one item: the asked question, its fresh answer, the cached question
and its answer, the similarity. Asked again with the same candidate, the item's traffic grows, so
the queue ranks by how much a verdict would serve. The queue is bounded per tenant and category
(``REVIEW_MAX_ITEMS``, the least asked dropped) and expires unused (``REVIEW_TTL_S``): it grows
with what is cached, never with traffic.

A reviewer's verdict is an observation with the reviewer as its source: approved, the asked
question's document becomes an alias of the candidate's entry and the entry's record is confirmed
at that score as often as it needs to vouch (``entry_confirmations``), so the next paraphrase is
served; rejected, the candidate's document and entry are vetoed at that similarity (``wrong_above``),
so it is never served there. Both are audited with who.

A settled pair is not queued again for ``REVIEW_TTL_S`` (its item hash stays, with the verdict in
its ``settled`` field): a reviewer's no is not asked of them twice.

Keys (``redis-cli``): ``strata:vN:review:<category>:<tenant>`` (sorted set: item id -> times asked)
and ``strata:vN:review-item:<id>`` (hash: the fields of :class:`ReviewItem`; ``settled``: the verdict).
"""

from __future__ import annotations

import hashlib

import msgspec
from redis.asyncio import Redis

from app.cache.storage.keys import KEYS, Keyspace, as_text

REVIEW_MAX_ITEMS = 500
REVIEW_TTL_S = 7 * 86400

# Adds or counts one item, keeps the queue to its bound. KEYS: queue, item. ARGV: id, max items,
# TTL, then the item's field/value pairs. The dropped items' hashes are deleted with them.
# A settled pair's hash is a tombstone (field ``settled``) until it expires: not queued again.
_ENQUEUE = """
if redis.call('HEXISTS', KEYS[2], 'settled') == 1 then return 0 end
redis.call('ZINCRBY', KEYS[1], 1, ARGV[1])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #ARGV[1])
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, excess - 1)) do
    redis.call('DEL', prefix .. id)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
end
return 1
"""


class ReviewItem(msgspec.Struct, frozen=True, kw_only=True):
    """One refused candidate for a person to settle.

    Attributes:
        id: Names the pair (the asked question's document and the candidate's entry).
        tenant: Whose question.
        category: Its category.
        asked: The asked question.
        asked_document: The asked question's semantic document (an alias once approved).
        asked_answer: The model's answer to it.
        cached: The cached question the decision refused.
        document: The document that matched.
        root: Its entry (whose answer it would serve).
        cached_answer: That answer.
        similarity: The two questions' cosine similarity.
        score_bin: The decision score's bin.
        reason: Why it was refused (``outside_bound``, ``record_unproven``, ``reader_rejected``).
        asked_times: How often it was asked with this candidate (filled in from the queue).
    """

    id: str
    tenant: str
    category: str
    asked: str
    asked_document: str
    asked_answer: str
    cached: str
    document: str
    root: str
    cached_answer: str
    similarity: float
    score_bin: int
    reason: str = ""
    asked_times: int = 0


_FIELDS = [f for f in ReviewItem.__struct_fields__ if f != "asked_times"]


def item_id(asked_document: str, root: str) -> str:
    return hashlib.sha256(f"{asked_document}\x1f{root}".encode()).hexdigest()[:24]


class ReviewQueue:
    """The review queue of one keyspace.

    Args:
        redis: The Redis of the keyspace.
        keys: The keyspace.
    """

    def __init__(self, redis: Redis, keys: Keyspace = KEYS) -> None:
        self._redis = redis
        self._keys = keys
        self._enqueue = redis.register_script(_ENQUEUE)

    async def add(self, tag: str, item: ReviewItem) -> None:
        """Queue an item, or count it once more."""
        pairs: list[str] = []
        for name in _FIELDS:
            pairs += [name, str(getattr(item, name))]
        await self._enqueue(keys=[self._keys.review_key(tag, item.category, item.tenant),
                                  self._keys.review_item_key(tag, item.id)],
                            args=[item.id, REVIEW_MAX_ITEMS, REVIEW_TTL_S, *pairs])

    async def items(self, tag: str, category: str, tenant: str, count: int = 50) -> list[ReviewItem]:
        """The most asked items of a tenant's queue in a category, most asked first."""
        ranked = await self._redis.zrevrange(self._keys.review_key(tag, category, tenant), 0, count - 1,
                                             withscores=True)
        found = []
        for raw_id, times in ranked:  # type: ignore[str-unpack]  # (member, score) pairs with withscores
            item = await self.get(tag, str(as_text(raw_id)))
            if item is not None:
                found.append(msgspec.structs.replace(item, asked_times=int(times)))
        return found

    async def get(self, tag: str, identifier: str) -> ReviewItem | None:
        """One item, or ``None`` when it is gone (settled, dropped or expired)."""
        raw = await self._redis.hgetall(self._keys.review_item_key(tag, identifier))
        if not raw or b"settled" in raw or "settled" in raw:
            return None
        fields = {str(as_text(k)): str(as_text(v)) for k, v in raw.items()}
        try:
            return msgspec.convert(fields, ReviewItem, strict=False)
        except msgspec.ValidationError:
            return None

    async def remove(self, tag: str, item: ReviewItem, verdict: str = "dropped") -> None:
        """Take a settled item out of its queue; its pair is not queued again while the tombstone
        lasts (``REVIEW_TTL_S``)."""
        item_key = self._keys.review_item_key(tag, item.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._keys.review_key(tag, item.category, item.tenant), item.id)
            pipe.delete(item_key)
            pipe.hset(item_key, mapping={"settled": verdict, "tenant": item.tenant, "category": item.category})
            pipe.expire(item_key, REVIEW_TTL_S)
            await pipe.execute()
