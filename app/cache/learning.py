"""Semantic hits learnt from the deployment's own traffic, under an error bound (issue #10).

Every miss is answered by the model anyway, so the answer the nearest cached question *would*
have served can be compared with the fresh one, for free. That comparison is an observation:
the candidate's decision score and whether the two answers are equivalent. Observations are
counted atomically in Redis, on the candidate's document and pooled per category and tenant, so
every worker and every Strata instance learns together (``redis-cli HGETALL strata:v1:obs:faq:<tenant>``),
and one tenant's traffic never moves what another tenant is served.

The decision (:func:`within_bound`): a candidate with score ``x`` is served when, among the
category's observations with a score of at least ``x`` (the hits a threshold at ``x`` would
serve), the Wilson upper bound of the wrong share at the category's confidence is at most
``semantic.error_bound``; and never when its own document has a wrong observation at a
similarity of at least its own. The score is the similarity plus half the margin over the
nearest document of another answer (see :func:`decision_score`): a question close to a cluster
of equivalent questions and far from any other answer is safer than its similarity alone says.

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

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from statistics import NormalDist

import msgspec
import numpy as np
from redis.asyncio import Redis

from app.cache.base import CacheQuery, Candidate
from app.cache.judge import JUDGE_FAILED
from app.cache.keys import (
    FIELD_ALIASES,
    FIELD_ANSWER,
    FIELD_EXPIRES_AT,
    FIELD_ROOT,
    FIELD_SCOPE,
    FIELD_SOURCE,
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_CONFIRMED,
    OBS_EXPLORED_OK,
    OBS_EXPLORED_WRONG,
    OBS_GUARD_OK,
    OBS_GUARD_WRONG,
    OBS_OK,
    OBS_WRONG,
    SOURCE_MODEL,
    Keyspace,
    normalize_text,
    observation_field,
)
from app.cache.verify import Confirm, PairAnalyzer
from app.embed import Embedder
from app.policy import SemanticPolicy
from app.wire import decode_completion

logger = logging.getLogger("strata.learning")

# Score bins are hundredths; a score stays below 1.5 (similarity <= 1, half a margin <= 0.5).
BINS = 160
MARGIN_WEIGHT = 0.5
# Pooled observations live as long as a month without a new one (they are kept fresh by use).
POOLED_TTL_S = 30 * 86400
# How long a worker reuses the pooled counts it read: the hit path costs no extra round trip
# per request, and other workers' observations arrive within this delay.
POOLED_REFRESH_S = 1.0

# Counts one observation on the document (only if it still exists: a miss must never create a
# key without TTL), in the tenant's pool of the category and in the category's figures; a wrong one
# also raises the highest wrong similarity of the document and of its entry (so every alias of the
# entry is vetoed there). An equivalent one also counts on the entry's own record (``confirmed:<bin>``).
# KEYS: document, category figures, entry, tenant pool. ARGV: field, wrong (0/1), similarity x1000,
# explored field or "", pool TTL, entry record field.
_OBSERVE = f"""
local function raise_wrong(key)
  if redis.call('EXISTS', key) == 0 then return end
  local seen = tonumber(redis.call('HGET', key, '{FIELD_WRONG_ABOVE}') or '-1')
  if tonumber(ARGV[3]) > seen then redis.call('HSET', key, '{FIELD_WRONG_ABOVE}', ARGV[3]) end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], 1) end
if ARGV[2] == '1' then
  raise_wrong(KEYS[1])
  raise_wrong(KEYS[3])
elseif redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
end
for _, pool in ipairs({{KEYS[2], KEYS[4]}}) do
  redis.call('HINCRBY', pool, ARGV[1], 1)
  if ARGV[4] ~= '' then redis.call('HINCRBY', pool, ARGV[4], 1) end
  redis.call('EXPIRE', pool, ARGV[5])
