"""The adaptive decision: whether a semantic candidate is served, under an error bound (#10).

Every miss is answered by the model anyway, so what the nearest cached question *would* have
served can be compared with the fresh answer for free (app/cache/learning/learner.py records it). This
module reads those observations back and decides, for one KNN result, in one call
(:meth:`AdaptiveDecision.decide`): the rows of the band, most similar first, go through the
category's ordered rules (app/cache/rules.py); the first row a guard does not set aside is
ruled on and is the lookup's one candidate, served, explored or learnt from. The same
observations give the category's live precision (:meth:`AdaptiveDecision.precision`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import msgspec
from redis.asyncio import Redis

from app.cache.decision.candidates import answer_bytes, check_row, neighbours_of, root_of, source_of
from app.cache.decision.rules import (
    DocumentVeto,
    Explore,
    Facts,
    Guards,
    IntentMatch,
    PoolOnce,
    Rule,
    Ruling,
    rules_for,
)
from app.cache.decision.stats import (
    PooledCounts,
    PooledObservations,
    Precision,
    decision_score,
    rule_figures,
    score_bin,
    set_similarity,
    wilson_upper,
    z_of,
)
from app.cache.decision.verify import CandidateCheck
from app.cache.readers.base import Reader
from app.cache.storage.contract import CacheQuery, Candidate, Nearest
from app.cache.storage.intents import IntentGuess
from app.cache.storage.keys import (
    FIELD_INTENT,
    FIELD_INTENT_CHECKED,
    KEYS,
    SOURCE_MODEL,
    VOUCH_INTENT,
    VOUCH_READER,
    VOUCH_RECORD,
    Keyspace,
    as_text,
)
from app.policy import AdaptiveSemantic

# The rules that rule on a row below the band read as the asked intent (the intent rule beyond
# the band, a head on a second embedder): the guards, the document's veto, the intent rule.
BEYOND_BAND_RULES = (Guards, DocumentVeto, IntentMatch)

class Serve(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate the decision serves.

    Attributes:
        row: The document that matched.
        reason: Why (the serving rule's reason: ``within_bound``, ``entry_record``, ...).
        score_bin: Its decision score's bin (what an observation of it counts under).
        check: To be checked against the model's answer after the response (the intent rule's
            first hit of an entry, ``intent_first_check``); ``None``: nothing to check.
        candidate: The same pair as a candidate, should the layer send it to the model instead
            (a question served this answer before: :meth:`SemanticCache.lookup`).
    """

    row: Nearest
    reason: str
    score_bin: int
    check: Candidate | None = None
    candidate: Candidate | None = None


