"""What each kind of observation counts, and where: one table in Python (issue #45).

An observation says whether a document's answer was right for a question at a similarity and
decision score. Who made it decides what it may move: the model's answer to a candidate the
decision refused is a fair sample of the pool; a candidate a rule vouched for measures that rule;
an end user's "right" on a served hit is no fair sample; a reviewer's verdict is a chosen pair.

Every kind counts on the document (``ok:<bin>`` / ``wrong:<bin>``) and on its entry (a right one
``confirmed:<bin>``, a wrong one raises ``wrong_above`` on both). What the tenant's pool (and the
category's figures) count:

- ``ANSWERED_MISS``: ``ok:<bin>`` / ``wrong:<bin>``; ``explored_*`` when explored; the reader's
  fields when it read the pair.
- ``VOUCHED_MISS``: the vouching rule's ``record_*:<bin>`` / ``reader_*:<bin>`` and ``explored_*``,
  never the pool's own bins (a sample the rule chose).
- ``FEEDBACK``: ``wrong:<bin>`` for a "wrong", and the vouching rule's ``*_wrong:<bin>`` when the
  receipt names one (the team's intents); nothing for a "right".
- ``REVIEW``: nothing.

The Lua script (:data:`_OBSERVE`) is handed field names only: what to count on the document,
what to confirm on the entry, the similarity to veto at, and the pool's fields.
"""

from __future__ import annotations

import enum

from redis.asyncio import Redis

from app.cache.storage.keys import (
    FIELD_INTENT,
    FIELD_INTENT_CHECKED,
    FIELD_INTENT_REFUTED,
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_CONFIRMED,
    OBS_EXPLORED_OK,
    OBS_EXPLORED_WRONG,
    OBS_INTENT_WRONG,
    OBS_OK,
    OBS_WRONG,
    Keyspace,
    observation_field,
)

# Pooled observations live as long as a month without a new one (they are kept fresh by use).
POOLED_TTL_S = 30 * 86400


class Observation(enum.Enum):
    """Who observed a document's answer, which decides what the pool counts (module table)."""

    ANSWERED_MISS = "answered_miss"
    VOUCHED_MISS = "vouched_miss"
    FEEDBACK = "feedback"
    REVIEW = "review"


def pool_fields(kind: Observation, *, same: bool, score_bin: int, explored: bool = False,
                rules: tuple[str, ...] = ()) -> list[str]:
    """The pool fields one observation adds 1 to (the table above).

    Args:
        kind: Who observed.
        same: Whether the answer was right.
        score_bin: The decision score's bin.
        explored: Whether it was an explored would-be hit (the live precision counts those).
        rules: Fields of the rules this observation measures (``record_ok:087``, ``reader_no_wrong:087``).
    """
    if kind is Observation.REVIEW or (kind is Observation.FEEDBACK and same):
        return []
    fields = [observation_field(OBS_OK if same else OBS_WRONG, score_bin)] \
        if kind in (Observation.ANSWERED_MISS, Observation.FEEDBACK) else []
    if kind is Observation.FEEDBACK:
        return [*fields, *rules]
    if explored:
        fields.append(OBS_EXPLORED_OK if same else OBS_EXPLORED_WRONG)
    return [*fields, *rules]


