"""The adaptive decision as an ordered list of rules (issue #45).

A candidate (one KNN row in the band, most similar first) goes through the rules in order; the
first rule that rules on it decides, and the rest never see it. A rule that has nothing to say
passes. The list of a category is built from its policy in one place (:func:`rules_for`), and
:data:`RULE_TABLE` says for each rule its reasons (``X-Cache-Verdict``), what it reads and what
its verdict is counted as; docs/SEMANTIC.md shows the same table (a test keeps them equal).

    band floor -> guards -> document veto -> curated wording -> intent veto -> intent match
               -> pool (and prior) -> entry record -> intent trial -> reader -> outside the bound;
               then, for a serve: explore

The three intent rules read the tenant's intent head (a team's labelled phrasings): the veto sets
aside a row the head reads as another intent, the match serves one it reads as the asked intent
(certified by the team's file, or on probation, each hit checked), and the trial counts the pairs
a head loaded before probation would serve.

A new rule is one class here and one line in :func:`rules_for`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
from redis.asyncio import Redis

from app.cache.decision.candidates import same_wording, source_of
from app.cache.decision.stats import (
    MARGIN_WEIGHT,
    PooledCounts,
    binomial_tail,
    entry_record_fields,
    entry_vouches,
    evidence_above,
    evidence_within,
    milli,
    prior_has_evidence,
    reader_trusted,
    risk_level,
    wilson_interval,
    within_bound,
    z_of,
)
from app.cache.decision.verify import (
    ABOVE_BAND,
    CURATED_WORDING,
    ENTRY_RECORD,
    INTENT_DIFFERS,
    INTENT_MATCH,
    INTENT_PROBATION,
    INTENT_TRIAL,
    INTENT_UNCHECKED,
    NEGATION_DIFFERS,
    NEGATION_WORD_ONLY,
    NUMBERS_DIFFER,
    OUTSIDE_BOUND,
    READER_ACCEPTED,
    READER_REJECTED,
    VALUES_DIFFER,
    WITHIN_BOUND,
    WRONG_BEFORE,
    CandidateCheck,
)
from app.cache.readers.base import READ_FAILED, READ_NO, READ_YES, Reader, ReadPair
from app.cache.storage.contract import CacheQuery, Nearest, Verdict
from app.cache.storage.intents import IntentGuess, likely_from
from app.cache.storage.keys import (
    FIELD_INTENT,
    FIELD_INTENT_CHECKED,
    FIELD_INTENT_CONFIDENCE,
    FIELD_INTENT_LIKELY,
    FIELD_INTENT_REFUTED,
    FIELD_QUESTION,
    FIELD_WRONG_ABOVE,
    SOURCE_FAQ,
    SOURCE_MODEL,
    VOUCH_INTENT,
    VOUCH_READER,
    VOUCH_RECORD,
    as_text,
)
from app.policy import AdaptiveSemantic


class Ruling(msgspec.Struct, frozen=True, kw_only=True):
    """What a rule decided about a candidate, and what the decision does after it because of
    that rule (carried here, never left on :class:`Facts`, so the order of the rules cannot
    change what a ruling means).

    Attributes:
        verdict: Served or not, and why (the reason is ``X-Cache-Verdict`` and the metrics' label).
        vouched: The rule that vouched beside the pool (``record``, ``reader``; "" for none): the
            model's answer to an explored or refused candidate counts for or against that rule.
        next_row: The candidate is set aside and the next row is considered (a guard).
        read_later: The reader reads the pair after the response (it is not trusted at this
            score yet), and its verdict is counted against the model's answer.
        check_after: Served by the intent rule from an entry whose answer was never checked
            against its intent (``intent_first_check``): the model is asked the same question
            after the response, and its answer checks the entry.
        trial_bin: A pair the intent rule would serve, had its head certified anything: the
            model's answer counts on the rule's trial record too, in this hundredth of the pair's
            lower confidence (:class:`IntentTrial`); -1: none.
        probation: Served by the intent rule on probation and checked: the model's answer,
            asked after the response, counts on the intent's probation record.
        probation_bin: That hit's lower confidence, in hundredths: its check counts there too.
        far: That hit was served from a cached question further than the near floor
            (:func:`near_floor`): its check counts on the far record alone (:func:`far_watch`).
        intent_may_serve: A guard's refusal the intent rule may overrule, and only it, on a
            pair the team's head reads as one intent (:func:`intent_may_overrule`). The decision
            serves the intent rule's hit, else sets the row aside as the guard said.
    """

    verdict: Verdict
    vouched: str = ""
    next_row: bool = False
    read_later: bool = False
    check_after: bool = False
    trial_bin: int = -1
    probation: bool = False
    probation_bin: int = -1
    far: bool = False
    intent_may_serve: bool = False


def serve(reason: str, vouched: str = "", *, check_after: bool = False) -> Ruling:
    return Ruling(verdict=Verdict(True, reason), vouched=vouched, check_after=check_after)


def refuse(reason: str, *, read_later: bool = False) -> Ruling:
    return Ruling(verdict=Verdict(False, reason), read_later=read_later)


class PoolOnce:
    """The tenant's pool in the category, read at most once per request however many rules and
    rows ask (the one mutable thing behind the frozen :class:`Facts`)."""

    def __init__(self, read: Callable[[], Awaitable[PooledCounts]]) -> None:
        self._read = read
        self._counts: PooledCounts | None = None

    async def __call__(self) -> PooledCounts:
        if self._counts is None:
            self._counts = await self._read()
        return self._counts


@dataclass(frozen=True)
class Facts:
    """One candidate as the rules see it: read-only, so no rule can leave a note that a later
    rule, or the decision, reads (what a rule learnt is on its :class:`Ruling`).

    Attributes:
        query: The planned query (an adaptive category's).
        question: The asked question.
        row: The candidate's document.
        root: The entry whose answer it serves.
        score: Its decision score (similarity plus half its margin over another answer).
        score_bin: That score's bin.
        pool: The tenant's pool, read once (:class:`PoolOnce`).
        asked_intent: What the tenant's intent head read in the asked question (``None``: no head).
    """

    query: CacheQuery
    question: str
    row: Nearest
    root: str
    score: float
    score_bin: int
    pool: PoolOnce
    asked_intent: IntentGuess | None = None

    @property
    def policy(self) -> AdaptiveSemantic:
        policy = self.query.category.semantic
        assert isinstance(policy, AdaptiveSemantic)
        return policy

    @property
    def similarity(self) -> float:
        return self.row.similarity

    @property
    def cached_question(self) -> str:
        return str(self.row.fields[FIELD_QUESTION])

    @property
    def cached_reading(self) -> tuple[str, float]:
        """What the tenant's head read in the cached question when it was stored: (intent,
        confidence); ("", 0.0) for a document stored before the head."""
        fields = self.row.fields
        return as_text(fields.get(FIELD_INTENT)) or "", float(as_text(fields.get(FIELD_INTENT_CONFIDENCE)) or 0.0)

    @property
    def cached_standing(self) -> tuple[str, float]:
        """The cached side as the intent rule reads it: the head's reading, or, where evidence
        says which intent the answer stands for, that intent at full confidence: a team's answer
        (labelled 1.0 at load) or an entry whose answer a check agreed with for its intent."""
        intent, confidence = self.cached_reading
        if intent and self.is_entry and as_text(self.row.fields.get(FIELD_INTENT_CHECKED)) \
                and not as_text(self.row.fields.get(FIELD_INTENT_REFUTED)):
            return intent, 1.0
        return intent, confidence

    @functools.cached_property
    def cached_likely(self) -> dict[str, float] | None:
        """The head's probabilities of the cached question's likely intents, as stored; a team's
        labelled answer is its intent for certain; ``None``: not stored (before the veto read it).
        Decoded once per row (the veto and the entry record both read it)."""
        stored = likely_from(self.row.fields.get(FIELD_INTENT_LIKELY))
        if stored is not None:
            return stored
        intent, confidence = self.cached_reading
        return {intent: 1.0} if intent and confidence >= 1.0 else None

    @property
    def is_entry(self) -> bool:
        return self.root == self.row.key

    async def counts(self) -> PooledCounts:
        """The tenant's pool in the category (read once per request)."""
        return await self.pool()


class PriorZone:
    """Whether a candidate is in the prior's zone: ``accept_above`` and up, with its evidence
    (``prior_evidence``: the pool measured enough there, or the two questions share their
    content words). The pool serves there on the prior, and the entry record's serve there is
    reported as the prior's; both ask this one function."""

    def __init__(self, check: CandidateCheck) -> None:
        self._check = check

    async def __call__(self, facts: Facts) -> bool:
        policy = facts.policy
        if facts.similarity < policy.accept_above:
            return False
        return (not policy.prior_evidence or prior_has_evidence(await facts.counts(), facts.score_bin, policy)
                or self._check.same_content(facts.question, facts.cached_question))


class Described:
    """What the rule table says of a step: its name, verdicts, what it reads and what it counts."""

    name: ClassVar[str]
    reasons: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[str]
    counts: ClassVar[str]


class Rule(Described):
    """One job in the decision: rule on a candidate, or pass (``None``)."""

    async def __call__(self, facts: Facts) -> Ruling | None:
        raise NotImplementedError


class Guards(Rule):
    """A guard (different numbers, values, entities, owners; negation; opposite operations; another
    order) sets the row aside; the next row of the band is considered. On a pair the team's head
    reads as one intent, the intent rule, and no other, may overrule a negation's word that
    negates nothing, the negation guard where the intent's own phrasings differ in negation, and
    a number or value the asked question names where the row is the team's answer and its
    phrasing names none (:func:`intent_may_overrule`, :attr:`Ruling.intent_may_serve`)."""

    name = "guards"
    reasons = ("numbers_differ", "values_differ", "order_differs", "negation_differs", "negation_word_only",
               "opposite_operations", "entities_differ", "owner_differs")
    reads = "both questions (schemas/verification.yaml); the head's `negation_within` for the asked intent"
    counts = "`strata_semantic_verifications_total{decision=reject}`; nothing learnt"

    def __init__(self, check: CandidateCheck) -> None:
        self._check = check

    async def __call__(self, facts: Facts) -> Ruling | None:
        guards = self._check.guards(facts.question, facts.cached_question)
        if not guards:
            return None
        guess = facts.asked_intent
        # The cached question stands for the asked intent too (at whatever confidence: the intent
        # rule judges that).
        overrulable = (guess is not None and facts.cached_standing[0] == guess.intent
                       and intent_may_overrule(guards, negation_within=guess.negation_within,
                                               generic_answer=source_of(facts.row) == SOURCE_FAQ
                                               and not self._check.names_values(facts.cached_question)))
        return Ruling(verdict=Verdict(False, guards[0]), next_row=True, intent_may_serve=overrulable)


def intent_may_overrule(guards: tuple[str, ...], *, negation_within: bool, generic_answer: bool = False) -> bool:
    """Whether the intent rule may serve past these guards on a pair both read as one intent,
    every one of them among: a negation's word that negates nothing (a Chinese question asked both
    ways, 能不能); the negation guard where the intent's own phrasings differ in negation
    (``HeadMeta.negation_within``); other numbers or values where the cached side is a
    ``generic_answer``, the team's answer to a phrasing that names none (written for its intent,
    it depends on no value: "退款100元多久到账" gets the answer to "退款多久能到"). The load's
    calibration replays the same decision (its file's phrasings stand for model answers)."""
    allowed = {NEGATION_WORD_ONLY}
    if negation_within:
        allowed.add(NEGATION_DIFFERS)
    if generic_answer:
        allowed |= {NUMBERS_DIFFER, VALUES_DIFFER}
    return bool(guards) and set(guards) <= allowed


class DocumentVeto(Rule):
    """The document was wrong at this similarity or above (an answered miss, feedback or a
    reviewer's no): never served there."""

    name = "document veto"
    reasons = (WRONG_BEFORE,)
    reads = "the document's `wrong_above` (in the KNN row)"
    counts = "the answered miss: an observation in the pool"

    async def __call__(self, facts: Facts) -> Ruling | None:
        vetoed = milli(facts.similarity) <= int(facts.row.fields.get(FIELD_WRONG_ABOVE) or -1)
        return refuse(WRONG_BEFORE) if vetoed else None


class EntryVeto:
    """Whether the entry of an alias was vetoed at this similarity (any of its documents was
    wrong there): read only when a rule would serve, so that misses cost no round trip."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def vetoed(self, facts: Facts) -> bool:
        if facts.is_entry:
            return False
        return milli(facts.similarity) <= int(await self._redis.hget(facts.root, FIELD_WRONG_ABOVE) or -1)

    async def vetoed_for_intent(self, facts: Facts) -> IntentStanding:
        """Whether the document may serve by intent (:class:`IntentStanding`): one round trip
        for an alias, none for an entry. An alias counts its entry's check only where the head
        read both questions as one intent: the check was of that intent (the entry of
        `goodbye`'s answer, checked by `goodbye` askers, says nothing of its alias "thanks, bye"
        read as `thank_you`)."""
        refuted = bool(as_text(facts.row.fields.get(FIELD_INTENT_REFUTED)))
        checked = bool(as_text(facts.row.fields.get(FIELD_INTENT_CHECKED)))
        if facts.is_entry:
            return IntentStanding(refuted=refuted, checked=checked)
        wrong_above, entry_refuted, entry_checked, entry_intent = await self._redis.hmget(
            facts.root, [FIELD_WRONG_ABOVE, FIELD_INTENT_REFUTED, FIELD_INTENT_CHECKED, FIELD_INTENT])
        entry_vouches = bool(as_text(entry_checked)) and (as_text(entry_intent) or "") == facts.cached_reading[0]
        return IntentStanding(vetoed=milli(facts.similarity) <= int(wrong_above or -1),
                              refuted=refuted or bool(entry_refuted), checked=checked or entry_vouches)


class IntentStanding(msgspec.Struct, frozen=True, kw_only=True):
    """What a document's and its entry's record say to the intent rule.

    Attributes:
        vetoed: The entry was wrong at this similarity or above (an alias's entry).
        refuted: A hit the rule served from them was measured wrong (``intent_refuted``).
        checked: The model's answer to one of the rule's would-be hits agreed with the
            document's (``intent_checked`` on it, or on its entry where the head read the
            entry's question as the same intent).
    """

    vetoed: bool = False
    refuted: bool = False
    checked: bool = False


class CuratedWording(Rule):
    """A curated answer's own question or variant, up to case, spaces and punctuation: the
    operator wrote that answer for those words, so no measurement is needed."""

    name = "curated wording"
    reasons = (CURATED_WORDING, WRONG_BEFORE)
    reads = "the document's source and question; its entry's `wrong_above` for a variant"
    counts = "nothing (a model's answer does not judge a curated one); feedback may veto it"

    def __init__(self, entry_veto: EntryVeto) -> None:
        self._entry_veto = entry_veto

    async def __call__(self, facts: Facts) -> Ruling | None:
        if source_of(facts.row) == SOURCE_MODEL or not same_wording(facts.question, facts.cached_question):
            return None
        return refuse(WRONG_BEFORE) if await self._entry_veto.vetoed(facts) else serve(CURATED_WORDING)


# A row the head reads as its intent at this confidence or above (or at the calibrated threshold,
# if lower) is set aside for a question the head gives at most the rest (1 - this) of a chance of
# being of that intent, however unsure it is of the question's own intent: refusing costs reach,
# never a wrong hit. The twins the entry record served wrongly were read right at 0.84-0.97
# (CLINC150, docs/QUALITY.md); a twin asked in words the head is unsure of (issue #58: "What is
# the need to verify my identity?" served the answer of "verify my identity" at 0.95) is still
# unlikely to be of the cached row's intent.
VETO_CONFIDENCE = 0.8


class IntentVeto(Rule):
    """The team's head sets the row aside, whatever the rules after it would say (the prior, the
    pool, the entry record, the reader), and the next row is considered, when

    - it gives the two questions less of a chance of sharing an intent than the floor its load
      measured (``veto_below``: the sum over intents of the two probabilities' product; a weak
      head's diffuse readings still tell twins apart this way), where it reads the asked question
      as one of the team's topics (``in_domain``), or
    - it reads the cached question as one intent at :data:`VETO_CONFIDENCE` or above (or its
      calibrated threshold, if lower) and gives the asked question at most the rest of a chance
      of being of it (for documents stored before their probabilities were kept)."""

    name = "intent veto"
    reasons = (INTENT_DIFFERS,)
    reads = ("the head's probabilities for the asked question; the document's `intent_likely` (else `intent`, "
             "`intent_confidence`)")
    counts = "`strata_semantic_verifications_total{decision=reject}`; nothing learnt"

    async def __call__(self, facts: Facts) -> Ruling | None:
        guess = facts.asked_intent
        if guess is None:
            return None
        likely = facts.cached_likely
        # Its floor was measured on the team's topics: a question of none of them is not judged by it.
        if likely is not None and guess.in_domain and guess.veto_below > 0 \
                and guess.shared_chance(likely) < guess.veto_below:
            return Ruling(verdict=Verdict(False, INTENT_DIFFERS), next_row=True)
        sure = min(guess.threshold, VETO_CONFIDENCE)
        cached, cached_confidence = facts.cached_reading
        if not cached or cached == guess.intent or guess.chance_of(cached) > 1.0 - sure or cached_confidence < sure:
            return None
        return Ruling(verdict=Verdict(False, INTENT_DIFFERS), next_row=True)


# The rows of the band the adaptive decision rules on (the KNN's first results), and the nearest
# phrasings the intents' calibration replays each asker against: one number, so that what the
# calibration certifies is what the rule serves.
BAND_ROWS = 8


def intent_rule_serves(asked_intent: Any, asked_confidence: Any, cached_intent: Any, cached_confidence: Any,
                       threshold: float) -> Any:
    """The intent rule's predicate: both questions given one intent, each at the calibrated
    ``threshold`` or above. Scalars (the rule, on one row) or numpy arrays (the calibration's
    replay of the team's held-out phrasings): the one definition both use."""
    return (asked_intent == cached_intent) & (asked_confidence >= threshold) & (cached_confidence >= threshold)


# The confidences a head that certified nothing puts the intent rule on trial at (issue #58 item
# 6), most confident first: a pair both of whose questions the head reads as one intent at the
# last of them or above is answered by the model and counted by its lower confidence.
TRIAL_LEVELS = (0.99, 0.98, 0.97, 0.95, 0.93, 0.9)
TRIAL_CONFIDENCE = TRIAL_LEVELS[-1]


def trial_threshold(counts: PooledCounts, policy: AdaptiveSemantic) -> float | None:
    """The lowest trial level whose record shows the rule's bound, walking the levels from the
    most confident and stopping at the first that does not (a fixed sequence, as the calibration
    walks its grid, and like it beginning at the first level with pairs enough to show the bound
    at all, a count that reads no label): "the wrong share of pairs at this confidence or above
    exceeds the category's bound" rejected by the exact binomial tail at the intent rule's risk
    (with none wrong, 299 pairs at 1% and 95%). The category's bound, not the calibration's
    share of it: these pairs are the traffic itself, not the team's file standing for it.
    ``None``: no level yet."""
    delta, shown, begun = risk_level(policy.confidence, policy.intent_confidence), None, False
    enough = math.ceil(math.log(delta) / math.log1p(-policy.error_bound))
    for level in TRIAL_LEVELS:
        wrong, total = counts.on_trial_at_or_above(round(level * 100))
        begun = begun or total >= enough
        if not begun:
            continue
        if binomial_tail(wrong, total, policy.error_bound) > delta:
            break
        shown = level
    return shown


async def serving_threshold(facts: Facts, guess: IntentGuess) -> float | None:
    """The confidence the intent rule serves at: the calibrated one; else, for a head that
    certified nothing, the trial's (:func:`trial_threshold`); ``None``: none."""
    if guess.threshold <= 1.0:
        return guess.threshold
    return trial_threshold(await facts.counts(), facts.policy)


def near_floor(policy: AdaptiveSemantic, guess: IntentGuess) -> float:
    """The similarity from which the intent rule serves a cached question beyond the band as the
    head was calibrated to (a head on a second embedder: its load's floor; else the category's
    ``intent_beyond_floor``). Below it, down to ``intent_far_floor``, a pair is "far": served only on
    probation, checked, and on a record of its own (:func:`far_watch`)."""
    return guess.beyond_floor if guess.beyond_band else policy.intent_beyond_floor


class FarWatch(msgspec.Struct, frozen=True, kw_only=True):
    """What the far record says (anytime-valid, as the probation record).

    Attributes:
        serves: The record does not show more than the category's bound: far pairs are served.
        certified: It certifies the bound: their checks thin to ``intent_check_sample``.
    """

    serves: bool = True
    certified: bool = False


def far_watch(counts: PooledCounts, policy: AdaptiveSemantic) -> FarWatch:
    """The far record under watch: the intent rule's probation hits served from beyond the near
    floor, each checked, stop once :func:`evidence_above` the category's bound reaches ``1 / delta``
    (two wrong of the first dozen), and certify it at :func:`evidence_within` ``1 / delta``."""
    right, wrong = counts.far
    delta = risk_level(policy.confidence, policy.intent_confidence)
    serves = evidence_above(wrong, right + wrong, policy.error_bound) < 1 / delta
    return FarWatch(serves=serves,
                    certified=serves and evidence_within(wrong, right + wrong, policy.error_bound) >= 1 / delta)


def has_far_pairs(policy: AdaptiveSemantic) -> bool:
    """Whether the category looks below its near floor at all (``intent_far_floor`` under
    ``intent_beyond_floor``): what the load's line and the console say of far pairs."""
    return policy.intent_far_floor < policy.intent_beyond_floor


def far_words(policy: AdaptiveSemantic) -> str:
    """The far pairs' promise in words ("" where the category looks no further than its near floor)."""
    if not has_far_pairs(policy):
        return ""
    return (f". A model's answer cached further from the asked question than similarity "
            f"{policy.intent_beyond_floor:.2f} (from {policy.intent_far_floor:.2f}) is served only on probation, "
            f"checked on a record of its own that stops such pairs as soon as it shows more than "
            f"{policy.error_bound:.0%} wrong (and thins their checks once it certifies the bound)")


def check_after_serving(facts: Facts, standing: IntentStanding) -> bool:
    """Whether the intent rule's serve is checked against the model after the response: its
    first from an entry of the model's answers never checked (``intent_first_check``)."""
    return facts.policy.intent_first_check and not standing.checked and source_of(facts.row) == SOURCE_MODEL


def maybe_out_of_scope(facts: Facts, standing: IntentStanding, guess: IntentGuess) -> bool:
    """Whether the cached side may be a model's answer to an out-of-scope question: never
    checked, and read no surer than the file's out-of-scope stand-ins were read as any intent
    (the head's ``stand_in_reach``). A team's answer stands for its intent; the category may
    turn the check off (``intent_out_of_scope_check``)."""
    return (facts.policy.intent_out_of_scope_check and source_of(facts.row) == SOURCE_MODEL and not standing.checked
            and facts.cached_reading[1] <= guess.stand_in_reach)


class IntentMatch(Rule):
    """The team's intents (issue #46): the asked question and the cached one are both given one
    shared intent at the calibrated confidence, and the tenant's measured intent hits do not
    refute the calibration, for that intent or for the tenant (:func:`intents_refuted`). With
    ``intent_first_check``, the first hit it serves from an entry of the model's answers is
    checked off the request path: the model is asked the same question after the response, and
    its answer marks the entry checked or refuted (an answer wrong for its intent then reaches
    one asker, where unchecked it would reach every later asker of the intent until explored).

    Below the certified confidence (or with none certified: a small file), down to the one the
    file's own cross-validation showed within the bound (the head's ``probation``), the rule
    serves on probation: each hit of a model's answer is checked by the model after the
    response and counts on its intent's probation record; an intent whose record shows more
    than the category's bound is stopped (:func:`probation_watch`, anytime-valid), and so is the
    rule from a confidence down where the checks at or above it show it
    (:func:`probation_level_serves`); once the record certifies the bound, checks thin to
    ``intent_check_sample``. The cached side counts at full confidence where evidence says
    which intent it stands for (:attr:`Facts.cached_standing`). A cached question of a model's
    answer further from the asked one than the calibrated floor (:func:`near_floor`; found from
    ``intent_far_floor`` on probation) serves only on probation, its check counted on the far
    record alone, which stops far serves once it shows more than the bound (:func:`far_watch`)."""

    name = "intent match"
    reasons = (INTENT_MATCH, INTENT_PROBATION, INTENT_UNCHECKED, WRONG_BEFORE)
    reads = ("the head's reading of the asked question; the document's `intent`, `intent_confidence`, `intent_refuted` "
             "(and its entry's, and the entry's `intent_checked` where its `intent` is the document's); "
             "the pool's `intent_*:<bin>`, `intent_*_of:<intent>` "
             "and `intent_probation_*_of:<intent>`, `intent_far_*` for a pair further apart than `intent_beyond_floor`, "
             "and for a head loaded without a probation threshold its "
             "`intent_trial_*:<hundredth>`")
    counts = ("`intent_ok:<bin>`/`intent_wrong:<bin>` and `intent_ok_of:<intent>`/`intent_wrong_of:<intent>` when "
              "explored or marked wrong, never the pool's bins; a wrong marks the document and its entry `intent_refuted`, "
              "a right one `intent_checked` (also the model's answer to an entry's first hit, asked after the response; "
              "a check marks the entry only where the head read its question as the document's intent); "
              "a checked probation hit `intent_probation_ok_of:<intent>`/`intent_probation_wrong_of:<intent>`, "
              "one from further apart than `intent_beyond_floor` `intent_far_ok`/`intent_far_wrong` alone")

    def __init__(self, entry_veto: EntryVeto, draw: Callable[[], float]) -> None:
        self._entry_veto = entry_veto
        self._draw = draw

    async def __call__(self, facts: Facts) -> Ruling | None:
        guess = facts.asked_intent
        if guess is None or not guess.shared:
            return None
        cached, cached_confidence = facts.cached_standing
        if not intent_rule_serves(guess.intent, guess.confidence, cached, cached_confidence,
                                  min(guess.lowest, TRIAL_CONFIDENCE)):
            return None  # below what it could serve at, calibrated, on probation or on trial: no pool read
        sure = min(guess.confidence, cached_confidence)
        # Far from the asked question: served only on probation, checked, from a model's answer.
        far = facts.similarity < near_floor(facts.policy, guess)
        if far and (sure < guess.probation or not facts.policy.intent_probation
                    or source_of(facts.row) != SOURCE_MODEL):
            return None
        on_probation = sure < guess.threshold or far
        if on_probation and (sure < guess.probation or not facts.policy.intent_probation):
            threshold = await serving_threshold(facts, guess)  # a head loaded before probation: its trial
            if threshold is None or sure < threshold:
                return None
            on_probation = False
        counts = await facts.counts()
        # The tenant's measured intent hits: the calibration stands, for this intent and overall.
        if not intents_refuted(counts, facts.policy).serves(guess.intent):
            return None
        far_record = far_watch(counts, facts.policy) if far else None
        if far_record is not None and not far_record.serves:
            return None
        watch = probation_watch(counts, facts.policy) if on_probation else None
        confidence_bin = min(99, math.floor(sure * 100))
        if watch is not None and (not watch.serves(guess.intent) or not probation_level_serves(counts, facts.policy,
                                                                                                confidence_bin)):
            return None
        standing = await self._entry_veto.vetoed_for_intent(facts)
        if standing.refuted:
            return None  # its answer was measured wrong for its intent: the rules after this one decide
        if standing.vetoed:
            return refuse(WRONG_BEFORE)
        if maybe_out_of_scope(facts, standing, guess):
            # Perhaps a model's answer to an out-of-scope question: the model answers this asker,
            # and its answer checks the entry (served by intent once it agreed).
            return Ruling(verdict=Verdict(False, INTENT_UNCHECKED), check_after=True)
        if watch is not None:
            # A team's answer is not judged by the model's: its record is the askers' feedback.
            certified = watch.certified if far_record is None else far_record.certified
            checked = source_of(facts.row) == SOURCE_MODEL and (
                not certified or self._draw() < facts.policy.intent_check_sample)
            return Ruling(verdict=Verdict(True, INTENT_PROBATION), check_after=checked, probation=checked,
                          probation_bin=confidence_bin, far=far and checked)
        unchecked = check_after_serving(facts, standing)
        if unchecked and facts.policy.intent_trusted_only:
            # Not trusted yet: the model answers this asker, and its answer checks the entry.
            return Ruling(verdict=Verdict(False, INTENT_UNCHECKED), check_after=True)
        # Served now; the model is asked the same question off the request path (once per entry and
        # intent: an alias read as another intent than its entry's question is checked for itself).
        return serve(INTENT_MATCH, VOUCH_INTENT, check_after=unchecked)


class ProbationWatch(msgspec.Struct, frozen=True, kw_only=True):
    """What the probation record says (anytime-valid: read after every check, each test holds
    its risk).

    Attributes:
        stopped: Intents whose own checked hits show more than the category's bound.
        suspended: The intents left show it together (what the console says: the rule then serves
            only pairs more confident than the record's wrong ones, :func:`probation_level_serves`).
        certified: The intents left certify the bound: checks thin to ``intent_check_sample``.
        wrong: Wrong checked hits of the intents left.
        total: Checked hits of the intents left.
    """

    stopped: tuple[str, ...] = ()
    suspended: bool = False
    certified: bool = False
    wrong: int = 0
    total: int = 0

    def serves(self, intent: str) -> bool:
        return intent not in self.stopped


def probation_level_serves(counts: PooledCounts, policy: AdaptiveSemantic, confidence_bin: int) -> bool:
    """Whether the probation record of the pairs at this lower confidence or above does not show
    more than the category's bound (:func:`evidence_above` under ``1 / delta``): wrong hits among
    the least confident pairs stop the rule from there down, not above."""
    wrong, total = counts.on_probation_at_or_above(confidence_bin)
    return evidence_above(wrong, total, policy.error_bound) < 1 / risk_level(policy.confidence, policy.intent_confidence)


def probation_watch(counts: PooledCounts, policy: AdaptiveSemantic) -> ProbationWatch:
    """The probation record under watch: per intent, the e-value against "wrong share <= the
    category's bound" (:func:`evidence_above`) stops it at ``1 / delta``; the rule as a whole is
    stopped by confidence (:func:`probation_level_serves`); the intents left certify the bound
    when the e-value against "wrong share >= the bound" (:func:`evidence_within`) reaches it.
    The category's bound, not the calibration's share of it: the record is the traffic itself.
    Memoised on the counts (read once a second)."""
    memo = counts.memo.get(("probation", policy))
    if isinstance(memo, ProbationWatch):
        return memo
    delta = risk_level(policy.confidence, policy.intent_confidence)
    bound = policy.error_bound
    stopped = tuple(sorted(intent for intent, (right, wrong) in counts.on_probation.items()
                           if evidence_above(wrong, right + wrong, bound) >= 1 / delta))
    left = [(right, wrong) for intent, (right, wrong) in counts.on_probation.items() if intent not in stopped]
    wrong = sum(w for _, w in left)
    total = wrong + sum(r for r, _ in left)
    suspended = evidence_above(wrong, total, bound) >= 1 / delta
    watch = ProbationWatch(stopped=stopped, suspended=suspended, wrong=wrong, total=total,
                           certified=not suspended and evidence_within(wrong, total, bound) >= 1 / delta)
    counts.memo[("probation", policy)] = watch
    return watch


# At most this many intents are set aside one by one before the tenant's whole record decides
# alone: intents set aside because they showed wrong hits leave a cleaner record behind, so the
# number that may be set aside is kept small (a broken calibration costs at most this many more
# wrong measured hits before the rule stops for the tenant).
SET_ASIDE_MOST = 3


class IntentWatch(msgspec.Struct, frozen=True, kw_only=True):
    """What the tenant's measured intent hits say of the calibration (issue #46, item 4).

    Attributes:
        suspended: The rule serves nothing for the tenant: its hits, the set-aside intents'
            left out, refute the calibration (Wilson lower bound of wrong above the bound).
        set_aside: Intents whose own measured hits refute it, served no more (most wrong first,
            at most ``SET_ASIDE_MOST``).
        wrong: Wrong measured hits, every intent.
        total: Measured hits, every intent.
    """

    suspended: bool = False
    set_aside: tuple[str, ...] = ()
    wrong: int = 0
    total: int = 0

    def serves(self, intent: str) -> bool:
        """Whether the intent rule may serve a question read as ``intent``."""
        return not self.suspended and intent not in self.set_aside


def intents_refuted(counts: PooledCounts, policy: AdaptiveSemantic) -> IntentWatch:
    """The tenant's intent rule under watch: an intent whose own measured hits refute the
    calibration is set aside (up to ``SET_ASIDE_MOST``), and the rule stops for the tenant when
    the hits of the intents left refute it too; every score together."""
    z = z_of(policy.confidence)
    wrong, total = counts.vouched_at_or_above(VOUCH_INTENT, 0)

    def refutes(bad: int, measured: int) -> bool:
        return measured > 0 and wilson_interval(bad, measured, z)[0] > policy.error_bound

    refuting = sorted(((w, r + w, intent) for intent, (r, w) in counts.of_intent.items() if refutes(w, r + w)),
                      key=lambda t: (-t[0], -t[1], t[2]))[:SET_ASIDE_MOST]
    left_wrong = wrong - sum(w for w, _, _ in refuting)
    left_total = total - sum(n for _, n, _ in refuting)
    return IntentWatch(suspended=refutes(max(0, left_wrong), max(0, left_total)),
                       set_aside=tuple(intent for _, _, intent in refuting), wrong=wrong, total=total)


class Pool(Rule):
    """The tenant's pooled observations at this score or above keep wrong hits under the bound
    (Wilson upper bound); from ``accept_above`` on, the prior: merely not refuted (lower bound),
    and with ``prior_evidence`` only once the pool has 1 / error_bound observations there or the
    two questions share their content words."""

    name = "pool"
    reasons = (WITHIN_BOUND, ABOVE_BAND, WRONG_BEFORE)
    reads = "`strata:vN:obs:<category>:<tenant>` (`ok:<bin>`, `wrong:<bin>`); the entry's `wrong_above` for an alias"
    counts = "an explored serve: `explored_ok`/`explored_wrong` and its bin in the pool"

    def __init__(self, prior_zone: PriorZone, entry_veto: EntryVeto) -> None:
        self._prior_zone = prior_zone
        self._entry_veto = entry_veto

    async def __call__(self, facts: Facts) -> Ruling | None:
        policy, counts = facts.policy, await facts.counts()
        prior = await self._prior_zone(facts)
        if not within_bound(counts, facts.score_bin, policy, prior=prior):
            return None
        if await self._entry_veto.vetoed(facts):
            return refuse(WRONG_BEFORE)
        return serve(ABOVE_BAND if prior else WITHIN_BOUND)


# With a team's head, the entry record serves only pairs the head gives at least this chance of
# one shared intent: its wrong hits were twins the head confuses too (CLINC150, 6 phrasings per
# intent, seed 1: `thank_you` served `goodbye`'s answer, `yes` served `no`'s), which the veto's
# floor, made to cost the file's own pairs nothing, lets through (docs/QUALITY.md).
ENTRY_RECORD_SHARED_CHANCE = 0.5


class EntryRecord(Rule):
    """Below what the pool allows: the entry's answer was confirmed ``entry_confirmations`` times
    at scores no higher than the candidate's, no other answer is within ``entry_margin``, and the
    entry was never wrong near this similarity; with a team's head reading the asked question as
    one of the team's topics, the head gives the pair at least an even chance of one shared
    intent (:data:`ENTRY_RECORD_SHARED_CHANCE`), and for an alias the asked question and the
    entry's too."""

    name = "entry record"
    reasons = (ENTRY_RECORD, ABOVE_BAND)
    reads = ("the entry's `confirmed:<bin>` and `wrong_above` (one HMGET); with a head, its chance that the two "
             "share an intent (the document's `intent_likely`, and for an alias its entry's)")
    counts = "`record_ok:<bin>`/`record_wrong:<bin>` when explored (in the prior's zone only), never the pool's bins"

    def __init__(self, redis: Redis, prior_zone: PriorZone) -> None:
        self._redis = redis
        self._prior_zone = prior_zone

    async def __call__(self, facts: Facts) -> Ruling | None:
        policy = facts.policy
        margin = (facts.score - facts.similarity) / MARGIN_WEIGHT
        if policy.entry_confirmations <= 0 or facts.score < policy.entry_floor or margin < policy.entry_margin:
            return None
        guess, likely = facts.asked_intent, facts.cached_likely
        # The head's word counts where it reads the asked question as one of the team's topics.
        judge = guess if guess is not None and guess.in_domain and likely is not None else None
        if judge is not None and likely is not None and judge.shared_chance(likely) < ENTRY_RECORD_SHARED_CHANCE:
            return None  # the head doubts the pair: the rules after this one decide
        fields = entry_record_fields(policy.threshold, facts.score_bin)
        # An alias's entry: the question whose answer the record confirmed is the entry's too (an
        # alias the head misreads, "thanks, bye" under `goodbye`'s answer, does not lend it its reading).
        entry_too = judge is not None and not facts.is_entry
        values = await self._redis.hmget(facts.root, [*fields, FIELD_INTENT_LIKELY] if entry_too else fields)
        if judge is not None and entry_too:
            entry_likely = likely_from(values[-1])
            values = values[:-1]
            if entry_likely is not None and judge.shared_chance(entry_likely) < ENTRY_RECORD_SHARED_CHANCE:
                return None
        if not entry_vouches(values, facts.similarity, policy):
            return None
        # In the prior's zone the serve is reported, and explored, as the prior's.
        return serve(ABOVE_BAND if await self._prior_zone(facts) else ENTRY_RECORD, VOUCH_RECORD)


class IntentTrial(Rule):
    """A head that certified nothing (a small file) puts the intent rule on trial: a row no rule
    before this one served, which both questions read as one shared intent at
    :data:`TRIAL_CONFIDENCE`, is answered by the model, and the comparison counts on the rule's
    trial record (by the pair's lower confidence) as well as in the pool; once the record shows
    the rule's bound at a level, the intent rule serves the pairs from that level
    (:func:`trial_threshold`). A small file pays off as the model's answers come in, at no cost:
    these requests were misses."""

    name = "intent trial"
    reasons = (INTENT_TRIAL,)
    reads = "the head's reading of the asked question; the document's `intent`, `intent_confidence`"
    counts = "the answered miss as the pool counts it, and `intent_trial_ok:<bin>`/`intent_trial_wrong:<bin>`"

    async def __call__(self, facts: Facts) -> Ruling | None:
        guess = facts.asked_intent
        on_probation = guess is not None and guess.probation <= 1.0 and facts.policy.intent_probation
        if guess is None or guess.threshold <= 1.0 or on_probation or not guess.shared \
                or source_of(facts.row) != SOURCE_MODEL:
            return None  # certified, or on probation: the trial is for heads without probation
        cached, cached_confidence = facts.cached_reading
        if not intent_rule_serves(guess.intent, guess.confidence, cached, cached_confidence, TRIAL_CONFIDENCE):
            return None
        lower = min(guess.confidence, cached_confidence)
        return Ruling(verdict=Verdict(False, INTENT_TRIAL), trial_bin=min(99, math.floor(lower * 100)))


class ReaderRule(Rule):
    """A reader of the grey zone (``semantic.reader``): where its yes was measured within the
    bound (``serve``), asked now with its deadline; elsewhere marked to be read after the
    response, its verdict counted against the model's answer."""

    name = "reader"
    reasons = (READER_ACCEPTED, READER_REJECTED)
    reads = "the pool's `reader_*:<bin>` rates; the reader (on the request path only where trusted)"
    counts = "`reader_ok`/`reader_wrong` (yes), `reader_no_ok`/`reader_no_wrong` (no, sampled at the explore rate)"

    def __init__(self, reader: Reader, on_read: Callable[[str, str], None]) -> None:
        self._reader = reader
        self._on_read = on_read

    async def __call__(self, facts: Facts) -> Ruling | None:
        policy = facts.policy
        if policy.reader == "off":
            return None
        if policy.reader != "serve" or not reader_trusted(await facts.counts(), facts.score_bin, policy):
            # Not trusted here yet: nothing vouched (the last rule's verdict), and the reader
            # reads the pair after the response; a curated answer is not read.
            return refuse(OUTSIDE_BOUND, read_later=source_of(facts.row) == SOURCE_MODEL)
        said = await self._reader.read(ReadPair(asked=facts.question, cached=facts.cached_question,
                                                model=facts.query.canonical.model, similarity=facts.similarity))
        self._on_read(self._reader.name, READ_FAILED if said is None else READ_YES if said else READ_NO)
        if said:
            return serve(READER_ACCEPTED, VOUCH_READER)
        return refuse(READER_REJECTED) if said is False else None


class OutsideBound(Rule):
    """Nothing vouched: the model answers, and its answer is the observation."""

    name = "outside the bound"
    reasons = (OUTSIDE_BOUND,)
    reads = "nothing"
    counts = "the answered miss: `ok:<bin>`/`wrong:<bin>` in the pool; a veto if wrong; the review queue"

    async def __call__(self, facts: Facts) -> Ruling:
        return refuse(OUTSIDE_BOUND)


def rules_for(policy: AdaptiveSemantic, check: CandidateCheck, redis: Redis, reader: Reader | None,
              on_read: Callable[[str, str], None], draw: Callable[[], float]) -> tuple[Rule, ...]:
    """The ordered rules of an adaptive category: the one place the list is built."""
    entry_veto, prior_zone = EntryVeto(redis), PriorZone(check)
    rules: list[Rule] = [Guards(check), DocumentVeto(), CuratedWording(entry_veto), IntentVeto(),
                         IntentMatch(entry_veto, draw), Pool(prior_zone, entry_veto)]
    if policy.entry_confirmations > 0:
        rules.append(EntryRecord(redis, prior_zone))
    rules.append(IntentTrial())
    if reader is not None and policy.reader != "off":
        rules.append(ReaderRule(reader, on_read))
    rules.append(OutsideBound())
    return tuple(rules)


class Explore(Described):
    """After a serve: a would-be hit of a model's answer is sent upstream anyway at the
    category's ``explore`` rate, so the served hits' error is measured on a fair sample; a
    reader's no is kept for measuring at the same rate. One seeded draw per decision that needs one.
    The entry record's serves are not explored: exploring them (the removed ``entry_explore``) cost
    reach and found no wrong hit the pool did not (docs/experiments/removed-rules.md)."""

    name = "explore"
    reads = "a seeded random draw, at `explore` for serves of a model's answer (not the record's below the prior)"
    counts = "the explored candidate's answered miss (`explored_ok`/`explored_wrong`, its rule's fields)"

    def __init__(self, draw: Callable[[], float]) -> None:
        self._draw = draw

    def explored(self, ruling: Ruling, source: str, policy: AdaptiveSemantic) -> bool:
        # A model's answer does not judge a curated one.
        # A probation hit is checked (or sampled for a check) by the intent rule itself.
        rate = policy.explore if source == SOURCE_MODEL and ruling.verdict.reason not in (ENTRY_RECORD, INTENT_PROBATION) \
            else 0.0
        return ruling.verdict.accepted and bool(rate) and self._draw() < rate

    def reader_no_kept(self, ruling: Ruling, policy: AdaptiveSemantic) -> bool:
        # A trusted reader's yes is measured only when explored, so its no is counted at the same
        # rate: its two rates stay unbiased once it serves.
        return ruling.verdict.reason == READER_REJECTED and self._draw() < policy.explore


RULE_ORDER: tuple[type[Described], ...] = (Guards, DocumentVeto, CuratedWording, IntentVeto, IntentMatch, Pool,
                                           EntryRecord, IntentTrial, ReaderRule, OutsideBound, Explore)


def rule_table() -> str:
    """The rules in their order as a Markdown table (docs/SEMANTIC.md holds the same)."""
    lines = ["| # | rule | verdicts (`X-Cache-Verdict`) | reads | counted as |", "|---|---|---|---|---|"]
    for number, rule in enumerate(RULE_ORDER, start=1):
        reasons = ", ".join(f"`{r}`" for r in rule.reasons) or "-"
        lines.append(f"| {number} | {rule.name} | {reasons} | {rule.reads} | {rule.counts} |")
    return "\n".join(lines)


