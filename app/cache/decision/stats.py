"""The statistics of the adaptive decision: decision scores and their bins, the Wilson bounds,
a tenant's pooled observations (read back as suffix sums), the rules' trust, an entry's record,
and the live figures of ``/health``, ``/metrics`` and the console."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist

import msgspec
import numpy as np
from redis.asyncio import Redis

from app.cache.storage.keys import (
    FIELD_WRONG_ABOVE,
    KEYS,
    OBS_CONFIRMED,
    OBS_EXPLORED_OK,
    OBS_EXPLORED_WRONG,
    OBS_INTENT_FAR_OK,
    OBS_INTENT_FAR_WRONG,
    OBS_INTENT_OK,
    OBS_INTENT_OK_OF,
    OBS_INTENT_PROBATION_OK,
    OBS_INTENT_PROBATION_OK_OF,
    OBS_INTENT_PROBATION_WRONG,
    OBS_INTENT_PROBATION_WRONG_OF,
    OBS_INTENT_TRIAL_OK,
    OBS_INTENT_TRIAL_WRONG,
    OBS_INTENT_WRONG,
    OBS_INTENT_WRONG_OF,
    OBS_OK,
    OBS_READER_NO_OK,
    OBS_READER_NO_WRONG,
    OBS_READER_OK,
    OBS_READER_WRONG,
    OBS_RECORD_OK,
    OBS_RECORD_WRONG,
    OBS_WRONG,
    VOUCH_INTENT,
    VOUCH_READER,
    VOUCH_RECORD,
    Keyspace,
    as_text,
    observation_field,
)
from app.policy import AdaptiveSemantic

# Score bins are hundredths; a score stays below 1.5 (similarity <= 1, half a margin <= 0.5).
BINS = 160
MARGIN_WEIGHT = 0.5
# An entry with fewer documents among the candidates than ``score_phrasings`` asks for: each one
# missing costs this much of the similarity (few phrasings near a question vouch for less).
SET_SHORTFALL = 0.02
# How long a worker reuses the pooled counts it read: the hit path costs no extra round trip
# per request, and other workers' observations arrive within this delay.
POOLED_REFRESH_S = 1.0
# An entry that was ever wrong within this similarity of a candidate does not vouch for it.
ENTRY_WRONG_GAP = 0.05
# ... unless confirmed this many times the record's usual evidence at scores above the wrong
# similarity plus the gap: the wrong one was another intent further out, and the entry's answer
# has held closer in since (docs/QUALITY.md, issue #24).
ENTRY_WRONG_OUTWEIGHED_BY = 2
# The base rate of wrong candidates a reader's trust uses is the pool's within this many score
# bins either side of the candidate's (the rate changes with the score; one bin holds too few).
READER_BASE_BAND = 2
# The confidence a reader's yes is measured at before it serves: higher than a category's usual
# 85%, because a reader's errors are not seen once it serves (only its explored hits are), and a
# reader wrong on a fifth of pairs, where most candidates are right, has a wrong yes at about
# the bound; at 85% it passed by chance (docs/QUALITY.md). About 270 clean yes at 1%.
READER_CONFIDENCE = 0.95


def set_similarity(similarities: Sequence[float], size: int) -> float:
    """How close a question is to an entry's phrasings as a set: the mean similarity of the
    entry's ``size`` nearest documents among the candidates; with fewer there, the least similar of
    them less :data:`SET_SHORTFALL` for each one missing. ``size`` 1: the nearest document's.

    An entry gathers phrasings (aliases) as it is confirmed, so the nearest of them comes ever
    closer to any question, its twins' too; a mean over several drifts less (docs/QUALITY.md)."""
    nearest = sorted(similarities, reverse=True)[:size]
    if len(nearest) >= size:
        return sum(nearest) / size
    return min(nearest) - SET_SHORTFALL * (size - len(nearest))


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


def binomial_tail(wrong: int, served: int, rate: float) -> float:
    """P(X <= wrong) for X ~ Binomial(served, rate): the p-value of "the wrong share is above rate"."""
    if served == 0:
        return 1.0
    total = 0.0
    for i in range(wrong + 1):
        log_term = (math.lgamma(served + 1) - math.lgamma(i + 1) - math.lgamma(served - i + 1)
                    + i * math.log(rate) + (served - i) * math.log1p(-rate))
        total += math.exp(log_term)
    return min(1.0, total)


def risk_level(confidence: float, intent_confidence: float = 0.95) -> float:
    """The intent rule's delta for a category: its intents' confidence (95% unless the policy
    says), the category's own if higher."""
    return min(1.0 - intent_confidence, 1.0 - confidence)