# KEYS: document, category figures, entry, tenant pool. ARGV: the document's field, the entry's
# confirmation field ("" for none), the similarity x1000 to veto at ("" for none: right), the
# pools' TTL, then the pools' fields. Nothing is counted on a key that is gone (a miss must never
# create a key without a TTL); a veto raises the highest wrong similarity of the document and of
# its entry, so every alias of the entry is vetoed there; a wrong the intent rule served (an
# `intent_wrong:` field among the pools') also marks both `intent_refuted`.
_OBSERVE = f"""
local function raise_wrong(key)
  if redis.call('EXISTS', key) == 0 then return end
  local seen = tonumber(redis.call('HGET', key, '{FIELD_WRONG_ABOVE}') or '-1')
  if tonumber(ARGV[3]) > seen then redis.call('HSET', key, '{FIELD_WRONG_ABOVE}', ARGV[3]) end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], 1) end
if ARGV[3] ~= '' then
  raise_wrong(KEYS[1])
  raise_wrong(KEYS[3])
  for i = 5, #ARGV do
    if string.sub(ARGV[i], 1, {len(OBS_INTENT_WRONG) + 1}) == '{OBS_INTENT_WRONG}:' then
      for _, key in ipairs({{KEYS[1], KEYS[3]}}) do
        if redis.call('EXISTS', key) == 1 then redis.call('HSET', key, '{FIELD_INTENT_REFUTED}', 1) end
      end
    end
  end
elseif ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
end
if #ARGV < 5 then return 1 end
for _, pool in ipairs({{KEYS[2], KEYS[4]}}) do
  for i = 5, #ARGV do redis.call('HINCRBY', pool, ARGV[i], 1) end
  redis.call('EXPIRE', pool, ARGV[4])
end
return 1
"""


# Lua: whether a check of the intent rule's hit from document ``doc`` speaks for ``key`` (the
# document or its entry). The check was of the document's intent (the rule serves only a question
# read as it): it speaks for the entry only when the head read the entry's question as the same
# intent. An alias read as a twin of the entry's intent ("thanks, bye" stored under `goodbye`'s
# answer, read as `thank_you`) is checked for itself, and its wrong check does not refute the
# entry for its own askers. The mark and a reviewer's approval both ask it.
SPEAKS_FOR = f"""
local function speaks_for(key, doc)
  return key == doc or redis.call('HGET', key, '{FIELD_INTENT}') == redis.call('HGET', doc, '{FIELD_INTENT}')
end
"""

# KEYS: the document, its entry. ARGV: the field to set (1) on each that exists and the check
# speaks for: whether the model's answer to a question the intent rule would serve from the
# document agreed with theirs.
_MARK_INTENT = SPEAKS_FOR + """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 and speaks_for(key, KEYS[1]) then redis.call('HSET', key, ARGV[1], 1) end
end
return 1
"""


class ObservationWriter:
    """Records one observation on the document, the entry and the pools, as :func:`pool_fields` says.

    Args:
        redis: The Redis of the keyspace.
        keys: The keyspace.
    """

    def __init__(self, redis: Redis, keys: Keyspace = KEYS) -> None:
        self._keys = keys
        self._observe = redis.register_script(_OBSERVE)
        self._mark_intent = redis.register_script(_MARK_INTENT)

    async def mark_intent(self, document: str, root: str, *, right: bool) -> None:
        """The model's answer to a would-be intent hit agreed with the document's (``intent_checked``
        on it and its entry) or not (``intent_refuted``); a key that is gone is not re-created."""
        await self._mark_intent(keys=[document, root], args=[FIELD_INTENT_CHECKED if right else FIELD_INTENT_REFUTED])

    async def record(self, kind: Observation, tag: str, category: str, tenant: str, *, document: str, root: str,
                     similarity: float, score_bin: int, same: bool, explored: bool = False,
                     rules: tuple[str, ...] = ()) -> None:
        """Count whether a document's answer was right for a question at this similarity.

        Args:
            kind: Who observed (what the pool counts).
            tag: The version tag.
            category: The category.
            tenant: Whose question (the pool it counts in).
            document: The document that matched (an entry or an alias).
            root: Its entry.
            similarity: The two questions' cosine similarity.
            score_bin: The decision score's bin.
            same: Whether the answer was right; a wrong one vetoes the document and its entry for
                candidates at this similarity or below (``wrong_above``).
            explored: Whether it was an explored would-be hit.
            rules: Pool fields of the rules this observation measures.
        """
        fields = pool_fields(kind, same=same, score_bin=score_bin, explored=explored, rules=rules)
        await self._observe(
            keys=[document, self._keys.observations_key(tag, category), root,
                  self._keys.observations_key(tag, category, tenant)],
            args=[observation_field(OBS_OK if same else OBS_WRONG, score_bin),
                  observation_field(OBS_CONFIRMED, score_bin) if same else "",
                  "" if same else round(similarity * 1000), POOLED_TTL_S, *fields],
        )
