"""The adaptive decision: whether a semantic candidate is served, under an error bound (#10).

Every miss is answered by the model anyway, so what the nearest cached question *would* have
served can be compared with the fresh answer for free (app/cache/learning.py records it). This
module reads those observations back and decides, for one KNN result, in one call
(:meth:`AdaptiveDecision.decide`):

- the guards first (app/cache/verify.py); a guard an entry has outgrown (``guard_lift``) lets
  its candidates through;
- the **score**: the similarity plus half its margin over the nearest document of another
  answer (:func:`decision_score`), binned in hundredths;
- the **pool**: among the tenant's observations in the category with a score of at least the
  candidate's, the Wilson bound of the wrong share at the category's confidence must be at most
  ``error_bound`` (:func:`within_bound`): the upper bound below ``accept_above``, the lower bound
  from it (the prior, withdrawn by the traffic that refutes it);
- the **entry record**: below what the pool allows, an entry confirmed often enough at lower
  scores and never wrong near this similarity vouches for the candidate (:func:`entry_vouches`);
- a document or entry that was wrong at this similarity or above never serves it.

A would-be hit is explored at the policy's rate (sent upstream anyway, to measure the error of
served hits); everything not served is a candidate to learn from. The same figures give the
category's live precision (:meth:`AdaptiveDecision.precision`, on ``/health`` and ``/metrics``).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from statistics import NormalDist

import msgspec
import numpy as np
from redis.asyncio import Redis

from app.cache.base import CacheQuery, Candidate, CorruptEntry, Nearest, Neighbour, TurnedDown, Verdict
from app.cache.keys import (
    FIELD_ANSWER,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SOURCE,
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_CONFIRMED,
    OBS_EXPLORED_OK,
    OBS_EXPLORED_WRONG,
    OBS_GUARD_OK,
    OBS_GUARD_WRONG,
    OBS_OK,
    OBS_READER_NO_OK,
    OBS_READER_NO_WRONG,
    OBS_READER_OK,
    OBS_READER_WRONG,
    OBS_RECORD_OK,
    OBS_RECORD_WRONG,
    OBS_WRONG,
    SOURCE_MODEL,
    VOUCH_READER,
    VOUCH_RECORD,
    Keyspace,
    as_text,
    observation_field,
)
from app.cache.verify import (
    ABOVE_BAND,
    CURATED_WORDING,
    ENTRY_RECORD,
    OUTSIDE_BOUND,
    READER_ACCEPTED,
    READER_REJECTED,
    RECORD_UNPROVEN,
    WITHIN_BOUND,
    WRONG_BEFORE,
    CandidateCheck,
)
from app.policy import SemanticPolicy
from app.readers.base import READ_FAILED, READ_NO, READ_YES, Reader, ReadPair

# Score bins are hundredths; a score stays below 1.5 (similarity <= 1, half a margin <= 0.5).
BINS = 160
MARGIN_WEIGHT = 0.5
# How long a worker reuses the pooled counts it read: the hit path costs no extra round trip
# per request, and other workers' observations arrive within this delay.
POOLED_REFRESH_S = 1.0
# An entry that was ever wrong within this similarity of a candidate does not vouch for it.
ENTRY_WRONG_GAP = 0.05
# ... unless confirmed this many times the record's usual evidence at scores above the wrong
# similarity plus the gap: the wrong one was another intent further out, and the entry's answer
# has held closer in since (docs/QUALITY.md, issue #24).
ENTRY_WRONG_OUTWEIGHED_BY = 2
# Other entries of model answers handed to the learner with a candidate: the nearest few are
# where a second entry of the same answer would be.
NEIGHBOURS = 3
# Answers a reader on the request path reads per lookup: the nearest only. Reading the next one
# after a no was measured (docs/QUALITY.md): with a perfect reader it added 0.7 points of CLINC150,
# and its yes there is another sample than the one its trust was measured on (a noisy reader
# broke the bound through it).
READS_PER_LOOKUP = 1
# The base rate of wrong candidates a reader's trust uses is the pool's within this many score
# bins either side of the candidate's (the rate changes with the score; one bin holds too few).
READER_BASE_BAND = 2
# The confidence a reader's yes is measured at before it serves: higher than a category's usual
# 85%, because a reader's errors are not seen once it serves (only its explored hits are), and a
# reader wrong on a fifth of pairs, where most candidates are right, has a wrong yes at about
# the bound; at 85% it passed by chance (docs/QUALITY.md). About 270 clean yes at 1%.
READER_CONFIDENCE = 0.95


def decision_score(similarity: float, other_answer_similarity: float | None, floor: float) -> float:
    """Similarity plus half its margin over the nearest document serving another answer (the
    band's floor when none is among the candidates)."""
    nearest_other = floor if other_answer_similarity is None else max(other_answer_similarity, floor)
    return similarity + MARGIN_WEIGHT * max(0.0, similarity - nearest_other)


def score_bin(score: float) -> int:
    """The bin of a decision score (hundredths, clipped to ``[0, BINS)``)."""
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
    """The upper Wilson bound of a wrong share."""
    return wilson_interval(wrong, total, z)[1]


def z_of(confidence: float) -> float:
    """One-sided z of a confidence level (0.85 -> 1.04)."""
    return NormalDist().inv_cdf(confidence)


# Per-bin kinds of a pool: the answered misses' own, and those of the rules that vouch beside it.
_BINNED_KINDS = (OBS_OK, OBS_WRONG, OBS_RECORD_OK, OBS_RECORD_WRONG, OBS_READER_OK, OBS_READER_WRONG,
                 OBS_READER_NO_OK, OBS_READER_NO_WRONG)
# Each vouching rule's (right, wrong) kinds.
VOUCH_KINDS = {VOUCH_RECORD: (OBS_RECORD_OK, OBS_RECORD_WRONG), VOUCH_READER: (OBS_READER_OK, OBS_READER_WRONG)}


class PooledCounts:
    """A category's pooled observations as suffix sums: ``ok[b]`` is the number of equivalent
    observations with a score bin of at least ``b``; the same for each vouching rule's outcomes.

    Args:
        fields: The pool's hash fields (``ok:<bin>``, ``wrong:<bin>``, ``record_ok:<bin>``,
            ``explored_ok``, ...) and counts.
    """

    def __init__(self, fields: dict[str, int]) -> None:
        binned = {kind: np.zeros(BINS + 1) for kind in _BINNED_KINDS}
        for name, count in fields.items():
            kind, _, number = name.partition(":")
            if number.isdigit() and int(number) < BINS and kind in binned:
                binned[kind][int(number)] += count
        self._suffix = {kind: np.cumsum(counts[::-1])[::-1] for kind, counts in binned.items()}
        self.ok, self.wrong = self._suffix[OBS_OK], self._suffix[OBS_WRONG]
        self.explored_ok = fields.get(OBS_EXPLORED_OK, 0)
        self.explored_wrong = fields.get(OBS_EXPLORED_WRONG, 0)
        # A reader's no, every bin (and the unbinned count older pools hold).
        self.reader_no_ok = fields.get(OBS_READER_NO_OK, 0) + int(self._suffix[OBS_READER_NO_OK][0])
        self.reader_no_wrong = fields.get(OBS_READER_NO_WRONG, 0) + int(self._suffix[OBS_READER_NO_WRONG][0])

    def at_or_above(self, bin_: int) -> tuple[int, int]:
        """(wrong, total) of the observations at this score bin or higher."""
        wrong = int(self.wrong[bin_])
        return wrong, wrong + int(self.ok[bin_])

    def vouched_at_or_above(self, rule: str, bin_: int) -> tuple[int, int]:
        """(wrong, total) of the candidates a rule (``record``, ``reader``) vouched for at this
        score bin or higher, counted against the model's answer."""
        ok_kind, wrong_kind = VOUCH_KINDS[rule]
        wrong = int(self._suffix[wrong_kind][bin_])
        return wrong, wrong + int(self._suffix[ok_kind][bin_])

    def within(self, low: int, high: int) -> tuple[int, int]:
        """(wrong, total) of the observations with a score bin in ``[low, high)``."""
        low, high = max(0, low), min(BINS, high)
        if low >= high:
            return 0, 0
        wrong = int(self.wrong[low] - self.wrong[high])
        return wrong, wrong + int(self.ok[low] - self.ok[high])

    def reader_rates(self, bin_: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The reader's verdicts at this score bin or higher, split by what the model answered:
        ((yes, total) on pairs of another answer, (yes, total) on pairs of the same answer)."""
        said_yes_wrong = int(self._suffix[OBS_READER_WRONG][bin_])
        said_yes_same = int(self._suffix[OBS_READER_OK][bin_])
        said_no_wrong = int(self._suffix[OBS_READER_NO_WRONG][bin_])
        said_no_same = int(self._suffix[OBS_READER_NO_OK][bin_])
        return (said_yes_wrong, said_yes_wrong + said_no_wrong), (said_yes_same, said_yes_same + said_no_same)


class PooledObservations:
    """Reads pooled counts per (version, category, tenant), reusing them for ``refresh_s``.

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
            fields.update({str(as_text(k)): int(v) for k, v in raw.items()})
        counts = PooledCounts(dict(fields))
        self._cache[key] = (now, counts)
        return counts

    def forget(self, tag: str, category: str, tenant: str | None = None) -> None:
        """Drop the counts read for a pool, so the next decision reads them again."""
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


def prior_has_evidence(counts: PooledCounts, bin_: int, policy: SemanticPolicy) -> bool:
    """Whether the pool has seen enough at this score or above for the prior to speak: at least
    1 / error_bound observations (fewer cannot tell a wrong share of error_bound from none)."""
    assert policy.error_bound is not None
    return counts.at_or_above(bin_)[1] >= math.ceil(1 / policy.error_bound)


def rule_trusted(counts: PooledCounts, rule: str, bin_: int, policy: SemanticPolicy,
                 confidence: float | None = None) -> bool:
    """Whether a vouching rule has been measured right often enough at this score or above:
    the Wilson upper bound of the wrong share of what it vouched for there is at most the bound
    (about 110 clean verdicts at the shipped 1% and 85% confidence), at ``confidence`` if given
    (else the category's)."""
    assert policy.error_bound is not None
    wrong, total = counts.vouched_at_or_above(rule, bin_)
    return wilson_upper(wrong, total, z_of(confidence or policy.confidence)) <= policy.error_bound


def reader_error_here(counts: PooledCounts, bin_: int, policy: SemanticPolicy) -> float:
    """How often the reader's yes is wrong at this very score, as far as its rates tell.

    Bayes over what was measured: the reader's rate of yes on pairs of another answer (``alpha``)
    and on pairs of the same answer (``beta``), each over its verdicts at this score or above (a
    reader misled by twins is misled more at high scores, so the low bins borrow the harder
    cases), and the wrong share of the candidates near this score (``p``: the pool's observations
    within ``READER_BASE_BAND`` bins, at its Wilson upper bound). A reader right on 80% of pairs is
    wrong on half its yes where most candidates are wrong, however often it was right higher up.
    """
    (yes_other, other), (yes_same, same) = counts.reader_rates(bin_)
    if not same:
        return 1.0
    alpha, beta = (yes_other / other if other else 0.0), yes_same / same
    wrong, total = counts.within(bin_ - READER_BASE_BAND, bin_ + READER_BASE_BAND + 1)
    p = wilson_upper(wrong, total, z_of(policy.confidence))
    wrong_yes, right_yes = alpha * p, beta * (1 - p)
    if not wrong_yes:
        return 0.0  # never a yes on a pair of another answer: nothing says it errs
    return wrong_yes / (wrong_yes + right_yes)


def reader_trusted(counts: PooledCounts, bin_: int, policy: SemanticPolicy) -> bool:
    """Whether the reader's yes may serve at this score bin: measured within the bound at this
    score or above (:func:`rule_trusted`), and not wrong too often at this score by its rates
    (:func:`reader_error_here`): the first is the guarantee, the second keeps high scores, where
    it is nearly always right, from vouching for low ones, where it would not be."""
    assert policy.error_bound is not None
    confidence = max(policy.confidence, READER_CONFIDENCE)
    return rule_trusted(counts, VOUCH_READER, bin_, policy, confidence) \
        and reader_error_here(counts, bin_, policy) <= policy.error_bound


def entry_record_fields(floor: float, bin_: int) -> list[str]:
    """The entry's record fields an entry-record decision reads: confirmations at scores from
    the band's floor up to the candidate's bin, and the entry's highest wrong similarity."""
    return [FIELD_WRONG_ABOVE] + [observation_field(OBS_CONFIRMED, b) for b in range(score_bin(floor), bin_ + 1)]


def entry_vouches(values: Sequence[bytes | str | None], similarity: float, policy: SemanticPolicy) -> bool:
    """Whether an entry's record (the values of :func:`entry_record_fields`) vouches for a
    candidate: confirmed at least ``entry_confirmations`` times at a score no higher than the
    candidate's, and never wrong at its similarity or above; wrong within ``ENTRY_WRONG_GAP``
    below it only when confirmed ``ENTRY_WRONG_OUTWEIGHED_BY`` times as often at scores above
    that wrong similarity plus the gap.

    Questions that reached this entry at lower scores had its answer, so a closer one is
    likely to; what is new near it (another intent arriving) is caught by the margin and the
    entry's wrong observations, and the pooled bound still governs everything else.
    """
    wrong_above = int(values[0] or -1)
    confirmations = [int(v or 0) for v in values[1:]]
    if wrong_above >= 0 and similarity * 1000 <= wrong_above + ENTRY_WRONG_GAP * 1000:
        if milli(similarity) <= wrong_above:
            return False  # at a similarity where the entry was wrong, or below: never
        # Just above where it was wrong: only on ENTRY_WRONG_OUTWEIGHED_BY times the evidence
        # the record needs, all of it from closer in than the wrong observation and the gap.
        closer = score_bin(wrong_above / 1000 + ENTRY_WRONG_GAP) - score_bin(policy.threshold)
        return sum(confirmations[max(0, closer):]) >= ENTRY_WRONG_OUTWEIGHED_BY * policy.entry_confirmations
    return sum(confirmations) >= policy.entry_confirmations


_NOT_A_WORD = re.compile(r"[\W_]+")


def same_wording(asked: str, cached: bytes | str) -> bool:
    """Whether two questions are one wording, up to case, spaces and punctuation (how a curated
    answer's own question or variant is asked again). Narrower than
    :meth:`CandidateCheck.same_content` on purpose: "why must I verify my identity" and "how do
    I verify my identity" share their content words, not their wording."""
    folded = _NOT_A_WORD.sub("", asked.casefold())
    return bool(folded) and folded == _NOT_A_WORD.sub("", str(as_text(cached)).casefold())


def entry_may_vouch(policy: SemanticPolicy, similarity: float, score: float) -> bool:
    """Whether an entry's record is worth reading: on, the score above its floor, and no
    other answer within ``entry_margin`` (the score holds half the margin)."""
    margin = (score - similarity) / MARGIN_WEIGHT
    return policy.entry_confirmations > 0 and score >= policy.entry_floor and margin >= policy.entry_margin


def milli(similarity: float) -> int:
    """Similarity in thousandths, rounded down: a wrong observation recorded (rounded) at 0.823
    vetoes every similarity up to 0.8239."""
    return int(similarity * 1000)


def check_row(row: Nearest) -> None:
    """Raises CorruptEntry for a document without its question or answer (a cache failure)."""
    if not row.fields.get(FIELD_QUESTION) or not row.fields.get(FIELD_ANSWER):
        raise CorruptEntry(f"semantic entry {row.key} lacks its question or answer")


def root_of(row: Nearest) -> str:
    """The entry whose answer a document serves (itself when it is an entry)."""
    return as_text(row.fields.get(FIELD_ROOT)) or row.key


def source_of(row: Nearest) -> str:
    """``model`` or ``faq``: who wrote a document's answer."""
    return as_text(row.fields.get(FIELD_SOURCE)) or SOURCE_MODEL


def answer_bytes(row: Nearest) -> bytes:
    answer = row.fields[FIELD_ANSWER]
    return answer.encode() if isinstance(answer, str) else bytes(answer)


def neighbours_of(root: str, row: Nearest, rows: Sequence[Nearest], floor: float) -> tuple[Neighbour, ...]:
    """Entries of model answers in the band other than the candidate's, nearest first (none for
    a curated candidate: operators' entries are never merged)."""
    if source_of(row) != SOURCE_MODEL:
        return ()
    found: dict[str, Neighbour] = {}
    for other in rows:
        other_root = root_of(other)
        if other.similarity < floor or len(found) == NEIGHBOURS:
            break
        if other_root != root and other_root not in found and source_of(other) == SOURCE_MODEL \
                and other.fields.get(FIELD_ANSWER):
            found[other_root] = Neighbour(root=other_root, answer=answer_bytes(other))
    return tuple(found.values())


class Serve(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate the decision serves.

    Attributes:
        row: The document that matched.
        reason: Why (``above_band``, ``within_bound``, ``entry_record``).
        score_bin: Its decision score's bin (what an observation of it counts under).
    """

    row: Nearest
    reason: str
    score_bin: int


class RuleFigures(msgspec.Struct, frozen=True, kw_only=True):
    """How a rule that vouches beside the pool (the entry record, the reader) has fared in a
    category, every tenant together (a tenant's own pool decides for its requests).

    Attributes:
        vouched: Candidates it vouched for (the record) or said yes to (the reader), answered by
            the model (while it was measured, or explored since).
        wrong: Of them, with another answer than the candidate's.
        trusted_from: The lowest score from which it is trusted (``None``: nowhere yet).
        status: ``measuring`` (fewer than 1 / error_bound verdicts), ``trusted`` (somewhere in
            the band) or ``ignored`` (measured, and wrong too often at every score).
    """

    vouched: int
    wrong: int
    trusted_from: float | None
    status: str


def rule_figures(counts: PooledCounts, rule: str, policy: SemanticPolicy) -> RuleFigures:
    """A rule's figures in a pool (see :class:`RuleFigures`)."""
    assert policy.error_bound is not None
    start = score_bin(policy.threshold)
    wrong, total = counts.vouched_at_or_above(rule, start)
    trusted = next((b for b in range(start, BINS) if counts.vouched_at_or_above(rule, b)[1]
                    and (reader_trusted(counts, b, policy) if rule == VOUCH_READER
                         else rule_trusted(counts, rule, b, policy))), None)
    status = "trusted" if trusted is not None else "measuring" if total < 1 / policy.error_bound else "ignored"
    return RuleFigures(vouched=total, wrong=wrong, trusted_from=None if trusted is None else trusted / 100,
                       status=status)


class Precision(msgspec.Struct, frozen=True, kw_only=True):
    """An adaptive category's live figures, every tenant's observations together.

    Attributes:
        error_bound: The category's bound.
        observations: Observations recorded (answered misses with a candidate).
        observed_wrong: Of them, with another answer than the candidate's.
        explored: Would-be hits sent upstream to check the estimate.
        explored_wrong: Of them, wrong: the share estimates the error of served hits.
        error_upper_bound: Wilson's upper bound of that share at the category's confidence
            (``None`` before the first explored hit).
        status: ``too_few_explored`` (below 1/bound explored hits even a clean record cannot
            show the bound holds), ``above_bound`` or ``within_bound``.
        record: How the entry record's vouching fared.
        reader: How the reader's yes fared (``None`` without a reader).
        reader_no: The reader's no: (the answer was the candidate's after all, it was not).
    """

    error_bound: float
    observations: int
    observed_wrong: int
    explored: int
    explored_wrong: int
    error_upper_bound: float | None
    status: str
    record: RuleFigures | None = None
    reader: RuleFigures | None = None
    reader_no: tuple[int, int] = (0, 0)

    @property
    def error_estimate(self) -> float | None:
        return self.explored_wrong / self.explored if self.explored else None


class AdaptiveDecision:
    """An adaptive category's decision on the nearest documents of a question.

    Args:
        redis: The Redis holding the entries (their records are read for would-be hits only).
        check: The guards, and where every verdict is counted.
        pooled: The pooled observations of the keyspace.
        keys: The keyspace (where the served questions are remembered).
        seed: Seed of the exploration draws: random across questions and across repeats of one
            question (a question served wrongly is checked again), and seeded, so that a replay
            of a stream in one process makes the same draws every time.
        reader: The reader of the grey zone (app/readers); ``None``: none, whatever the policy says.
        on_read: Counts a synchronous reader's verdict ``(reader name, yes|no|failed)``.
    """

    def __init__(self, redis: Redis, check: CandidateCheck, pooled: PooledObservations, *, seed: int = 0,
                 keys: Keyspace = KEYS, reader: Reader | None = None,
                 on_read: Callable[[str, str], None] | None = None) -> None:
        self._redis = redis
        self._keys = keys
        self._check = check
        self.pooled = pooled
        self._explore = random.Random(seed)
        self.reader = reader
        self._on_read = on_read or (lambda reader, verdict: None)

    async def decide(self, query: CacheQuery, question: str, rows: Sequence[Nearest]) -> Serve | Candidate | None:
        """Decide on the nearest candidate the guards let through.

        Args:
            query: The planned query (its category is adaptive).
            question: The asked question.
            rows: The KNN result, most similar first.

        Returns:
            The candidate to serve; or one to learn from once the model has answered (not
            served, explored, or the nearest one a guard turned down); or ``None``.

        Raises:
            CorruptEntry: A document in the band lacks its question or answer (a cache failure).
        """
        policy = query.category.semantic
        turned_down: Candidate | None = None
        refused: Candidate | None = None  # the nearest one the reader said no to: what the miss learns from
        read_no: set[str] = set()  # entries the reader said no to
        for row in rows:
            if row.similarity < policy.threshold:
                break
            check_row(row)
            root = root_of(row)
            if root in read_no:
                continue  # another document of an answer the reader refused
            guard = self._check.guard(question, row.fields[FIELD_QUESTION]) or ""
            lifted = bool(guard) and await self._guard_lifted(root, guard, policy)
            if guard and not lifted:
                self._check.held(guard)
                if turned_down is None and policy.guard_lift > 0 and source_of(row) == SOURCE_MODEL:
                    turned_down = _candidate(row, root, rows, 0, policy, guard=guard)
                continue
            others = [other.similarity for other in rows if root_of(other) != root]
            score = decision_score(row.similarity, max(others) if others else None, policy.threshold)
            bin_ = score_bin(score)
            verdict, vouched = await self._verdict(query, question, row, root, bin_, score)
            read = False
            if not verdict.accepted and verdict.reason in (OUTSIDE_BOUND, RECORD_UNPROVEN) and self.reader is not None \
                    and policy.reader != "off":
                verdict, vouched, read = await self._read(query, question, row, bin_, verdict, vouched)
            self._check.count(verdict)
            candidate = _candidate(row, root, rows, bin_, policy, guard=guard, lifted=lifted)
            # A trusted reader's yes is measured only when explored, so its no is counted at the
            # same rate: its two rates stay unbiased once it serves.
            said_no = verdict.reason == READER_REJECTED and self._explore.random() < policy.explore
            candidate = msgspec.structs.replace(candidate, vouched=vouched, read=read, reader_said_no=said_no,
                                                refused="" if verdict.accepted else verdict.reason)
            if turned_down is not None:  # learn about the guard of the nearer one too
                candidate = msgspec.structs.replace(candidate, turned_down=TurnedDown(
                    root=turned_down.root, answer=turned_down.answer, guard=turned_down.guard))
            rate = policy.entry_explore if verdict.reason == ENTRY_RECORD else policy.explore
            if candidate.source != SOURCE_MODEL:
                rate = 0.0  # a model's answer does not judge a curated one: exploring it teaches nothing
            elif verdict.accepted and policy.repeat_explore > rate and await self._served_before(query):
                # Served before and asked again: check it more often than a fresh question, so a
                # wrong answer is not repeated silently (its explored repeat vetoes it).
                rate = policy.repeat_explore
                candidate = msgspec.structs.replace(candidate, repeat=True)
            if verdict.accepted and rate and self._explore.random() < rate:
                return msgspec.structs.replace(candidate, explored=True)
            if verdict.accepted:
                return Serve(row=row, reason=verdict.reason, score_bin=bin_)
            if verdict.reason == READER_REJECTED and len(read_no) + 1 < READS_PER_LOOKUP:
                # Its no says the nearest answer is not this question's; the next answer may be.
                read_no.add(root)
                refused = refused or candidate
                continue
            return refused or candidate
        return refused or turned_down

    async def _verdict(self, query: CacheQuery, question: str, row: Nearest, root: str, bin_: int,
                       score: float) -> tuple[Verdict, str]:
        """The verdict on one candidate the guards let through (not counted yet), and the rule
        that vouched for it beside the pool (``record`` or ""): the document's own wrong record,
        then the pool (with the prior from ``accept_above``), then the entry's record, trusted
        where the pool measured it (``semantic.entry_evidence``)."""
        policy = query.category.semantic
        similarity = row.similarity
        wrong_before = milli(similarity) <= int(row.fields.get(FIELD_WRONG_ABOVE) or -1)
        if not wrong_before and source_of(row) != SOURCE_MODEL and same_wording(question, row.fields[FIELD_QUESTION]):
            # Feedback may still have vetoed the curated entry (its variants share the veto).
            if root == row.key or milli(similarity) > int(await self._redis.hget(root, FIELD_WRONG_ABOVE) or -1):
                return Verdict(True, CURATED_WORDING), ""
            return Verdict(False, WRONG_BEFORE), ""
        counts = await self.pooled.counts(query.version, query.category.name, query.canonical.tenant)
        prior = similarity >= policy.accept_above and (
            not policy.prior_evidence or prior_has_evidence(counts, bin_, policy)
            or self._check.same_content(question, row.fields[FIELD_QUESTION]))
        within = not wrong_before and within_bound(counts, bin_, policy, prior=prior)
        entry = False
        if within and root != row.key:
            # A wrong observation on any document of the entry vetoes its aliases too; read only
            # for would-be hits, so misses cost no extra round trip.
            wrong_before = milli(similarity) <= int(await self._redis.hget(root, FIELD_WRONG_ABOVE) or -1)
            within = not wrong_before
        elif not within and not wrong_before and entry_may_vouch(policy, similarity, score):
            # Below what the pool allows, the entry's own record may (one read of its fields).
            values = await self._redis.hmget(root, entry_record_fields(policy.threshold, bin_))
            entry = entry_vouches(values, similarity, policy)
            if entry and policy.entry_evidence and not rule_trusted(counts, VOUCH_RECORD, bin_, policy):
                return Verdict(False, RECORD_UNPROVEN), VOUCH_RECORD  # answered upstream, and counted
            within = entry
        if wrong_before:
            return Verdict(False, WRONG_BEFORE), ""
        if within:
            return Verdict(True, ABOVE_BAND if prior else ENTRY_RECORD if entry else WITHIN_BOUND), \
                VOUCH_RECORD if entry else ""
        return Verdict(False, OUTSIDE_BOUND), ""

    async def _read(self, query: CacheQuery, question: str, row: Nearest, bin_: int, verdict: Verdict,
                    vouched: str) -> tuple[Verdict, str, bool]:
        """A refused candidate and the reader: asked now, with its deadline, where its yes was
        measured (``semantic.reader: serve``); else marked to be read after the response.

        Returns:
            The verdict, the rule that vouched, and whether to read it after the response.
        """
        assert self.reader is not None
        policy = query.category.semantic
        counts = await self.pooled.counts(query.version, query.category.name, query.canonical.tenant)
        if policy.reader != "serve" or not reader_trusted(counts, bin_, policy):
            # Not trusted here yet: the model answers, and the reader's verdict is counted against it.
            return verdict, vouched, source_of(row) == SOURCE_MODEL
        said = await self.reader.read(ReadPair(asked=question, cached=row.fields[FIELD_QUESTION],
                                               model=query.canonical.model, similarity=row.similarity))
        self._on_read(self.reader.name, READ_FAILED if said is None else READ_YES if said else READ_NO)
        if said:
            return Verdict(True, READER_ACCEPTED), VOUCH_READER, False
        if said is False:  # the model answers; its answer measures this no (``reader_said_no``)
            return Verdict(False, READER_REJECTED), vouched, False
        return verdict, vouched, False

    async def _served_before(self, query: CacheQuery) -> bool:
        """Whether this very question was served semantically before (one read, would-be hits only)."""
        return bool(await self._redis.exists(self._keys.served_key(query.version, query.entry_digest)))

    async def _guard_lifted(self, root: str, guard: str, policy: SemanticPolicy) -> bool:
        """Whether the entry has outgrown a guard: ``guard_lift`` answered misses it turned
        down had the entry's answer, and none had another (one read, only when a guard fires)."""
        if policy.guard_lift <= 0:
            return False
        ok, wrong = await self._redis.hmget(root, [f"{OBS_GUARD_OK}:{guard}", f"{OBS_GUARD_WRONG}:{guard}"])
        return int(ok or 0) >= policy.guard_lift and not int(wrong or 0)

    async def precision(self, tag: str, category: str, policy: SemanticPolicy, tenant: str | None = None) -> Precision:
        """The category's live figures over every tenant (or one tenant's pool): the explored
        would-be hits estimate the error of served hits."""
        assert policy.error_bound is not None
        counts = await self.pooled.counts(tag, category, tenant)
        explored = counts.explored_ok + counts.explored_wrong
        upper = wilson_upper(counts.explored_wrong, explored, z_of(policy.confidence)) if explored else None
        wrong, total = counts.at_or_above(0)
        enough = explored >= 1 / policy.error_bound
        status = "too_few_explored" if not enough else "above_bound" if (upper or 0.0) > policy.error_bound \
            else "within_bound"
        return Precision(error_bound=policy.error_bound, observations=total, observed_wrong=wrong, explored=explored,
                         explored_wrong=counts.explored_wrong, error_upper_bound=upper, status=status,
                         record=rule_figures(counts, VOUCH_RECORD, policy),
                         reader=rule_figures(counts, VOUCH_READER, policy) if self.reader is not None else None,
                         reader_no=(counts.reader_no_ok, counts.reader_no_wrong))


def _candidate(row: Nearest, root: str, rows: Sequence[Nearest], bin_: int, policy: SemanticPolicy, *,
               guard: str = "", lifted: bool = False) -> Candidate:
    return Candidate(key=row.key, root=root, question=row.fields[FIELD_QUESTION], similarity=row.similarity,
                     score_bin=bin_, answer=answer_bytes(row), neighbours=neighbours_of(root, row, rows, policy.threshold),
                     guard=guard, guard_lifted=lifted, source=source_of(row))

