"""A team's intents, as a head on the deployment's embedder (issue #46): the stored form and the
worker's copy.

``strata intents load`` fits a linear softmax head over the team's labelled phrasings and
calibrates the confidence it serves at (app/cache/learning/intents.py); it is kept in Redis per
category and tenant as plain arrays and JSON (``strata:meta:intents:<category>:<tenant>``: fields
``meta``, ``weights``, ``bias``), tied to the fingerprint of the embedder it reads (the index's,
or ``STRATA_INTENT_EMBEDDER``'s: :class:`HeadReader`). Every load and removal bumps
``strata:meta:intents-generation``; each worker checks it every :data:`REFRESH_S` seconds and
reloads, so every worker and instance serves with a new load within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec
import numpy as np

from app.cache.storage.contract import CACHE_ERRORS, SharedRedis
from app.cache.storage.keys import (
    INTENTS_GENERATION_KEY,
    INTENTS_PREFIX,
    as_text,
    intents_file_key,
    intents_key,
    intents_refit_key,
)

logger = logging.getLogger("strata.intents")

# How often a worker looks for a new load (a load is served everywhere within this, plus a read).
REFRESH_S = 2.0


def softmax_and_energy(weights: np.ndarray, bias: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's probability of every class under ``softmax(vectors @ weights + bias)``, and the
    log-sum-exp of its logits, its energy: how strongly the head reads the question at all, before
    the softmax shares it out (energy-based out-of-distribution scoring: a question of none of
    the head's topics gets low logits everywhere, while its softmax can still look sure)."""
    logits = np.asarray(vectors, dtype=np.float32) @ weights + bias
    top = logits.max(axis=1, keepdims=True)
    probabilities: np.ndarray = np.exp(logits - top)
    totals = probabilities.sum(axis=1, keepdims=True)
    probabilities /= totals
    energy: np.ndarray = (top + np.log(totals))[:, 0]
    return probabilities, energy


