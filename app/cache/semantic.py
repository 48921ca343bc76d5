"""L2: the semantic layer. A question's embedding, its nearest cached questions in the same scope
(app/cache/storage/index.py), and the decision whether one of them may answer it: the adaptive
rules (app/cache/decision/) for a category with an error bound, the guards and the verifier for
a fixed-threshold one. Only the last user message is embedded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import numpy as np
from redis.asyncio import Redis
from redisvl.index import AsyncSearchIndex

from app import tracing
from app.cache.decision.adaptive import AdaptiveDecision, Serve
from app.cache.decision.candidates import answer_bytes, check_row, root_of, source_of
from app.cache.decision.rules import BAND_ROWS, near_floor
from app.cache.decision.stats import PooledObservations, milli, score_bin
from app.cache.decision.verify import WRONG_BEFORE, CandidateCheck, ThresholdVerifier
from app.cache.learning.intents import OF_INTENT
from app.cache.readers.base import Reader
from app.cache.storage.contract import CacheHit, CacheQuery, Candidate, EmbeddingFailed, Nearest, Verdict
from app.cache.storage.entry import CacheEntry, EntryWriter
from app.cache.storage.index import CANDIDATES, SemanticIndex, calls_tools
from app.cache.storage.intents import IntentGuess, IntentHead, IntentHeads, likely_json
from app.cache.storage.keys import (
    FIELD_INTENT,
    FIELD_INTENT_CONFIDENCE,
    FIELD_QUESTION,
    FIELD_WRONG_ABOVE,
    KEYS,
    SOURCE_MODEL,
    Keyspace,
    as_text,
)
from app.cache.storage.usage import HitCounts
from app.embed import Embedder
from app.policy import AdaptiveSemantic, SemanticPolicy

logger = logging.getLogger("strata.semantic")

SEMANTIC = "semantic"
# The verdict counted for a question longer than the semantic layer takes.
QUESTION_TOO_LONG = "question_too_long"
# The band the adaptive decision rules on: the rows the intents' calibration replays too.
ADAPTIVE_CANDIDATES = BAND_ROWS
# Pairs (question, document) a worker remembers having served semantically (in memory: a hit
# writes nothing to Redis); the second serve of one is checked by the model after the response.
SERVED_REMEMBERED = 65_536


class SemanticCache:
    """Nearest cached question in the same scope, if similar enough and verified."""

    name = SEMANTIC

    def __init__(
        self, redis: Redis, embedder: Embedder, schema_path: Path, check: CandidateCheck | None = None, *,
        memo_size: int = 4096, learning_refresh_s: float = 1.0, keys: Keyspace = KEYS,
        pool_sources: Sequence[tuple[Redis, Keyspace]] = (), max_question_chars: int = 1_000,
        reader: Reader | None = None, on_read: Callable[[str, str], None] | None = None,
        intents: IntentHeads | None = None,
    ) -> None:
        self._redis = redis
        self.keys = keys
        self._embedder = embedder
        self.store_index = SemanticIndex(redis, embedder.dims, embedder.name, schema_path, keys)
        self._check = check or CandidateCheck(ThresholdVerifier())
        self.adaptive = AdaptiveDecision(redis, self._check,
                                         PooledObservations(redis, learning_refresh_s, keys, pool_sources), keys=keys,
                                         reader=reader, on_read=on_read)
        self._writer = EntryWriter(redis, keys)
        self.hits = HitCounts(redis)
        # Recent question embeddings: the write-back after a miss reuses the lookup's vector. Keyed
        # by tenant too: a memo shared by tenants would answer one tenant's lookup faster when
        # another had asked the same question, telling it what the other asks.
        self._memo: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._memo_size = memo_size
        # Questions served a model's answer semantically (their exact digest and the document),
        # and whether that pair's check was asked: see _asked_again.
        self._served_once: OrderedDict[str, bool] = OrderedDict()
        self._max_question_chars = max_question_chars
        self.intents = intents

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @property
    def check(self) -> CandidateCheck:
        """The guards and verifier this layer decides with (the intents' calibration replays them)."""
        return self._check

    @property
    def keys_redis(self) -> Redis:
        """The Redis holding this layer's documents (its bucket's, on a cluster)."""
        return self._redis

    async def index(self, tag: str) -> AsyncSearchIndex:
        """The index of a version, created on first use."""
        return await self.store_index.index(tag)

    def forget_index(self, tag: str) -> None:
        self.store_index.forget_index(tag)

    async def documents_of(self, tag: str, root: str) -> set[str]:
        """The keys of every document serving an entry's answer: the entry and its aliases."""
        return await self.store_index.documents_of(tag, root)

    async def candidates(self, query: CacheQuery, vector: np.ndarray, limit: int = CANDIDATES) -> list[Nearest]:
        return await self.store_index.candidates(query, vector, limit)

    async def vector(self, question: str, tenant: str) -> np.ndarray:
        """The question's embedding (memoised per tenant).

        Raises:
            EmbeddingFailed: The model failed; the pipeline treats it as a cache failure.
        """
        memo_key = (tenant, question)
        cached = self._memo.get(memo_key)
        if cached is not None:
            self._memo.move_to_end(memo_key)
            return cached
        try:
            vector: np.ndarray = (await self._embedder.embed([question], owner=tenant))[0]
        except Exception as exc:  # any model failure becomes a cache failure, never a 500
            raise EmbeddingFailed(f"{self._embedder.name}: {exc!r}") from exc
        self._memo[memo_key] = vector
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return vector

    def serves(self, question: str | None, policy: SemanticPolicy) -> bool:
        """Whether this layer looks up and stores the question: a text of at most the configured
        length, in a category whose semantic layer is on."""
        return question is not None and policy.enabled and len(question) <= self._max_question_chars

    async def lookup(self, query: CacheQuery) -> CacheHit | Candidate | None:
        question, policy = query.canonical.question, query.category.semantic
        if question is not None and policy.enabled and len(question) > self._max_question_chars:
            self._check.held(QUESTION_TOO_LONG)  # counted; the exact layer still serves it
        if question is None or not self.serves(question, policy):
            return None
        with tracing.span(tracing.EMBED):
            vector = await self.vector(question, query.canonical.tenant)
        if isinstance(policy, AdaptiveSemantic):
            head = self.intents.get(query.canonical.tenant, query.category.name) if self.intents is not None else None
            with tracing.span(tracing.KNN) as step:
                rows = await self.store_index.candidates(query, vector, ADAPTIVE_CANDIDATES)
                if step is not None:
                    tracing.note(step, {tracing.CANDIDATES: len(rows)})
            guess = await self.read_intent(head, question, vector, query.canonical.tenant)
            beyond: list[Nearest] = []
            # Beyond the band: a head on a second embedder (its neighbourhoods are not the index's),
            # and any head on probation (its hits are checked: where the band holds no cached
            # question of the asked intent, paraphrases further out are what a small file serves).
            on_probation = guess is not None and policy.intent_probation and guess.probation <= guess.confidence
            if guess is not None and guess.confidence >= guess.lowest and guess.shared \
                    and (guess.beyond_band or on_probation) and not any(
                    row.similarity >= policy.threshold and as_text(row.fields.get(FIELD_INTENT)) == guess.intent
                    and float(as_text(row.fields.get(FIELD_INTENT_CONFIDENCE)) or 0.0) >= guess.lowest for row in rows):
                # On probation from further out: the rule serves those far pairs only on
                # probation, on a record of their own (rules.near_floor, rules.far_watch).
                floor = near_floor(policy, guess)
                if on_probation:
                    floor = min(floor, policy.intent_far_floor)
                beyond = [row for row in await self.store_index.candidates_of_intent(query, vector, guess.intent, OF_INTENT)
                          if row.similarity >= floor]
            with tracing.span(tracing.DECIDE) as step:
                set_aside: list[str] | None = [] if step is not None else None
                decided = await self.adaptive.decide(query, question, rows, guess, beyond_band=beyond,
                                                     set_aside=set_aside)
                if step is not None:
                    self._trace_decision(step, question, decided, rows)
                    tracing.note(step, {tracing.SET_ASIDE: ",".join(set_aside or []), tracing.BEYOND: len(beyond)})
            if isinstance(decided, Serve):
                check = decided.check or self._asked_again(query, decided)
                return self._hit(decided.row, decided.reason, decided.score_bin, check)
            return decided
        with tracing.span(tracing.KNN) as step:
            rows = await self.store_index.candidates(query, vector)
            if step is not None:
                tracing.note(step, {tracing.CANDIDATES: len(rows)})
        with tracing.span(tracing.DECIDE) as step:
            if step is not None:
                tracing.note(step, {}, text={tracing.QUESTION: question})
            for row in rows:
                if row.similarity < policy.threshold:
                    break  # most similar first: the rest are below too
                check_row(row)
                if milli(row.similarity) <= int(row.fields.get(FIELD_WRONG_ABOVE) or -1):
                    # An end user said this document's answer was wrong at this similarity or below.
                    self._check.count(Verdict(False, WRONG_BEFORE))
                    continue
                verdict = await self._check.decide(question, row.fields[FIELD_QUESTION], row.similarity, policy,
                                                   query.canonical.model)
                if step is not None:
                    tracing.note(step, {tracing.RULE: verdict.reason, tracing.SIMILARITY: round(row.similarity, 4),
                                        tracing.VERDICT: "served" if verdict.accepted else "refused"},
                                 text={tracing.CACHED_QUESTION: str(row.fields[FIELD_QUESTION])})
                if verdict.accepted:
                    return self._hit(row, verdict.reason, score_bin(row.similarity))
            if step is not None:
                tracing.note(step, {tracing.VERDICT: "refused"})
        return None

    def _asked_again(self, query: CacheQuery, decided: Serve) -> Candidate | None:
        """The check of a question served a model's answer semantically once already (on this
        worker), at its second serve (issue #58 item 4): served again, and the model is asked the
        same question after the response (as the intent rule's first check is). A semantic hit
        writes no exact entry, so a wrong one would be served to every repeat of its question;
        one check covers them all: a disagreement vetoes the document at that similarity (the
        next repeat is answered by the model, then is an exact hit of its own answer), marks the
        entry refuted for its intent and goes to the review queue. Curated answers are not
        checked: they are the team's word. ``None``: no check to ask."""
        policy = query.category.semantic
        if not (isinstance(policy, AdaptiveSemantic) and policy.check_repeats) or decided.candidate is None \
                or decided.check is not None or source_of(decided.row) != SOURCE_MODEL:
            return None
        if decided.row.key == self.keys.semantic_prefix(query.version) + query.entry_digest:
            return None  # the question's own wording: a check (or a reviewer) put it there
        key = f"{query.version}|{query.generation}|{query.entry_digest}|{decided.row.key}"
        seen = self._served_once.get(key)
        self._served_once[key] = seen is not None  # True once its check was asked
        self._served_once.move_to_end(key)
        if len(self._served_once) > SERVED_REMEMBERED:
            self._served_once.popitem(last=False)
        if seen is None or seen:
            return None  # its first serve, or checked already
        return msgspec.structs.replace(decided.candidate, first_check=True)

    @staticmethod
    def _trace_decision(step: tracing.Span, question: str, decided: Serve | Candidate | None,
                        rows: list[Nearest]) -> None:
        """The adaptive decision on its span: the rule that served (or why the nearest was
        refused, or explored), the candidate's similarity; the questions only if opted in."""
        rule: str | None
        similarity: float | None
        if isinstance(decided, Serve):
            verdict, rule, similarity, cached = "served", decided.reason, decided.row.similarity, decided.row.fields.get(FIELD_QUESTION)
        elif isinstance(decided, Candidate):
            verdict = "explored" if decided.explored else "refused"
            rule, similarity, cached = decided.refused or decided.vouched or None, decided.similarity, decided.question
        else:
            verdict, rule = "none", None
            similarity, cached = (rows[0].similarity, rows[0].fields.get(FIELD_QUESTION)) if rows else (None, None)
        tracing.note(step, {tracing.VERDICT: verdict, tracing.RULE: rule,
                            tracing.SIMILARITY: round(similarity, 4) if similarity is not None else None},
                     text={tracing.QUESTION: question, tracing.CACHED_QUESTION: str(as_text(cached) or "")})

    async def read_intent(self, head: IntentHead | None, question: str, vector: np.ndarray,
                          tenant: str) -> IntentGuess | None:
        """What the tenant's head reads in the question: on the index's ``vector``, or on the
        intent embedder's vector of the question when one is configured.

        Raises:
            EmbeddingFailed: The intent embedder failed; a cache failure, as the index's would be.
        """
        if head is None or self.intents is None:
            return None
        reader = self.intents.reader_for(head)
        try:
            read = await reader.vector(question, vector, tenant)
        except Exception as exc:  # any model failure becomes a cache failure, never a 500
            raise EmbeddingFailed(f"intent embedder {reader.fingerprint}: {exc!r}") from exc
        return head.guess(read)

    def _hit(self, row: Nearest, reason: str, bin_: int, check: Candidate | None = None) -> CacheHit:
        self.hits.add(row.key)  # added in a batch every second: no round trip per hit
        return CacheHit(layer=self.name, completion=answer_bytes(row), similarity=row.similarity,
                        matched_question=row.fields[FIELD_QUESTION], reason=reason, source=source_of(row),
                        key=root_of(row), document=row.key, score_bin=bin_, check=check)

    async def store(self, query: CacheQuery, completion: bytes) -> None:
        canonical, policy = query.canonical, query.category.semantic
        if canonical.question is None or not self.serves(canonical.question, policy):
            return
        if not policy.tool_calls and calls_tools(completion):
            return  # an action is served only to the request it was made for (the exact layer)
        await self.store_index.index(query.version)
        vector = await self.vector(canonical.question, canonical.tenant)
        key = self.keys.semantic_prefix(query.version) + query.entry_digest
        # The tenant's intent head, if it has one here, reads the question now: the intent rule
        # then needs no model at lookup beyond the asked question.
        head = self.intents.get(canonical.tenant, query.category.name) if self.intents is not None else None
        guess = await self.read_intent(head, canonical.question, vector, canonical.tenant)
        entry = CacheEntry.for_query(
            query, completion, scope=query.scope_digest, embedding=vector.astype(np.float32).tobytes(), root=key,
            intent=guess.intent if guess is not None else None,
            intent_confidence=guess.confidence if guess is not None else None,
            intent_likely=likely_json(guess.likely) if guess is not None else None,
        )
        await self._writer.write(key, entry, query)
