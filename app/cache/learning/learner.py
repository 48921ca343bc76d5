"""The observer of the adaptive decision: what each answered miss teaches (issue #10).

Every miss is answered by the model anyway, so the answer the nearest cached question *would*
have served can be compared with the fresh one, for free. That comparison is an observation:
the candidate's decision score and whether the two answers are equivalent. Observations are
counted atomically in Redis, on the candidate's document and pooled per category and tenant, so
every worker and every Strata instance learns together (``redis-cli HGETALL strata:v1:obs:faq:<tenant>``),
and one tenant's traffic never moves what another tenant is served.

The decision that reads these observations back is app/cache/decision/adaptive.py.

When the fresh answer is equivalent to the candidate's, the new question becomes an alias of
the candidate's entry: its own vector in the index, the entry's answer and expiry, so the next
phrasing close to either is found. Aliases are capped per entry (``semantic.max_aliases``).
The model's answer is also compared with the other entries among the candidate's nearest
documents: an entry whose answer matches it is the same answer stored twice (two phrasings met
before either could find the other), and is merged into the candidate's entry (its documents
become aliases, its record is added). The margin is over other *answers*, so two entries of one
answer no longer stand in each other's way, and one entry collects all its confirmations.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from redis.asyncio import Redis

from app.cache.decision.stats import VOUCH_KINDS
from app.cache.decision.verify import CHECK_DISAGREED, Confirm, PairAnalyzer
from app.cache.learning.observations import SPEAKS_FOR, Observation, ObservationWriter
from app.cache.learning.review import ReviewItem, ReviewQueue, item_id
from app.cache.readers.base import ReadPair
from app.cache.readers.judge import JUDGE_FAILED
from app.cache.readers.queue import ReadQueue
from app.cache.storage.contract import CacheQuery, Candidate
from app.cache.storage.keys import (
    FIELD_ALIASES,
    FIELD_ANSWER,
    FIELD_EXPIRES_AT,
    FIELD_INTENT_CHECKED,
    FIELD_INTENT_REFUTED,
    FIELD_ROOT,
    FIELD_SCOPE,
    FIELD_SOURCE,
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_CONFIRMED,
    OBS_INTENT_FAR_OK,
    OBS_INTENT_FAR_WRONG,
    OBS_INTENT_PROBATION_OK,
    OBS_INTENT_PROBATION_WRONG,
    OBS_INTENT_TRIAL_OK,
    OBS_INTENT_TRIAL_WRONG,
    OBS_READER_NO_OK,
    OBS_READER_NO_WRONG,
    OBS_READER_OK,
    OBS_READER_WRONG,
    SOURCE_MODEL,
    Keyspace,
    intent_field,
    normalize_text,
    observation_field,
    probation_field,
)
from app.embed import Embedder
from app.policy import AdaptiveSemantic
from app.wire import decode_completion

logger = logging.getLogger("strata.learning")

# A reviewer's approval of a queued pair, on an entry that still exists: confirms it so many times
# at one score bin, and lifts the veto the pair's own differing answer set (``wrong_above`` at
# exactly the pair's similarity, on the entry and the matched document): the reviewer read both
# questions, the answer comparison did not. A veto set by any other observation stays. Approving a
# served intent hit whose check disagreed also marks the document checked, no more refuted (and
# its entry where the check speaks for it, as a check marks them: ``SPEAKS_FOR``): the
# reviewer says the cached answer is its intent's.
# KEYS: entry, matched document. ARGV: field (confirmed:<bin>), count, the pair's similarity
# (milli), 1 for a check's pair.
_APPROVE = SPEAKS_FOR + f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
for _, key in ipairs(KEYS) do
  if redis.call('HGET', key, '{FIELD_WRONG_ABOVE}') == ARGV[3] then redis.call('HDEL', key, '{FIELD_WRONG_ABOVE}') end
  if ARGV[4] == '1' and redis.call('EXISTS', key) == 1 and speaks_for(key, KEYS[2]) then
    redis.call('HDEL', key, '{FIELD_INTENT_REFUTED}')
    redis.call('HSET', key, '{FIELD_INTENT_CHECKED}', 1)
  end
end
return 1
"""