# The bets of the anytime-valid tests of a probation record (app/cache/decision/rules.py). Each
# bet makes a test martingale whose value depends on the counts alone (a product of one factor
# per check, in any order), and so does their average: read after every check, it crosses
# 1 / delta with probability at most delta when the null holds (Ville's inequality), however
# often it is read. A fixed-sample test read again and again has no such bound.
# Against "wrong share <= bound": bets sized for traffic 2x to 33x the bound (Kelly's bet for a
# wrong share p is (p - bound) / (bound (1 - bound))), each at most half of 1 / bound.
STOP_BETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
# Against "wrong share >= bound": fractions of the largest bet, 1 / (1 - bound) (a clean check
# then multiplies by 1 / (1 - bound): 299 clean checks at 1% reach 20 alone, 436 averaged so).
CERTIFY_BETS = (0.5, 0.8, 0.95)


def _mixture(wrong: int, total: int, on_wrong: list[float], on_right: list[float]) -> float:
    logs = [wrong * math.log(w) + (total - wrong) * math.log(r) if w > 0 or wrong == 0 else -math.inf
            for w, r in zip(on_wrong, on_right, strict=True)]
    top = max(logs)
    if top == -math.inf:
        return 0.0
    return math.exp(top) * sum(math.exp(x - top) for x in logs) / len(logs) if top < 700 else math.inf


def evidence_above(wrong: int, total: int, bound: float) -> float:
    """An e-value against "the wrong share is at most ``bound``" from ``wrong`` of ``total``
    checks: at ``1 / delta`` or more, the record shows more than the bound (anytime-valid)."""
    bets = [min(bet, 0.5 / bound) for bet in STOP_BETS]
    return _mixture(wrong, total, [1 + b * (1 - bound) for b in bets], [1 - b * bound for b in bets])


def evidence_within(wrong: int, total: int, bound: float) -> float:
    """An e-value against "the wrong share is at least ``bound``": at ``1 / delta`` or more, the
    record certifies the bound (anytime-valid)."""
    bets = [share / (1 - bound) for share in CERTIFY_BETS]
    return _mixture(wrong, total, [1 - b * (1 - bound) for b in bets], [1 + b * bound for b in bets])


def clean_checks_to_certify(bound: float, delta: float) -> int:
    """Clean checks in a row that certify ``bound`` at ``delta`` (:func:`evidence_within`)."""
    n = 0
    while evidence_within(0, n, bound) < 1 / delta:
        n += 1
    return n


def z_of(confidence: float) -> float:
    """One-sided z of a confidence level (0.85 -> 1.04)."""
    return NormalDist().inv_cdf(confidence)


# Per-bin kinds of a pool: the answered misses' own, and those of the rules that vouch beside it.
_BINNED_KINDS = (OBS_OK, OBS_WRONG, OBS_RECORD_OK, OBS_RECORD_WRONG, OBS_READER_OK, OBS_READER_WRONG, OBS_INTENT_OK,
                 OBS_INTENT_WRONG, OBS_INTENT_TRIAL_OK, OBS_INTENT_TRIAL_WRONG, OBS_INTENT_PROBATION_OK,
                 OBS_INTENT_PROBATION_WRONG,
                 OBS_READER_NO_OK, OBS_READER_NO_WRONG)
# Each vouching rule's (right, wrong) kinds.
VOUCH_KINDS = {VOUCH_RECORD: (OBS_RECORD_OK, OBS_RECORD_WRONG), VOUCH_READER: (OBS_READER_OK, OBS_READER_WRONG),
               VOUCH_INTENT: (OBS_INTENT_OK, OBS_INTENT_WRONG)}