def softmax_probabilities(weights: np.ndarray, bias: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each row's probability of every class under ``softmax(vectors @ weights + bias)``."""
    return softmax_and_energy(weights, bias, vectors)[0]


def softmax_predict(weights: np.ndarray, bias: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class index, its probability) of each row under ``softmax(vectors @ weights + bias)``."""
    probabilities = softmax_probabilities(weights, bias, vectors)
    return probabilities.argmax(axis=1), probabilities.max(axis=1)


# The intents a guess keeps the probability of: the veto asks how likely the asked question is
# to be of a cached row's intent, and below this it is as good as not at all.
LIKELY_FLOOR = 0.02


# The names teams give the questions they do not answer (case and separators ignored): Rasa's
# out_of_scope, Dialogflow's fallback. Such an intent is never served (app/intents.py).
OUT_OF_SCOPE_NAMES = frozenset({"oos", "outofscope", "fallback", "defaultfallbackintent", "nlufallback"})


def out_of_scope_name(intent: str) -> bool:
    return "".join(c for c in intent.casefold() if c.isalnum()) in OUT_OF_SCOPE_NAMES


class HeadMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What a head knows of itself, readable with ``redis-cli HGET ... meta``.

    Attributes:
        name: The load's name (``--name``, the file's stem by default).
        tenant: Whose head.
        category: The category it serves.
        intents: The intents, in the order of the weights' columns.
        shared: Per intent, whether one answer serves every question of it (``shared: false``:
            the answer depends on what the question names, so the head never serves it).
        threshold: The calibrated confidence: both questions at least this sure of one intent.
        fingerprint: The embedder it was fitted on (``name:dims``); another embedder refuses it.
        phrasings: Labelled phrasings it was fitted on (the curated answers' questions and variants included).
        accuracy: Cross-validated accuracy over the phrasings.
        served_share: Share of the held-out in-scope phrasings the rule would serve (right or not).
        held_out_wrong: Of the held-out phrasings at the threshold (unknown intents included), the wrong share.
        error_bound: The category's bound the threshold was calibrated for.
        rule: The calibrated rule in words.
        loaded_at: Unix time of the load.
        confused: The pairs of intents the held-out folds mixed up most (the twins): (intent,
            read as, times), most first.
        beyond_band: Whether the rule also looks beyond the band, at the nearest cached
            questions read as the asked intent (a head on a second embedder, whose neighbourhoods
            the index's band does not follow); calibrated that way.
    """

    name: str
    tenant: str
    category: str
    intents: list[str]
    shared: list[bool]
    threshold: float
    fingerprint: str
    phrasings: int
    accuracy: float
    served_share: float
    held_out_wrong: float
    error_bound: float
    rule: str
    loaded_at: int
    confused: list[tuple[str, str, int]] = msgspec.field(default_factory=list)
    beyond_band: bool = False
    # Phrasings of each intent, in the order of ``intents`` (empty in heads loaded before it was kept).
    phrasings_of: list[int] = msgspec.field(default_factory=list)
    # The risk the calibration ran at (1 - its confidence).
    delta: float = 0.05
    # The index's similarity from which the rule looks beyond the band (-1: at any, as heads
    # loaded before the floor were calibrated).
    beyond_floor: float = -1.0
    # The confidence the rule serves from on probation (above 1: none): what the file's own
    # cross-validation showed within the bound, below the certified ``threshold`` or without one;
    # each such hit is checked, and its intent's record can stop it (app/cache/decision/rules.py).
    probation: float = 1.01
    # The veto sets a row aside when the head gives the two questions less than this probability
    # of sharing an intent (:meth:`IntentGuess.shared_chance`); 0: no such veto (heads loaded before it).
    veto_below: float = 0.0
    # Per intent (``intents``' order), the highest confidence the file's out-of-scope stand-ins,
    # each held out, were read at as it. A model's answer cached under a reading no surer than
    # the highest of them may be the answer to an out-of-scope question, and serves its intent
    # only once a check agreed (empty: heads loaded before it, no such rule). The highest of all,
    # not its intent's: 200 stand-ins reach few of 150 intents, and a cached out-of-scope answer
    # served was as likely for the others (CLINC150 seed 1: 3 of 13 wrong hits with the reach
    # per intent); one miss per entry costs less than a wrong hit under a 1% bound.
    stand_in_reach: list[float] = msgspec.field(default_factory=list)
    # The head's word on a pair (the veto's floor, the entry record's even chance) counts only for
    # a question it reads at this energy or more (:func:`softmax_and_energy`): where 1% of the file's
    # held-out phrasings sit. Below, the question is of none of the team's topics and the head's
    # diffuse probabilities say nothing of it (general questions in a bank's category were 70%
    # set aside). ``None``: every question (heads loaded before it).
    domain_floor: float | None = None
    # Per intent (``intents``' order): the team's own phrasings of it differ in negation ("流量不够用"
    # and "怎么加流量包" are both `data_plan`), so negation does not tell its questions apart: the
    # intent rule may serve a pair both read as it that the negation guard alone sets aside
    # (the rules after it may not). Empty: heads loaded before it, the guard stands everywhere.
    negation_within: list[bool] = msgspec.field(default_factory=list)

    @property
    def serving(self) -> bool:
        return self.threshold <= 1

    @property
    def in_scope_intents(self) -> int:
        """The team's intents, its out-of-scope questions (or Strata's stand-ins) apart."""
        return sum(not out_of_scope_name(name) for name in self.intents)

    @property
    def in_scope_phrasings(self) -> int:
        """Their phrasings (all of the head's, for a head loaded before the counts were kept)."""
        if len(self.phrasings_of) != len(self.intents):
            return self.phrasings
        return sum(n for name, n in zip(self.intents, self.phrasings_of, strict=True) if not out_of_scope_name(name))


class IntentGuess(msgspec.Struct, frozen=True, kw_only=True):
    """What a head reads in one question.

    Attributes:
        intent: The most probable intent.
        confidence: Its probability.
        confident: At the calibrated threshold or above.
        shared: Whether the intent's answer serves every question of it.
        threshold: The head's calibrated threshold.
        beyond_band: Whether the rule looks beyond the band (:class:`HeadMeta`).
        beyond_floor: From which similarity it looks there (:class:`HeadMeta`).
        likely: The probability of every intent at ``LIKELY_FLOOR`` or above (the top one
            included): how likely the question is to be of a cached row's intent.
        probation: The confidence the rule serves from on probation (:class:`HeadMeta`).
        veto_below: The veto's floor on the two questions' chance of one intent (:class:`HeadMeta`).
        stand_in_reach: How confidently out-of-scope stand-ins were read as an intent, at most (:class:`HeadMeta`).
        in_domain: Read at the head's ``domain_floor`` or above: its word on a pair counts (:class:`HeadMeta`).
        negation_within: The team's phrasings of ``intent`` differ in negation (:class:`HeadMeta`).
        chances: Every intent's probability, in the head's order (the veto's chance that it shares
            a cached question's intent); ``positions``: each intent's place in it (the head's, shared).
    """

    intent: str
    confidence: float
    confident: bool
    shared: bool
    threshold: float
    beyond_band: bool = False
    beyond_floor: float = -1.0
    likely: dict[str, float] = msgspec.field(default_factory=dict)
    probation: float = 1.01
    veto_below: float = 0.0
    stand_in_reach: float = 0.0
    in_domain: bool = True
    negation_within: bool = False
    chances: list[float] = msgspec.field(default_factory=list)
    positions: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def lowest(self) -> float:
        """The lowest confidence the intent rule may serve at: certified, or on probation."""
        return min(self.threshold, self.probation)

    def chance_of(self, intent: str) -> float:
        """The head's probability that the question is of ``intent`` (0 under ``LIKELY_FLOOR``)."""
        return self.likely.get(intent, 0.0)

    def shared_chance(self, cached: Mapping[str, float]) -> float:
        """The head's probability that this question and a cached one (its likely intents, as its
        document keeps them) share an intent: the sum over intents of the two probabilities'
        product, the cached side's under ``LIKELY_FLOOR`` counted as 0 (as the calibration counts it)."""
        if self.chances:
            return sum(self.chances[self.positions[intent]] * p for intent, p in cached.items() if intent in self.positions)
        return sum(self.likely.get(intent, 0.0) * p for intent, p in cached.items())


def likely_json(likely: Mapping[str, float]) -> str:
    """A question's likely intents as stored on its document (``intent_likely``)."""
    return msgspec.json.encode({intent: round(p, 4) for intent, p in likely.items()}).decode()


def likely_from(raw: object) -> dict[str, float] | None:
    """A document's stored likely intents; ``None`` when absent or unreadable."""
    text = as_text(raw)
    if not text:
        return None
    try:
        return msgspec.json.decode(text, type=dict[str, float])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def likely_rows(probabilities: np.ndarray, intents: Sequence[str]) -> list[dict[str, float]]:
    """Each row's intents at ``LIKELY_FLOOR`` or above with their probabilities."""
    return [{intents[int(j)]: float(row[j]) for j in np.flatnonzero(row >= LIKELY_FLOOR)} for row in probabilities]


class IntentHead:
    """A fitted head: ``softmax(x @ weights + bias)`` over the intents, on unit-length vectors.

    Args:
        meta: What it knows of itself.
        weights: ``(dims, intents)`` float32.
        bias: ``(intents,)`` float32.
    """

    def __init__(self, meta: HeadMeta, weights: np.ndarray, bias: np.ndarray) -> None:
        self.meta = meta
        self.weights = np.asarray(weights, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)
        self.positions = {intent: i for i, intent in enumerate(meta.intents)}

    def predict(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(intent index, confidence) of each row."""
        return softmax_predict(self.weights, self.bias, np.atleast_2d(vectors))

    def guess(self, vector: np.ndarray) -> IntentGuess:
        read, energy = softmax_and_energy(self.weights, self.bias, np.atleast_2d(vector))
        probabilities = read[0]
        floor = self.meta.domain_floor
        in_domain = floor is None or float(energy[0]) >= floor
        i = int(probabilities.argmax())
        sure = float(probabilities[i])
        meta = self.meta
        return IntentGuess(intent=meta.intents[i], confidence=sure, confident=sure >= meta.threshold,
                           shared=meta.shared[i], threshold=meta.threshold, beyond_band=meta.beyond_band,
                           beyond_floor=meta.beyond_floor, likely=likely_rows(probabilities[None, :], meta.intents)[0],
                           probation=meta.probation, veto_below=meta.veto_below,
                           stand_in_reach=max(meta.stand_in_reach, default=0.0), in_domain=in_domain,
                           negation_within=i < len(meta.negation_within) and meta.negation_within[i],
                           chances=probabilities.tolist(), positions=self.positions)

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        """Each row's probability of every intent."""
        return softmax_probabilities(self.weights, self.bias, np.atleast_2d(vectors))

    def to_hash(self) -> dict[str, bytes]:
        return {"meta": msgspec.json.encode(self.meta), "weights": self.weights.tobytes(), "bias": self.bias.tobytes()}

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> IntentHead:
        """Raises ``ValueError`` for a hash that is not a head Strata wrote."""
        fields = {str(as_text(k)): v.encode() if isinstance(v, str) else v for k, v in raw.items()}
        try:
            meta = msgspec.json.decode(fields["meta"], type=HeadMeta)
            count = len(meta.intents)
            weights = np.frombuffer(fields["weights"], dtype=np.float32)
            bias = np.frombuffer(fields["bias"], dtype=np.float32)
        except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"not an intent head: {exc}") from exc
        if bias.size != count or weights.size % count:
            raise ValueError("an intent head whose arrays do not match its intents")
        return cls(meta, weights.reshape(-1, count), bias)


class IntentStore:
    """The heads in Redis (the shared client: they live outside any bucket)."""

    def __init__(self, redis: SharedRedis) -> None:
        self._redis = redis

    async def save(self, head: IntentHead) -> None:
        """Replace a tenant's head in a category atomically (a reader sees the old one or the new)."""
        key = intents_key(head.meta.category, head.meta.tenant)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=head.to_hash())  # type: ignore[arg-type]
            await pipe.execute()
        await self._redis.incr(INTENTS_GENERATION_KEY)

    async def remove(self, category: str, tenant: str) -> bool:
        removed = bool(await self._redis.delete(intents_key(category, tenant)))
        await self._redis.delete(intents_file_key(category, tenant))
        if removed:
            await self._redis.incr(INTENTS_GENERATION_KEY)
        return removed

    async def get(self, category: str, tenant: str) -> IntentHead | None:
        fields = await self._redis.hgetall(intents_key(category, tenant))
        return IntentHead.from_hash(fields) if fields else None

    async def generation(self) -> int:
        return int(await self._redis.get(INTENTS_GENERATION_KEY) or 0)

    async def all(self) -> list[IntentHead]:
        heads = []
        async for key in self._redis.scan_iter(match=INTENTS_PREFIX + "*", count=500):
            fields = await self._redis.hgetall(key)
            try:
                heads.append(IntentHead.from_hash(fields))
            except ValueError as exc:
                logger.warning("intent head %s unreadable, not served: %s", as_text(key), exc)
        return heads