end
return 1
"""

# Counts, on an entry that still exists, whether a candidate a guard turned down had its answer.
# KEYS: entry. ARGV: field (guard_ok:<guard> or guard_wrong:<guard>).
_COUNT_GUARD = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], 1) end
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


def decision_score(similarity: float, other_answer_similarity: float | None, floor: float) -> float:
    """Similarity plus half its margin over the nearest document serving another answer (the
    band's floor when none is among the candidates)."""
    nearest_other = floor if other_answer_similarity is None else max(other_answer_similarity, floor)
    return similarity + MARGIN_WEIGHT * max(0.0, similarity - nearest_other)


def score_bin(score: float) -> int:
    return max(0, min(BINS - 1, int(score * 100)))


def wilson_interval(wrong: float, total: float, z: float) -> tuple[float, float]:
    """Wilson bounds of a wrong share, ``z`` standard errors either side; (0, 1) with no observations."""
    if total <= 0:
        return 0.0, 1.0
    p = wrong / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    scale = 1 + z * z / total
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def wilson_upper(wrong: float, total: float, z: float) -> float:
    return wilson_interval(wrong, total, z)[1]


def z_of(confidence: float) -> float:
    """One-sided z of a confidence level (0.85 -> 1.04)."""
    return NormalDist().inv_cdf(confidence)


class PooledCounts:
    """A category's pooled observations as suffix sums: ``ok[b]`` is the number of equivalent
    observations with a score bin of at least ``b``."""

    def __init__(self, fields: dict[str, int]) -> None:
        ok, wrong = np.zeros(BINS + 1), np.zeros(BINS + 1)
        for name, count in fields.items():
            kind, _, number = name.partition(":")
            if number.isdigit() and int(number) < BINS:
                (ok if kind == OBS_OK else wrong if kind == OBS_WRONG else np.zeros(BINS + 1))[int(number)] += count
        self.ok = np.cumsum(ok[::-1])[::-1]
        self.wrong = np.cumsum(wrong[::-1])[::-1]
        self.explored_ok = fields.get(OBS_EXPLORED_OK, 0)
        self.explored_wrong = fields.get(OBS_EXPLORED_WRONG, 0)

    def at_or_above(self, bin_: int) -> tuple[int, int]:
        """(wrong, total) of the observations at this score bin or higher."""
        wrong = int(self.wrong[bin_])
        return wrong, wrong + int(self.ok[bin_])


class PooledObservations:
    """Reads pooled counts per (version, category, tenant), reusing them for ``POOLED_REFRESH_S``.

    Args:
        redis: The Redis of the keyspace.
        refresh_s: How long counts read are reused.
        keys: The keyspace.
        sources: Every (Redis, keyspace) whose counts make up the pool, summed: on a cluster each
            bucket counts the observations of its own entries, and the category's prior is all of
            them. Only this keyspace's when empty.
    """

    def __init__(self, redis: Redis, refresh_s: float = POOLED_REFRESH_S, keys: Keyspace = KEYS,
                 sources: Sequence[tuple[Redis, Keyspace]] = ()) -> None:
        self._keys = keys
        self._sources = list(sources) or [(redis, keys)]
        self._refresh_s = refresh_s
        self._cache: dict[str, tuple[float, PooledCounts]] = {}

    async def counts(self, tag: str, category: str, tenant: str | None = None) -> PooledCounts:
        """A tenant's pooled counts in a category (what its decisions read), or every tenant's
        together with ``tenant=None`` (the category's live figures)."""
        key = self._keys.observations_key(tag, category, tenant)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._refresh_s:
            return cached[1]
        raws = await asyncio.gather(*(redis.hgetall(keys.observations_key(tag, category, tenant))
                                      for redis, keys in self._sources))
        fields: Counter[str] = Counter()
        for raw in raws:
            fields.update({k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()})
        counts = PooledCounts(dict(fields))
        self._cache[key] = (now, counts)
        return counts

    def forget(self, tag: str, category: str, tenant: str | None = None) -> None:
        self._cache.pop(self._keys.observations_key(tag, category, tenant), None)


def within_bound(counts: PooledCounts, bin_: int, policy: SemanticPolicy, *, prior: bool = False) -> bool:
    """Whether the category's observations at this score or above keep wrong hits under the bound.

    Without a prior the observations must show it (upper bound at most the bound); with one (the
    similarity reached ``accept_above``) they must merely not refute it (lower bound at most the
    bound), so a prior that does not fit the deployment's questions is withdrawn by its traffic.
    """
    assert policy.error_bound is not None
    wrong, total = counts.at_or_above(bin_)
    lower, upper = wilson_interval(wrong, total, z_of(policy.confidence))
    return (lower if prior else upper) <= policy.error_bound


# An entry that was ever wrong within this similarity of a candidate does not vouch for it.
ENTRY_WRONG_GAP = 0.05


def entry_record_fields(floor: float, bin_: int) -> list[str]:
    """The entry's record fields an entry-record decision reads: confirmations at scores from
    the band's floor up to the candidate's bin, and the entry's highest wrong similarity."""
    return [FIELD_WRONG_ABOVE] + [observation_field(OBS_CONFIRMED, b) for b in range(score_bin(floor), bin_ + 1)]


def entry_vouches(values: list[bytes | str | None], similarity: float, policy: SemanticPolicy) -> bool:
    """Whether an entry's record (the values of :func:`entry_record_fields`) vouches for a
    candidate: confirmed at least ``entry_confirmations`` times at a score no higher than the
    candidate's, and never wrong within ``ENTRY_WRONG_GAP`` below its similarity or above.

    Questions that reached this entry at lower scores had its answer, so a closer one is
    likely to; what is new near it (another intent arriving) is caught by the margin and the
    entry's wrong observations, and the pooled bound still governs everything else.
    """
    wrong_above = int(values[0] or -1)
    if wrong_above >= 0 and similarity * 1000 <= wrong_above + ENTRY_WRONG_GAP * 1000:
        return False
    return sum(int(v or 0) for v in values[1:]) >= policy.entry_confirmations


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
    """

    same: bool
    merged: int = 0


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
    """

    def __init__(self, redis: Redis, embedder: Embedder, analyzer: PairAnalyzer | None,
                 judge: Confirm | None = None, documents_of: DocumentsOf | None = None, keys: Keyspace = KEYS) -> None:
        self._redis = redis
        self._keys = keys
        self._judge = judge
        self._embedder = embedder
        self._analyzer = analyzer
        self._documents_of = documents_of
        self._observe = redis.register_script(_OBSERVE)
        self._alias = redis.register_script(_ALIAS)
        self._merge = redis.register_script(_MERGE)
        self._count_guard = redis.register_script(_COUNT_GUARD)

    async def equivalent(self, cached: bytes, fresh: bytes, policy: SemanticPolicy) -> bool:
        """Whether two answers say the same (see :meth:`equivalents`)."""
        return (await self.equivalents(fresh, [cached], policy))[0]

    async def equivalents(self, fresh: bytes, cached: list[bytes], policy: SemanticPolicy) -> list[bool]:
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
        A candidate a guard turned down (and a nearer document one turned down) teaches its entry
        whether that guard matters for it (``guard_ok:<guard>`` / ``guard_wrong:<guard>``), not
        the category's pool.

        Returns:
            What was learnt; ``None`` when the judge failed (nothing recorded).
        """
        policy = query.category.semantic
        neighbours = candidate.neighbours if self._documents_of is not None else ()
        if policy.judge_after_miss and self._judge is not None and query.canonical.question is not None:
            verdict = await self._judge.confirm(query.canonical.question, candidate.question, query.canonical.model)
            if verdict.reason == JUDGE_FAILED:
                return None
            same, neighbours = verdict.accepted, ()  # the judge speaks of questions, not answers
        else:
            turned = [candidate.turned_down.answer] if candidate.turned_down is not None else []
            verdicts = await self.equivalents(fresh, [candidate.answer, *turned] + [n.answer for n in neighbours], policy)
            if candidate.turned_down is not None:
                turned_down, turned_same = candidate.turned_down, verdicts.pop(1)
                await self._count_guard(keys=[turned_down.root],
                                        args=[f"{OBS_GUARD_OK if turned_same else OBS_GUARD_WRONG}:{turned_down.guard}"])
            same, neighbours = verdicts[0], tuple(n for n, ok in zip(neighbours, verdicts[1:], strict=True) if ok)
        if candidate.guard:
            # Whether the guard mattered for this entry; also once lifted, so a miss with another
            # answer puts it back.
            await self._count_guard(keys=[candidate.root],
                                    args=[f"{OBS_GUARD_OK if same else OBS_GUARD_WRONG}:{candidate.guard}"])
        if not candidate.guard or candidate.guard_lifted:
            field = observation_field(OBS_OK if same else OBS_WRONG, candidate.score_bin)
            explored = (OBS_EXPLORED_OK if same else OBS_EXPLORED_WRONG) if candidate.explored else ""
            await self._observe(
                keys=[candidate.key, self._keys.observations_key(query.version, query.category.name), candidate.root,
                      self._keys.observations_key(query.version, query.category.name, query.canonical.tenant)],
                args=[field, "0" if same else "1", round(candidate.similarity * 1000), explored, POOLED_TTL_S,
                      observation_field(OBS_CONFIRMED, candidate.score_bin)],
            )
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

    async def merge(self, tag: str, entry: str, other: str, policy: SemanticPolicy) -> int:
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