class PooledCounts:
    """A category's pooled observations as suffix sums: ``ok[b]`` is the number of equivalent
    observations with a score bin of at least ``b``; the same for each vouching rule's outcomes.

    Args:
        fields: The pool's hash fields (``ok:<bin>``, ``wrong:<bin>``, ``record_ok:<bin>``,
            ``explored_ok``, ...) and counts.
    """

    def __init__(self, fields: dict[str, int]) -> None:
        binned = {kind: np.zeros(BINS + 1) for kind in _BINNED_KINDS}
        # The team's intent rule's measured hits per intent: (right, wrong).
        self.of_intent: dict[str, tuple[int, int]] = {}
        # Its hits checked on probation per intent: (right, wrong).
        self.on_probation: dict[str, tuple[int, int]] = {}
        for name, count in fields.items():
            kind, _, number = name.partition(":")
            if number.isdigit() and int(number) < BINS and kind in binned:
                binned[kind][int(number)] += count
            elif kind in (OBS_INTENT_OK_OF, OBS_INTENT_WRONG_OF) and number:
                right, wrong = self.of_intent.get(number, (0, 0))
                self.of_intent[number] = (right + count, wrong) if kind == OBS_INTENT_OK_OF else (right, wrong + count)
            elif kind in (OBS_INTENT_PROBATION_OK_OF, OBS_INTENT_PROBATION_WRONG_OF) and number:
                right, wrong = self.on_probation.get(number, (0, 0))
                self.on_probation[number] = ((right + count, wrong) if kind == OBS_INTENT_PROBATION_OK_OF
                                             else (right, wrong + count))
        self._suffix = {kind: np.cumsum(counts[::-1])[::-1] for kind, counts in binned.items()}
        # What the rules derive from these counts, kept with them (they are read once a second).
        self.memo: dict[object, object] = {}
        self.ok, self.wrong = self._suffix[OBS_OK], self._suffix[OBS_WRONG]
        self.explored_ok = fields.get(OBS_EXPLORED_OK, 0)
        self.explored_wrong = fields.get(OBS_EXPLORED_WRONG, 0)
        # A reader's no, every bin.
        self.reader_no_ok = int(self._suffix[OBS_READER_NO_OK][0])
        self.reader_no_wrong = int(self._suffix[OBS_READER_NO_WRONG][0])
        # The probation hits served from beyond ``intent_beyond_floor``, checked: (right, wrong).
        self.far = (fields.get(OBS_INTENT_FAR_OK, 0), fields.get(OBS_INTENT_FAR_WRONG, 0))

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

    def on_trial_at_or_above(self, confidence_bin: int) -> tuple[int, int]:
        """(wrong, total) of the intent rule's trial pairs whose lower confidence is in this
        hundredth or above (they are counted by confidence, not score)."""
        wrong = int(self._suffix[OBS_INTENT_TRIAL_WRONG][confidence_bin])
        return wrong, wrong + int(self._suffix[OBS_INTENT_TRIAL_OK][confidence_bin])

    def on_probation_at_or_above(self, confidence_bin: int) -> tuple[int, int]:
        """(wrong, total) of the intent rule's checked probation hits whose lower confidence is in
        this hundredth or above."""
        wrong = int(self._suffix[OBS_INTENT_PROBATION_WRONG][confidence_bin])
        return wrong, wrong + int(self._suffix[OBS_INTENT_PROBATION_OK][confidence_bin])

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


def within_bound(counts: PooledCounts, bin_: int, policy: AdaptiveSemantic, *, prior: bool = False) -> bool:
    """Whether the category's observations at this score or above keep wrong hits under the bound.

    Without a prior the observations must show it (upper bound at most the bound); with one (the
    similarity reached ``accept_above``) they must merely not refute it (lower bound at most the
    bound), so a prior that does not fit the deployment's questions is withdrawn by its traffic.
    """
    assert policy.error_bound is not None
    wrong, total = counts.at_or_above(bin_)
    lower, upper = wilson_interval(wrong, total, z_of(policy.confidence))
    return (lower if prior else upper) <= policy.error_bound


def prior_has_evidence(counts: PooledCounts, bin_: int, policy: AdaptiveSemantic) -> bool:
    """Whether the pool has seen enough at this score or above for the prior to speak: at least
    1 / error_bound observations (fewer cannot tell a wrong share of error_bound from none)."""
    assert policy.error_bound is not None
    return counts.at_or_above(bin_)[1] >= math.ceil(1 / policy.error_bound)


def rule_trusted(counts: PooledCounts, rule: str, bin_: int, policy: AdaptiveSemantic,
                 confidence: float | None = None) -> bool:
    """Whether a vouching rule has been measured right often enough at this score or above:
    the Wilson upper bound of the wrong share of what it vouched for there is at most the bound
    (about 110 clean verdicts at the shipped 1% and 85% confidence), at ``confidence`` if given
    (else the category's)."""
    assert policy.error_bound is not None
    wrong, total = counts.vouched_at_or_above(rule, bin_)
    return wilson_upper(wrong, total, z_of(confidence or policy.confidence)) <= policy.error_bound


def reader_error_here(counts: PooledCounts, bin_: int, policy: AdaptiveSemantic) -> float:
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


def reader_trusted(counts: PooledCounts, bin_: int, policy: AdaptiveSemantic) -> bool:
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


def entry_vouches(values: Sequence[bytes | str | None], similarity: float, policy: AdaptiveSemantic) -> bool:
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


def milli(similarity: float) -> int:
    """Similarity in thousandths, rounded down: a wrong observation recorded (rounded) at 0.823
    vetoes every similarity up to 0.8239."""
    return int(similarity * 1000)


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


def rule_figures(counts: PooledCounts, rule: str, policy: AdaptiveSemantic) -> RuleFigures:
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