class AdaptiveDecision:
    """An adaptive category's decision on the nearest documents of a question.

    Args:
        redis: The Redis holding the entries (their records are read for would-be hits only).
        check: The guards, and where every verdict is counted.
        pooled: The pooled observations of the keyspace.
        keys: The keyspace.
        seed: Seed of the exploration draws: random across questions and across repeats of one
            question, and seeded, so that a replay of a stream in one process makes the same draws.
        reader: The reader of the grey zone (app/cache/readers); ``None``: none, whatever the policy says.
        on_read: Counts a synchronous reader's verdict ``(reader name, yes|no|failed)``.
    """

    def __init__(self, redis: Redis, check: CandidateCheck, pooled: PooledObservations, *, seed: int = 0,
                 keys: Keyspace = KEYS, reader: Reader | None = None,
                 on_read: Callable[[str, str], None] | None = None) -> None:
        self._redis = redis
        self._keys = keys
        self._check = check
        self.pooled = pooled
        self._draw = random.Random(seed).random
        self._explore = Explore(self._draw)
        self.reader = reader
        self._on_read = on_read or (lambda reader, verdict: None)
        self._rules: dict[AdaptiveSemantic, tuple[Rule, ...]] = {}

    def rules(self, policy: AdaptiveSemantic) -> tuple[Rule, ...]:
        """The category's ordered rules (built once per policy)."""
        rules = self._rules.get(policy)
        if rules is None:
            rules = self._rules[policy] = rules_for(policy, self._check, self._redis, self.reader, self._on_read,
                                                        self._draw)
        return rules

    async def decide(self, query: CacheQuery, question: str, rows: Sequence[Nearest],
                     asked_intent: IntentGuess | None = None,
                     beyond_band: Sequence[Nearest] = (), set_aside: list[str] | None = None) -> Serve | Candidate | None:
        """Rule on the nearest row of the band no guard sets aside.

        Args:
            query: The planned query (its category is adaptive).
            question: The asked question.
            rows: The KNN result, most similar first.
            asked_intent: What the tenant's intent head read in the question: when it is sure,
                the rows of its intent are considered first (the nearest row of another intent
                does not hide them).
            beyond_band: The nearest rows read as the asked intent below the band, when the band
                has none (a head on a second embedder): only the guards, the document's veto and
                the intent rule rule on them, before the band.
            set_aside: Given (a traced request), each row set aside is noted in it: the reason
                (``beyond:<reason>`` for a row beyond the band; ``beyond:passed`` where no rule ruled).

        Returns:
            The candidate to serve; or one to learn from once the model has answered (not
            served, or explored); or ``None`` (nothing in the band, or every row guarded).

        Raises:
            CorruptEntry: A document in the band lacks its question or answer (a cache failure).
        """
        policy = query.category.semantic
        assert isinstance(policy, AdaptiveSemantic)

        async def read_pool() -> PooledCounts:
            return await self.pooled.counts(query.version, query.category.name, query.canonical.tenant)

        pool = PoolOnce(read_pool)

        # A row beyond the band the intent rule wants checked first: the model answers and checks
        # it, unless a row of the band serves (the band's refused row then teaches nothing this
        # time: one answer, one comparison).
        pending: Candidate | None = None
        for row in beyond_band:
            decided = await self._beyond_band(query, question, row, rows, asked_intent, pool, set_aside)
            if isinstance(decided, Candidate) and decided.refused:
                pending = pending or decided
            elif decided is not None:
                return decided
        if asked_intent is not None and asked_intent.confident:
            band = [row for row in rows if row.similarity >= policy.threshold]
            # Its intent's rows first, those whose answer was checked against it before the others.
            rows = sorted(band, key=lambda row: (as_text(row.fields.get(FIELD_INTENT)) != asked_intent.intent,
                                                 not as_text(row.fields.get(FIELD_INTENT_CHECKED))))
        for row in rows:
            if row.similarity < policy.threshold:
                return pending  # the band's floor: the rest are below too
            check_row(row)
            root = root_of(row)
            others = [other.similarity for other in rows if root_of(other) != root]
            own = [other.similarity for other in rows if root_of(other) == root]
            score = decision_score(set_similarity(own, policy.score_phrasings), max(others) if others else None,
                                   policy.threshold)
            facts = Facts(query=query, question=question, row=row, root=root, score=score,
                          score_bin=score_bin(score), pool=pool, asked_intent=asked_intent)
            ruling = await self._rule(facts)
            if ruling.next_row:
                self._check.held(ruling.verdict.reason)
                if set_aside is not None:
                    set_aside.append(ruling.verdict.reason)
                continue
            self._check.count(ruling.verdict)
            outcome = self._outcome(facts, ruling, rows, policy)
            return pending if pending is not None and isinstance(outcome, Candidate) and outcome.refused else outcome
        return pending

    async def _beyond_band(self, query: CacheQuery, question: str, row: Nearest, rows: Sequence[Nearest],
                           asked_intent: IntentGuess | None, pool: PoolOnce,
                           set_aside: list[str] | None = None) -> Serve | Candidate | None:
        """A row below the band, read as the asked intent: served (or explored) only when the
        intent rule serves it past the guards and the document's veto; a refusal the intent rule
        wants checked (the model answers, and its answer checks the entry) as that candidate;
        else ``None``."""
        policy = query.category.semantic
        assert isinstance(policy, AdaptiveSemantic)
        check_row(row)
        root = root_of(row)
        score = decision_score(row.similarity, None, policy.threshold)
        facts = Facts(query=query, question=question, row=row, root=root, score=score, score_bin=score_bin(score),
                      pool=pool, asked_intent=asked_intent)
        beyond_rules = [rule for rule in self.rules(policy) if isinstance(rule, BEYOND_BAND_RULES)]
        ruling = await self._first_ruling(facts, beyond_rules)
        if ruling is not None:
            if not ruling.verdict.accepted and not ruling.check_after:
                if set_aside is not None:
                    set_aside.append(f"beyond:{ruling.verdict.reason}")
                return None
            self._check.count(ruling.verdict)
            return self._outcome(facts, ruling, [row, *rows], policy)
        if set_aside is not None:
            set_aside.append("beyond:passed")
        return None

    async def _rule(self, facts: Facts) -> Ruling:
        ruling = await self._first_ruling(facts, self.rules(facts.policy))
        if ruling is None:
            raise AssertionError("the last rule always rules")
        return ruling

    @staticmethod
    async def _first_ruling(facts: Facts, rules: Sequence[Rule]) -> Ruling | None:
        """The first rule's ruling, in order. A guard's refusal the intent rule may overrule
        (:attr:`Ruling.intent_may_serve`) stands unless the intent rule, when its turn comes,
        serves: any other rule's ruling before or after it, or its passing, keeps the guard's."""
        overrulable: Ruling | None = None
        for rule in rules:
            ruling = await rule(facts)
            if overrulable is not None:
                if isinstance(rule, IntentMatch) and ruling is not None and ruling.verdict.accepted:
                    return ruling
                if ruling is not None or isinstance(rule, IntentMatch):
                    return overrulable
                continue
            if ruling is not None and ruling.intent_may_serve:
                overrulable = ruling
                continue
            if ruling is not None:
                return ruling
        return overrulable

    def _outcome(self, facts: Facts, ruling: Ruling, rows: Sequence[Nearest],
                 policy: AdaptiveSemantic) -> Serve | Candidate:
        row, verdict = facts.row, ruling.verdict
        candidate = Candidate(
            key=row.key, root=facts.root, question=facts.cached_question, similarity=row.similarity,
            score_bin=facts.score_bin, answer=answer_bytes(row),
            neighbours=neighbours_of(facts.root, row, rows, policy.threshold), source=source_of(row),
            vouched=ruling.vouched, read=ruling.read_later,
            reader_said_no=self._explore.reader_no_kept(ruling, policy),
            refused="" if verdict.accepted else verdict.reason,
            intent=facts.asked_intent.intent if (ruling.vouched == VOUCH_INTENT or ruling.probation)
            and facts.asked_intent else "",
            trial_bin=ruling.trial_bin, probation=ruling.probation, probation_bin=ruling.probation_bin, far=ruling.far)
        if self._explore.explored(ruling, candidate.source, policy):
            return msgspec.structs.replace(candidate, explored=True)
        if verdict.accepted:
            return Serve(row=row, reason=verdict.reason, score_bin=facts.score_bin,
                         check=msgspec.structs.replace(candidate, first_check=True) if ruling.check_after else None,
                         candidate=candidate)
        # Refused so that the model's answer checks the entry (``intent_trusted_only``).
        return msgspec.structs.replace(candidate, first_check=True) if ruling.check_after else candidate

    async def precision(self, tag: str, category: str, policy: AdaptiveSemantic, tenant: str | None = None) -> Precision:
        """The category's live figures over every tenant (or one tenant's pool): the explored
        would-be hits estimate the error of served hits."""
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


__all__ = ["SOURCE_MODEL", "AdaptiveDecision", "Serve"]