# A refit still "running" after this long died with its worker; another may start.
REFIT_LOCK_S = 900
# How long the console shows a finished refit.
REFIT_KEPT_S = 7 * 86400


class RefitState(msgspec.Struct, frozen=True, kw_only=True):
    """The console's last refit of a head: ``running`` (the lock), ``done`` or ``failed``."""

    state: str
    by: str
    started_at: int
    finished_at: int | None = None
    said: str = ""


class IntentRefits:
    """The console's refits: one at a time per tenant and category, and what the last one said."""

    def __init__(self, redis: SharedRedis) -> None:
        self._redis = redis

    async def start(self, category: str, tenant: str, by: str) -> RefitState | None:
        """Take the lock: the running state, or ``None`` when a refit is running already."""
        state = RefitState(state="running", by=by, started_at=int(time.time()))
        taken = await self._redis.set(intents_refit_key(category, tenant), msgspec.json.encode(state),
                                      nx=True, ex=REFIT_LOCK_S)
        return state if taken else None

    async def finish(self, category: str, tenant: str, started: RefitState, *, failed: bool, said: str) -> None:
        state = msgspec.structs.replace(started, state="failed" if failed else "done", said=said,
                                        finished_at=int(time.time()))
        await self._redis.set(intents_refit_key(category, tenant), msgspec.json.encode(state), ex=REFIT_KEPT_S)

    async def get(self, category: str, tenant: str) -> RefitState | None:
        raw = await self._redis.get(intents_refit_key(category, tenant))
        try:
            return msgspec.json.decode(raw, type=RefitState) if raw else None
        except msgspec.DecodeError:
            return None