# Turns a freshly stored document into an alias of an entry: the entry's answer and expiry,
# counted against its cap. KEYS: the new document, the entry. ARGV: the cap.
_ALIAS = f"""
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if KEYS[1] == KEYS[2] then return 0 end
local root = redis.call('HGET', KEYS[2], '{FIELD_ROOT}')
if root and root ~= KEYS[2] then return 0 end  -- merged into another entry meanwhile
local count = redis.call('HINCRBY', KEYS[2], '{FIELD_ALIASES}', 1)
if count > tonumber(ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], '{FIELD_ALIASES}', -1)
  return -1
end
local answer = redis.call('HGET', KEYS[2], '{FIELD_ANSWER}')
local expires = redis.call('HGET', KEYS[2], '{FIELD_EXPIRES_AT}')
redis.call('HSET', KEYS[1], '{FIELD_ROOT}', KEYS[2], '{FIELD_ANSWER}', answer, '{FIELD_EXPIRES_AT}', expires)
redis.call('EXPIREAT', KEYS[1], expires)
return 1
"""


# Merges one entry into another of an equivalent answer: the merged entry and its documents
# become aliases of the target; its confirmations and highest wrong similarity are added to the
# target's record. Only entries of the model's answers in one scope, within the alias cap.
# KEYS: target entry, merged entry, the merged entry's other documents. ARGV: alias cap,
# the record's confirmation field prefix.
_MERGE = f"""
local target, merged = KEYS[1], KEYS[2]
if target == merged or redis.call('EXISTS', target) == 0 or redis.call('EXISTS', merged) == 0 then return 0 end
if redis.call('HGET', target, '{FIELD_ROOT}') ~= target or redis.call('HGET', merged, '{FIELD_ROOT}') ~= merged then return 0 end
if redis.call('HGET', target, '{FIELD_SCOPE}') ~= redis.call('HGET', merged, '{FIELD_SCOPE}') then return 0 end
for _, key in ipairs({{target, merged}}) do
  if (redis.call('HGET', key, '{FIELD_SOURCE}') or '{SOURCE_MODEL}') ~= '{SOURCE_MODEL}' then return 0 end
end
local count = tonumber(redis.call('HGET', target, '{FIELD_ALIASES}') or '0')
  + tonumber(redis.call('HGET', merged, '{FIELD_ALIASES}') or '0') + 1
if count > tonumber(ARGV[1]) then return -1 end
local fields = redis.call('HGETALL', merged)
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, #ARGV[2]) == ARGV[2] then
    redis.call('HINCRBY', target, fields[i], fields[i + 1])
    redis.call('HDEL', merged, fields[i])
  end
end
local wrong = tonumber(redis.call('HGET', merged, '{FIELD_WRONG_ABOVE}') or '-1')
if wrong > tonumber(redis.call('HGET', target, '{FIELD_WRONG_ABOVE}') or '-1') then
  redis.call('HSET', target, '{FIELD_WRONG_ABOVE}', wrong)
end
redis.call('HSET', target, '{FIELD_ALIASES}', count)
redis.call('HDEL', merged, '{FIELD_ALIASES}')
redis.call('HSET', merged, '{FIELD_ROOT}', target)
for i = 3, #KEYS do
  if redis.call('HGET', KEYS[i], '{FIELD_ROOT}') == merged then redis.call('HSET', KEYS[i], '{FIELD_ROOT}', target) end
end
return 1
"""


def answer_text(completion: bytes) -> str | None:
    decoded = decode_completion(completion)
    if decoded is None:
        return None
    content = decoded["choices"][0]["message"].get("content")
    return content if isinstance(content, str) else None


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    """What one answered miss taught.

    Attributes:
        same: Whether the candidate's answer was right.
        merged: Entries merged into the one the new question joined.
        recorded: ``False`` for a curated candidate: the model's answer does not judge it.
    """

    same: bool
    merged: int = 0
    recorded: bool = True