class Vectors(Protocol):
    """Texts in, unit-length float32 rows out, off the event loop (app/cache/readers/embedder.py)."""

    name: str

    async def vectors(self, texts: Sequence[str]) -> np.ndarray: ...


class HeadReader:
    """The vectors the intent heads read (``STRATA_INTENT_EMBEDDER``): the index's own (the
    default: nothing more to compute), or a second embedder's, whose vectors the heads are then
    fitted, calibrated and served on while the index, its KNN and its floor stay on the first
    (EmbeddingGemma's head served 0.64 of a perfect cache on the bank where USE's served 0.19,
    docs/QUALITY.md). A question's second vector is kept in memory by text, so the store after a
    miss embeds nothing again (kept per tenant, as the index's vectors are: a shared memo would
    tell one tenant, by its speed, what another asks).

    Args:
        source: The second embedder; ``None``: the heads read the index's vectors.
        fingerprint: What a head must have been fitted on to be served here.
        remembered: Questions whose second vector is kept.
    """

    def __init__(self, source: Vectors | None, fingerprint: str, remembered: int = 4096) -> None:
        self.source = source
        self.fingerprint = fingerprint
        self._remembered = remembered
        self._kept: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    async def vector(self, text: str, index_vector: np.ndarray, tenant: str = "") -> np.ndarray:
        """What a head reads in one question (``index_vector``: the index's vector of it)."""
        if self.source is None:
            return index_vector
        key = (tenant, text)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        row: np.ndarray = (await self.source.vectors([text]))[0]
        self._kept[key] = row
        if len(self._kept) > self._remembered:
            self._kept.popitem(last=False)
        return row

    async def vectors(self, texts: Sequence[str], index_vectors: np.ndarray, slice_size: int = 64) -> np.ndarray:
        """What the heads read in many texts (a load's phrasings, the cached questions), in slices."""
        if self.source is None:
            return index_vectors
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        rows = [await self.source.vectors(texts[i:i + slice_size]) for i in range(0, len(texts), slice_size)]
        return np.concatenate(rows).astype(np.float32)


class IntentHeads:
    """This worker's copy of every head, refreshed when the generation moves.

    Args:
        store: Where the heads are kept.
        reader: What the heads read; its fingerprint (``name:dims``) is what a head must have been
            fitted on to be served here.
        english: What the heads of English files read, when it is another (issue #58); a head
            fitted on either is served, each read by its own.
    """

    def __init__(self, store: IntentStore, reader: HeadReader, english: HeadReader | None = None) -> None:
        self._store = store
        self.reader = reader
        self.english = english
        self.fingerprint = reader.fingerprint
        self.readers = {r.fingerprint: r for r in (reader, english) if r is not None}
        self._heads: dict[tuple[str, str], IntentHead] = {}
        self._refused: dict[tuple[str, str], str] = {}
        self._generation = -1
        self.checked_at = 0.0

    def reader_for(self, head: IntentHead) -> HeadReader:
        """What this head reads (a head is kept here only when one of the readers is its own)."""
        return self.readers.get(head.meta.fingerprint, self.reader)

    def get(self, tenant: str, category: str) -> IntentHead | None:
        """The tenant's head in the category, if one is loaded for this embedder."""
        return self._heads.get((tenant, category))

    def loaded(self) -> list[IntentHead]:
        return list(self._heads.values())

    def refused(self) -> dict[tuple[str, str], str]:
        """Heads loaded but not served here, and why (another embedder)."""
        return dict(self._refused)

    async def refresh(self) -> bool:
        """Reload when a head was loaded or removed anywhere; returns whether it reloaded."""
        self.checked_at = time.monotonic()
        generation = await self._store.generation()
        if generation == self._generation:
            return False
        heads, refused = {}, {}
        for head in await self._store.all():
            where = (head.meta.tenant, head.meta.category)
            if head.meta.fingerprint not in self.readers:
                refused[where] = (f"fitted on {head.meta.fingerprint}, this deployment's heads read "
                                  f"{' or '.join(self.readers)}")
                continue
            heads[where] = head
        self._heads, self._refused, self._generation = heads, refused, generation
        return True

    async def run(self) -> None:
        """Refresh every :data:`REFRESH_S` seconds until cancelled; a Redis failure keeps the copy."""
        while True:
            try:
                await self.refresh()
            except CACHE_ERRORS as exc:
                logger.debug("intent heads not refreshed (kept): %r", exc)
            await asyncio.sleep(REFRESH_S)