DocumentsOf = Callable[[str, str], Awaitable[set[str]]]


class AnswerLearner:
    """Turns each answered miss with a candidate into an observation, and maybe an alias.

    Args:
        redis: The Redis the cache lives in.
        embedder: Embeds answers to compare them (on its worker thread).
        analyzer: Content words and numbers of answers (the verification lexicon's).
        judge: The LLM judge, for categories with ``semantic.judge: async``: its verdict on the
            two questions takes the place of the answer comparison.
        documents_of: The documents of an entry, ``(version tag, entry key) -> keys``, to merge
            entries of one answer; without it entries are never merged.
        keys: The keyspace (a cluster bucket's when ``redis`` is its master).
        reads: The reader's reads after the response (candidates it is not trusted for yet).
        review: The review queue refused candidates go to (the console's); ``None``: none.
    """

    def __init__(self, redis: Redis, embedder: Embedder, analyzer: PairAnalyzer | None,
                 judge: Confirm | None = None, documents_of: DocumentsOf | None = None, keys: Keyspace = KEYS,
                 reads: ReadQueue | None = None, review: ReviewQueue | None = None) -> None:
        self._redis = redis
        self._reads = reads
        self._keys = keys
        self._judge = judge
        self._embedder = embedder
        self._analyzer = analyzer
        self._documents_of = documents_of
        self.observations = ObservationWriter(redis, keys)
        self._alias = redis.register_script(_ALIAS)
        self._merge = redis.register_script(_MERGE)
        self._approve = redis.register_script(_APPROVE)
        self._review = review

    async def equivalent(self, cached: bytes, fresh: bytes, policy: AdaptiveSemantic) -> bool:
        """Whether two answers say the same (see :meth:`equivalents`)."""
        return (await self.equivalents(fresh, [cached], policy))[0]

    async def equivalents(self, fresh: bytes, cached: list[bytes], policy: AdaptiveSemantic) -> list[bool]:
        """Whether each cached answer says the same as the fresh one: equal once normalised; else
        the same numbers and either embeddings at least ``answer_threshold`` alike or the shorter
        answer's content words at least ``answer_overlap`` found in the other. The answers left
        undecided are embedded in one call."""
        text = answer_text(fresh)
        verdicts: list[bool | None] = [None] * len(cached)
        if text is None:
            return [False] * len(cached)
        text = normalize_text(text).lower()
        profile = self._analyzer.profile(text) if self._analyzer is not None else None
        undecided: list[tuple[int, str]] = []
        for i, completion in enumerate(cached):
            other = answer_text(completion)
            if other is None:
                verdicts[i] = False
                continue
            other = normalize_text(other).lower()
            if other == text:
                verdicts[i] = True
                continue
            if profile is not None and self._analyzer is not None:
                theirs = self._analyzer.profile(other)
                if theirs.numbers != profile.numbers:
                    verdicts[i] = False
                    continue
                smaller = min(len(theirs.tokens), len(profile.tokens))
                if smaller and len(theirs.tokens & profile.tokens) / smaller >= policy.answer_overlap:
                    verdicts[i] = True
                    continue
            undecided.append((i, other))
        if undecided:
            # Learning takes one share of the model, beside each tenant's lookups (app/embed.py).
            vectors = await self._embedder.embed([text] + [other for _, other in undecided], owner="learning")
            for (i, _), vector in zip(undecided, vectors[1:], strict=True):
                verdicts[i] = float(vectors[0] @ vector) >= policy.answer_threshold
        return [bool(v) for v in verdicts]

    async def observe(self, query: CacheQuery, candidate: Candidate, fresh: bytes) -> Observed | None:
        """Record what the candidate would have been worth; alias the new question to it when
        the answers are equivalent (or, with ``judge: async``, when the judge says yes), else
        to a neighbouring entry whose answer is; merge the neighbouring entries of that answer.

        Returns:
            What was learnt; ``None`` when the judge failed (nothing recorded).
        """
        policy = query.category.semantic
        assert isinstance(policy, AdaptiveSemantic)
        neighbours = candidate.neighbours if self._documents_of is not None else ()
        judged = policy.judge_after_miss and self._judge is not None and query.canonical.question is not None
        if candidate.source != SOURCE_MODEL and not judged:
            # An operator's curated answer is authoritative: the model may not know the policy, so
            # its differing answer neither vetoes nor confirms it. Feedback and the judge do.
            return Observed(same=False, recorded=False)
        if judged:
            assert self._judge is not None and query.canonical.question is not None
            verdict = await self._judge.confirm(query.canonical.question, candidate.question, query.canonical.model)
            if verdict.reason == JUDGE_FAILED:
                return None
            same, neighbours = verdict.accepted, ()  # the judge speaks of questions, not answers
        else:
            verdicts = await self.equivalents(fresh, [candidate.answer] + [n.answer for n in neighbours], policy)
            same, neighbours = verdicts[0], tuple(n for n, ok in zip(neighbours, verdicts[1:], strict=True) if ok)
        rules = await self._rules_measured(query, candidate, same)
        # A check of a served hit is chosen, not drawn: it judges the document and its entry, never the pool.
        kind = Observation.VOUCHED_MISS if candidate.vouched or candidate.first_check else Observation.ANSWERED_MISS
        await self.observations.record(kind, query.version, query.category.name, query.canonical.tenant,
                                       document=candidate.key, root=candidate.root, similarity=candidate.similarity,
                                       score_bin=candidate.score_bin, same=same, explored=candidate.explored,
                                       rules=rules)
        # A far pair's disagreement is the pairing's (counted on the far record, which stops far
        # pairs), not the entry's answer for its intent: it refutes nothing its near askers get.
        if (candidate.intent or candidate.first_check) and (same or not candidate.far):
            await self.observations.mark_intent(candidate.key, candidate.root, right=same)
        if not same and (candidate.refused or candidate.first_check) and not candidate.explored \
                and self._review is not None and query.canonical.question is not None:
            await self._queue_for_review(query, candidate, fresh)
        entry = candidate.root if same else (neighbours[0].root if neighbours else None)
        if entry is None or policy.max_aliases <= 0:
            return Observed(same=same)
        new_key = self._keys.semantic_prefix(query.version) + query.entry_digest
        await self._alias(keys=[new_key, entry], args=[policy.max_aliases])
        merged = 0
        for neighbour in neighbours:
            if neighbour.root != entry:
                merged += await self.merge(query.version, entry, neighbour.root, policy)
        return Observed(same=same, merged=merged)

    async def _queue_for_review(self, query: CacheQuery, candidate: Candidate, fresh: bytes) -> None:
        """Queue a refused candidate whose answers did not agree for people to settle (the
        console's review queue): both questions, both answers. So is a served intent hit whose
        check disagreed (``check_disagreed``): people decide whether the cached answer was its
        intent's after all."""
        assert self._review is not None and query.canonical.question is not None
        asked_document = self._keys.semantic_prefix(query.version) + query.entry_digest
        await self._review.add(query.version, ReviewItem(
            id=item_id(asked_document, candidate.root), tenant=query.canonical.tenant, category=query.category.name,
            asked=query.canonical.question, asked_document=asked_document, asked_answer=answer_text(fresh) or "",
            cached=candidate.question, document=candidate.key, root=candidate.root,
            cached_answer=answer_text(candidate.answer) or "", similarity=round(candidate.similarity, 4),
            score_bin=candidate.score_bin, reason=candidate.refused or CHECK_DISAGREED))

    async def settle_review(self, tag: str, item: ReviewItem, approved: bool, policy: AdaptiveSemantic) -> bool:
        """A reviewer's verdict on a queued pair, as observations with the reviewer as source.

        Approved: the asked question's document becomes an alias of the candidate's entry, and the
        entry's record is confirmed at the pair's score as often as it needs to vouch there
        (``entry_confirmations``), and the veto the pair's differing answer set is lifted, so the next
        paraphrase is served. Rejected: the candidate's
        document and entry are vetoed at the pair's similarity and below. The pools do not count
        either (a reviewed pair is a chosen sample, not the traffic's).

        Returns:
            Whether the verdict took effect (``False``: the entry is gone, or the alias cap is full).
        """
        if not approved:
            await self.observations.record(Observation.REVIEW, tag, item.category, item.tenant, document=item.document,
                                           root=item.root, similarity=item.similarity, score_bin=item.score_bin,
                                           same=False)
            return True
        aliased = int(await self._alias(keys=[item.asked_document, item.root], args=[policy.max_aliases]))
        if aliased != 1:
            return False
        await self._approve(keys=[item.root, item.document], args=[
            observation_field(OBS_CONFIRMED, item.score_bin), max(1, policy.entry_confirmations),
            round(item.similarity * 1000), 1 if item.reason == CHECK_DISAGREED else 0])
        return True

    async def _rules_measured(self, query: CacheQuery, candidate: Candidate, same: bool) -> tuple[str, ...]:
        """The pool fields this answered candidate measures: the rule that vouched for it, and
        the reader's verdict if it reads it now (after the response, off the request path)."""
        rules = []
        if candidate.far:
            # Its own record: a far pair's wrong answer stops the far serves, not the near ones.
            return (OBS_INTENT_FAR_OK if same else OBS_INTENT_FAR_WRONG,)
        if candidate.probation:
            # Every probation hit is checked (or a drawn share of them): they are the rule's record,
            # per intent and by the pair's lower confidence.
            level = observation_field(OBS_INTENT_PROBATION_OK if same else OBS_INTENT_PROBATION_WRONG,
                                      candidate.probation_bin)
            return (probation_field(same, candidate.intent), level) if candidate.probation_bin >= 0 \
                else (probation_field(same, candidate.intent),)
        if candidate.first_check:
            return ()  # a served hit's check is chosen, not drawn: it judges the entry, not the rule
        if candidate.vouched:
            ok_kind, wrong_kind = VOUCH_KINDS[candidate.vouched]
            rules.append(observation_field(ok_kind if same else wrong_kind, candidate.score_bin))
        if candidate.intent:
            rules.append(intent_field(same, candidate.intent))
        if candidate.trial_bin >= 0:
            rules.append(observation_field(OBS_INTENT_TRIAL_OK if same else OBS_INTENT_TRIAL_WRONG, candidate.trial_bin))
        if candidate.reader_said_no:
            rules.append(observation_field(OBS_READER_NO_OK if same else OBS_READER_NO_WRONG, candidate.score_bin))
        elif candidate.read and self._reads is not None and query.canonical.question is not None:
            said = await self._reads.read(query.canonical.tenant, ReadPair(
                asked=query.canonical.question, cached=candidate.question, answer=answer_text(candidate.answer) or "",
                model=query.canonical.model, similarity=candidate.similarity))
            if said:
                rules.append(observation_field(OBS_READER_OK if same else OBS_READER_WRONG, candidate.score_bin))
            elif said is False:
                rules.append(observation_field(OBS_READER_NO_OK if same else OBS_READER_NO_WRONG, candidate.score_bin))
        return tuple(rules)

    async def merge(self, tag: str, entry: str, other: str, policy: AdaptiveSemantic) -> int:
        """Merge entry ``other`` into ``entry`` (their answers are equivalent); 1 if it was merged.

        Atomic per call; an alias added to ``other`` between reading its documents and the
        merge keeps pointing at ``other``, which then holds no record: it vouches for nothing.
        """
        assert self._documents_of is not None
        documents = await self._documents_of(tag, other)
        documents.discard(other)
        merged = await self._merge(keys=[entry, other, *sorted(documents)],
                                   args=[policy.max_aliases, f"{OBS_CONFIRMED}:"])
        return 1 if int(merged) == 1 else 0
