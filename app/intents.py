"""``strata intents``: a team teaches the cache its intents (issue #46).

A file of labelled phrasings (CSV ``text,intent``, or YAML: a list of ``{intent, phrasings,
answer?, shared?}``) is checked whole first; then a head is fitted on the deployment's embedder
and calibrated on the team's data alone (app/cache/learning/intents.py), stored per tenant and
category (app/cache/storage/intents.py), the category's existing documents labelled with it, and
the intents' own answers, if given, stored as curated answers of their intent. The curated FAQ of
that tenant and category (``strata faq load``) counts as labelled phrasings too: each entry an
intent, its question and variants its phrasings.
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import yaml
from redisvl.query import FilterQuery
from redisvl.query.filter import Tag

from app.cache.decision.rules import far_words, intent_may_overrule
from app.cache.decision.stats import clean_checks_to_certify, risk_level
from app.cache.decision.verify import NEGATION_DIFFERS
from app.cache.learning.intents import Calibration, SoftmaxHead, calibrate, why_it_serves_nothing
from app.cache.storage.intents import (
    HeadMeta,
    HeadReader,
    IntentHead,
    IntentStore,
    likely_json,
    likely_rows,
    out_of_scope_name,
)
from app.cache.storage.keys import (
    FIELD_CATEGORY,
    FIELD_EMBEDDING,
    FIELD_INTENT,
    FIELD_INTENT_CHECKED,
    FIELD_INTENT_CONFIDENCE,
    FIELD_INTENT_LIKELY,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SOURCE,
    FIELD_TENANT,
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
    SOURCE_FAQ,
    as_text,
    intents_file_key,
    normalize_text,
)
from app.calibrate.pairs import read_utf8
from app.embed import embed_in_slices
from app.faq import FaqItem, load_faq_in_buckets
from app.policy import AdaptiveSemantic, Policy

# Bounds of a file: what one load may ask of the embedder and of Redis.
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_PHRASINGS = 50_000
MAX_TEXT_CHARS = 1_000
FAQ_INTENT_PREFIX = "faq:"


class IntentsFileError(ValueError):
    """A file that cannot be loaded; the message is one line for the user."""


class IntentDef(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One intent of a team's file.

    Attributes:
        intent: Its name.
        phrasings: How customers ask it (at least two).
        answer: The team's answer: served, as a curated answer, to a confident question of it.
        shared: Whether one answer serves every question of it; false when the answer depends on
            what the question names (a restaurant, a date, an amount): never served by the head.
    """

    intent: str
    phrasings: list[str]
    answer: str | None = None
    shared: bool = True

    @property
    def out_of_scope(self) -> bool:
        """Questions the team does not answer (Rasa's ``out_of_scope``, Dialogflow's fallback):
        never served; the calibration's out-of-scope questions, instead of intents held out."""
        return out_of_scope_name(self.intent)




# Strata's own out-of-scope questions, English (app/data/out_of_scope_en.txt) and Chinese
# (out_of_scope_zh.txt): the calibration's unknown questions, and an intent the head learns, when
# a team gives none. A tenth of the team's intents held out instead are twins of its known ones,
# and hold a head to a threshold real out-of-scope traffic does not need; and a head that knows
# no out-of-scope question reads "今天天气怎么样" as the nearest intent at 1.00 (issue #62).
DATA = Path(__file__).resolve().parent / "data"
OUT_OF_SCOPE_FILE = DATA / "out_of_scope_en.txt"
OUT_OF_SCOPE_FILE_ZH = DATA / "out_of_scope_zh.txt"
STAND_IN_INTENT = "out_of_scope"
# A file reads as English when this share of its phrasings is mostly ASCII letters, as Chinese
# when this share has a Han character.
ENGLISH_SHARE = 0.9


def reads_english(items: list[IntentDef]) -> bool:
    texts = [t for item in items for t in item.phrasings]

    def latin(text: str) -> bool:
        letters = [c for c in text if c.isalpha()]
        return bool(letters) and sum(c.isascii() for c in letters) >= 0.9 * len(letters)

    return bool(texts) and sum(latin(t) for t in texts) >= ENGLISH_SHARE * len(texts)


def reads_chinese(items: list[IntentDef]) -> bool:
    texts = [t for item in items for t in item.phrasings]
    return bool(texts) and sum(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts) >= ENGLISH_SHARE * len(texts)


def out_of_scope_stand_ins(items: list[IntentDef]) -> list[IntentDef]:
    """Strata's out-of-scope questions in the file's language (English or Chinese) as an
    ``out_of_scope`` intent, for a file with none of its own (none for another language: its
    held-out intents stand in, as before)."""
    if any(item.out_of_scope for item in items):
        return []
    source = OUT_OF_SCOPE_FILE if reads_english(items) else OUT_OF_SCOPE_FILE_ZH if reads_chinese(items) else None
    if source is None:
        return []
    taken = {normalize_text(t) for item in items for t in item.phrasings}
    lines = source.read_text(encoding="utf-8").splitlines()
    stand_ins = [t for t in dict.fromkeys(normalize_text(line) for line in lines if line and not line.startswith("#"))
                 if t not in taken]
    return [IntentDef(intent=STAND_IN_INTENT, phrasings=stand_ins, shared=False)] if len(stand_ins) >= 2 else []


def read_intents(path: Path) -> list[IntentDef]:
    """Read and check a whole file; nothing is loaded from a file that fails a check.

    Raises:
        IntentsFileError: Too large, unreadable, malformed, an empty text or intent, an intent
            with one phrasing, a phrasing under two intents.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise IntentsFileError(f"{path}: {exc.strerror or exc}") from exc
    if size > MAX_FILE_BYTES:
        raise IntentsFileError(f"{path}: {size} bytes, more than the {MAX_FILE_BYTES} a load takes")
    text = read_utf8(path, IntentsFileError)
    try:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(io.StringIO(text))
            if not {"text", "intent"} <= set(reader.fieldnames or []):
                raise IntentsFileError(f"{path}: the header must name text and intent (found {reader.fieldnames})")
            grouped: dict[str, list[str]] = {}
            for line, row in enumerate(reader, start=2):
                intent = (row.get("intent") or "").strip()
                if not intent:
                    raise IntentsFileError(f"{path}: line {line}: an empty intent")
                grouped.setdefault(intent, []).append(row.get("text") or "")
            items = [IntentDef(intent=name, phrasings=texts) for name, texts in grouped.items()]
        else:
            items = msgspec.convert(yaml.safe_load(text), list[IntentDef])
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise IntentsFileError(f"{path}: {exc}") from exc
    if not items:
        raise IntentsFileError(f"{path}: no intents")
    owner: dict[str, str] = {}
    total = 0
    for item in items:
        where = f"{path}: intent {item.intent!r}"
        if not item.intent.strip() or len(item.intent) > 128:
            raise IntentsFileError(f"{path}: an intent name must have 1 to 128 characters")
        texts = [normalize_text(t) for t in item.phrasings]
        if any(not t for t in texts):
            raise IntentsFileError(f"{where}: an empty phrasing")
        if any(len(t) > MAX_TEXT_CHARS for t in texts):
            raise IntentsFileError(f"{where}: a phrasing longer than {MAX_TEXT_CHARS} characters")
        if len(set(texts)) < 2:
            raise IntentsFileError(f"{where}: needs at least two different phrasings")
        if item.answer is not None and not item.answer.strip():
            raise IntentsFileError(f"{where}: an empty answer")
        if item.out_of_scope and item.answer is not None:
            raise IntentsFileError(f"{where}: questions out of scope have no answer to serve")
        for t in texts:
            if owner.setdefault(t, item.intent) != item.intent:
                raise IntentsFileError(f"{path}: {t!r} is a phrasing of both {owner[t]!r} and {item.intent!r}")
        total += len(texts)
    if len({item.intent for item in items}) != len(items):
        raise IntentsFileError(f"{path}: an intent is given twice")
    if total > MAX_PHRASINGS:
        raise IntentsFileError(f"{path}: {total} phrasings, more than the {MAX_PHRASINGS} a load takes")
    return items


class IntentsLoaded(msgspec.Struct, frozen=True, kw_only=True):
    """What a load did, for its summary line."""

    meta: HeadMeta
    labelled: int
    answers: int
    seconds: float
    # Of them, embedding the phrasings, and fitting and calibrating the head (the 2 minutes).
    embedding_seconds: float = 0.0
    fitting_seconds: float = 0.0
    # Strata's out-of-scope stand-ins added (the file had no out_of_scope intent of its own).
    stand_ins: int = 0
    # What the head reads, and why that one (the file's language).
    reads: str = ""

    def line(self) -> str:
        m = self.meta
        added = (f" (with {self.stand_ins} out-of-scope questions of Strata's as the calibration's unknown ones: "
                 "the file has no out_of_scope intent)") if self.stand_ins else ""
        # One line; what the rule does, or why it serves nothing and what would change that, comes
        # last: it is what the team acts on.
        return (f"loaded {m.phrasings - self.stand_ins} phrasings of {len(m.intents) - bool(self.stand_ins)} intents as "
                f"{m.name!r} for tenant {m.tenant!r} in {m.category!r}{added}"
                f"{f', read by {self.reads}' if self.reads else ''}: cross-validated accuracy "
                f"{m.accuracy:.1%}; it would serve "
                f"{m.served_share:.1%} of the team's held-out phrasings ({m.held_out_wrong:.2%} of them wrong); "
                f"{self.labelled} cached documents labelled, {self.answers} intent answers stored; {self.seconds:.0f} s "
                f"({self.embedding_seconds:.0f} s embedding, {self.fitting_seconds:.0f} s fitting and calibrating); "
                f"rule: {m.rule}")


async def curated_intents(cache: object, tag: str, tenant: str, category: str) -> list[IntentDef]:
    """The tenant's curated FAQ in the category as intents: each entry's question and variants."""
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts)
    groups: dict[str, list[str]] = {}
    for bucket in cache.each:
        if bucket.semantic is None:
            continue
        index = await bucket.semantic.index(tag)
        query = FilterQuery((Tag(FIELD_TENANT) == tenant) & (Tag(FIELD_CATEGORY) == category) & (Tag(FIELD_SOURCE) == SOURCE_FAQ),
                            return_fields=[FIELD_QUESTION, FIELD_ROOT, FIELD_INTENT], num_results=10_000)
        for row in await index.query(query):
            if row.get(FIELD_INTENT) and not str(row[FIELD_INTENT]).startswith(FAQ_INTENT_PREFIX):
                continue  # an answer of the team's own intents (labelled by its file)
            groups.setdefault(str(row.get(FIELD_ROOT) or row["id"]), []).append(str(row.get(FIELD_QUESTION, "")))
    found = []
    for root, texts in groups.items():
        unique = sorted({normalize_text(t) for t in texts if t})
        if len(unique) >= 2:
            found.append(IntentDef(intent=f"{FAQ_INTENT_PREFIX}{root.rsplit('faq-', 1)[-1][:16]}", phrasings=unique))
    return found


async def load_intents(cache: object, policy: Policy, items: list[IntentDef], *, tenant: str, category: str,
                       name: str, seed: int = 0) -> IntentsLoaded:
    """Fit, calibrate, store and apply a team's intents (the module's steps).

    Raises:
        IntentsFileError: The category is unknown or not adaptive, or there is no semantic layer.
    """
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts)
    started = time.monotonic()
    if category not in policy.categories:
        raise IntentsFileError(f"unknown category {category!r}; known: {', '.join(sorted(policy.categories))}")
    semantic_policy = policy.categories[category].semantic
    if not isinstance(semantic_policy, AdaptiveSemantic):
        raise IntentsFileError(f"category {category!r} is not adaptive (it has no error_bound): intents serve adaptive ones")
    if not cache.each or cache.each[0].semantic is None or cache.shared is None:
        raise IntentsFileError("intents need the semantic layer and Redis (STRATA_SEMANTIC_ENABLED, STRATA_REDIS_URL)")
    tag = await cache.each[0].versions.refresh()
    own = {item.intent for item in items}
    every = items + [i for i in await curated_intents(cache, tag, tenant, category) if i.intent not in own]
    every += out_of_scope_stand_ins(every)
    embedder = cache.each[0].semantic.embedder
    english = reads_english(items)
    reader = heads_reader(cache, english=english)
    english_reader = cache.intents.english if cache.intents is not None else None
    reads = reader.fingerprint + (" (an English file)" if english_reader is not None and reader is english_reader else
                                  " (not an English file)" if english_reader is not None else "")
    texts = [normalize_text(t) for item in every for t in item.phrasings]
    labels = np.array([n for n, item in enumerate(every) for _ in item.phrasings])
    vectors = await embed_in_slices(embedder, texts)
    read = await reader.vectors(texts, vectors)  # what the head reads (the index's vectors by default)
    # A head on a second embedder also looks beyond the index's band (its neighbourhoods are not
    # the index's); on the index's own vectors the band is its neighbourhood (docs/QUALITY.md).
    beyond_band = reader.source is not None
    embedded = time.monotonic()
    delta = risk_level(semantic_policy.confidence, semantic_policy.intent_confidence)
    check = cache.each[0].semantic.check

    def refused(asker: int, cached: int) -> bool:
        return check.guard(texts[asker], texts[cached]) is not None

    within = negation_within(every, check.guards, english=english)

    def overrulable(asker: int, cached: int, intent: int) -> bool:
        return intent_may_overrule(check.guards(texts[asker], texts[cached]), negation_within=within[intent])

    calibration = await asyncio.to_thread(
        calibrate, read, labels, len(every), semantic_policy.intent_error_bound, semantic_policy.threshold,
        delta=delta, seed=seed, refused=refused, near=vectors, beyond_band=beyond_band,
        beyond_floor=semantic_policy.intent_beyond_floor, overrulable=overrulable,
        out_of_scope=np.array([i.out_of_scope for i in every]), servable=np.array([i.shared and not i.out_of_scope
                                                                                   for i in every]))
    softmax = await asyncio.to_thread(SoftmaxHead(n_classes=len(every), seed=seed).fit, read, labels)
    weights, bias = softmax.coef_, softmax.intercept_
    fitted = time.monotonic()
    probation = calibration.probation if semantic_policy.intent_probation else 1.01
    if calibration.threshold > 1:
        in_scope = [i for i in every if not i.out_of_scope]
        rule = why_it_serves_nothing(intents=len(in_scope), phrasings=sum(len(i.phrasings) for i in in_scope),
                                     bound=semantic_policy.intent_error_bound, delta=delta,
                                     share=semantic_policy.intent_bound_share, on_probation=probation <= 1)
    else:
        beyond = (f" (the nearest cached ones of that intent beyond the band too, from similarity "
                  f"{semantic_policy.intent_beyond_floor:.2f})") if beyond_band else ""
        rule = (f"both questions of one intent at confidence >= {calibration.threshold:.3f}{beyond}: "
                f"wrong share <= {semantic_policy.intent_error_bound:.2%} at {1 - delta:.0%} on held-out readings replayed "
                f"as a stream (the category's bound {semantic_policy.error_bound:.1%} on its traffic)")
    if probation <= 1:
        rule += "; " + probation_words(calibration, probation, semantic_policy, delta)
    rule += guard_words(calibration)
    if any(within):
        rule += (f". The team's own phrasings of {sum(within)} intent{'s' if sum(within) > 1 else ''} differ in "
                 f"negation: there the intent rule serves a pair the negation guard alone would set aside (the other "
                 f"rules never do)")
    meta = HeadMeta(name=name, tenant=tenant, category=category, intents=[i.intent for i in every],
                    shared=[i.shared and not i.out_of_scope for i in every], threshold=calibration.threshold,
                    fingerprint=reader.fingerprint, phrasings=len(texts),
                    accuracy=calibration.accuracy, served_share=calibration.served_share,
                    held_out_wrong=calibration.held_out_wrong, error_bound=semantic_policy.intent_error_bound, rule=rule,
                    loaded_at=int(time.time()),
                    confused=[(every[a].intent, every[b].intent, n) for a, b, n in calibration.confused],
                    beyond_band=beyond_band, phrasings_of=[len(i.phrasings) for i in every], delta=delta,
                    beyond_floor=semantic_policy.intent_beyond_floor if beyond_band else -1.0, probation=probation,
                    veto_below=calibration.veto_below, stand_in_reach=calibration.stand_in_reach,
                    domain_floor=calibration.domain_floor, negation_within=within)
    head = IntentHead(meta, weights, bias)
    await IntentStore(cache.shared).save(head)
    await forget_intent_record(cache, tag, tenant, category)
    await cache.shared.set(intents_file_key(category, tenant), msgspec.json.encode(items))
    answers = [FaqItem(category=category, question=item.phrasings[0], variants=item.phrasings[1:], answer=item.answer,
                       tenant=tenant, intent=item.intent) for item in items if item.answer is not None]
    if answers:
        await load_faq_in_buckets(cache, answers, f"intents-{name}", policy)
    labelled = await label_documents(cache, head, tag)
    return IntentsLoaded(meta=meta, labelled=labelled, answers=len(answers), seconds=time.monotonic() - started,
                         embedding_seconds=embedded - started, fitting_seconds=fitted - embedded,
                         stand_ins=sum(len(i.phrasings) for i in every if i.out_of_scope and i not in items),
                         reads=reads)


def negation_within(items: list[IntentDef], guards: Callable[[str, str], tuple[str, ...]], *,
                    english: bool) -> list[bool]:
    """Per intent: the team's own phrasings of it differ in negation (the negation guard sets a
    pair of them aside), so negation does not tell its questions apart (``HeadMeta.negation_within``);
    an intent the rule never serves (not shared, out of scope) is never so, nor any of an
    ``english`` file's (:func:`reads_english`, as its reader is chosen): there negation is a word
    of its own, and the guard also stops twins the head confuses (CLINC150: 3 more wrong hits in
    nine streams for 0.01-0.02 of reach without it); in Chinese it sits inside the predicates of
    problem reports ("流量不够用", "还没到账") and set aside a tenth of the telecom file's reach, none
    of it wrong (docs/INTENTS.md)."""
    if english:
        return [False] * len(items)
    found = []
    for item in items:
        texts = [normalize_text(t) for t in item.phrasings]
        found.append(item.shared and not item.out_of_scope
                     and any(NEGATION_DIFFERS in guards(texts[0], text) for text in texts[1:]))
    return found


def probation_words(calibration: Calibration, probation: float, policy: AdaptiveSemantic, delta: float) -> str:
    """What the rule promises on probation, and when, in plain words (the load's line, the console)."""
    below = "below that, " if calibration.threshold <= 1 else ""
    checks = clean_checks_to_certify(policy.error_bound, delta)
    # Where the walk stopped (app/cache/learning/intents.py): within the bound, or a file too small to tell.
    start = ("the lowest confidence its held-out phrasings were wrong no more often than the rule's bound at"
             if calibration.probation_wrong <= policy.intent_error_bound else
             "as low as a file this small was not shown over the rule's bound")
    return (f"{below}on probation from the first request, both questions of one intent at confidence >= "
            f"{probation:.3f}, {start} (a team's answer stands for its intent: only the asked question's confidence "
            f"counts, and where the team's phrasing names no number or date, one the asked question names is no "
            f"difference). "
            f"Before traffic, the file promises nothing there: held out, it served {calibration.probation_served:.0%} "
            f"of the team's phrasings, {calibration.probation_wrong:.2%} of them wrong. Over traffic, the record "
            f"promises: every probation hit of a model's answer is checked by the model after the response, and an "
            f"intent stops as soon as its checks show more than {policy.error_bound:.0%} wrong ({1 - delta:.0%} sure, "
            f"a test valid however often it is read), and the rule from a confidence down when the checks there "
            f"show it; after {checks} "
            f"clean checks the record certifies the bound and checks thin to {policy.intent_check_sample:.0%} of the "
            f"hits. A team's own answer is not checked by the model: a user's \"wrong\" (/v1/feedback) counts "
            f"against its intent{far_words(policy)}")


def guard_words(calibration: Calibration) -> str:
    """What the head guards beyond its own rule, in plain words (the load's line)."""
    said = ""
    if calibration.veto_below > 0:
        said += (f". For every rule, a cached question the head gives less than {calibration.veto_below:.2g} of a "
                 f"chance of sharing the asked one's intent is set aside (held out: {calibration.veto_same:.1%} of the "
                 f"file's nearest pairs of one intent, {calibration.veto_other:.1%} of those of two)")
        if calibration.domain_floor is not None:
            said += (f", where the head reads the asked question as strongly as 99% of the file's held-out phrasings "
                     f"(energy >= {calibration.domain_floor:.2f}; below, it is of none of the team's topics and the "
                     f"head's word sets nothing aside)")
    reached = [r for r in calibration.stand_in_reach if r > 0]
    if reached:
        said += (f". Out-of-scope questions, held out, were read as {len(reached)} of the intents, up to "
                 f"{max(reached):.3f}: a model's answer cached under a reading no surer than that serves its intent "
                 f"only once a check agreed (its first match is answered by the model, which checks it)")
    return said


class Refit(msgspec.Struct, frozen=True, kw_only=True):
    """What ``strata intents refit`` folded in, and the load it made."""

    approvals: int
    loaded: IntentsLoaded


async def refit_intents(cache: object, policy: Policy, *, tenant: str, category: str, seed: int = 0) -> Refit:
    """Fit and calibrate again, the team's phrasings plus what its reviewers approved since: each
    approved pair of the review queue (audited) makes the asked question a phrasing of the intent
    whose phrasings hold the cached question (or the current head's confident reading of it). A
    rejection names no intent, and a user's "wrong" already counts against the rule: neither adds
    a phrasing. Trust moves only with the new calibration.

    Raises:
        IntentsFileError: Nothing was loaded for this tenant and category.
    """
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts) and cache.shared is not None
    stored = await cache.shared.get(intents_file_key(category, tenant))
    head = await IntentStore(cache.shared).get(category, tenant)
    if stored is None or head is None:
        raise IntentsFileError(f"no intents loaded for tenant {tenant!r} in {category!r}: load a file first")
    items = msgspec.json.decode(stored, type=list[IntentDef])
    owner = {normalize_text(t): item.intent for item in items for t in item.phrasings}
    pairs: list[tuple[str, str]] = []
    for event in await cache.invalidator.audit(10_000):
        if event.get("kind") != "review" or not event.get("target", "").startswith("approve"):
            continue
        try:
            fields = msgspec.json.decode(event.get("request", "{}"))
        except msgspec.DecodeError:
            continue
        if isinstance(fields, dict) and fields.get("tenant") == tenant and fields.get("category") == category:
            pairs.append((normalize_text(str(fields.get("asked", ""))), normalize_text(str(fields.get("cached", "")))))
    unknown = sorted({cached for _, cached in pairs if cached not in owner})
    if unknown and cache.each and cache.each[0].semantic is not None:
        index_vectors = await embed_in_slices(cache.each[0].semantic.embedder, unknown)
        readings = head.predict(await heads_reader(cache, head=head).vectors(unknown, index_vectors))
        for text, index, sure in zip(unknown, *readings, strict=True):
            if sure >= head.meta.threshold:
                owner[text] = head.meta.intents[int(index)]
    added: dict[str, list[str]] = {}
    for asked, cached in pairs:
        intent = owner.get(cached)
        if intent is not None and asked and asked not in owner:
            owner[asked] = intent
            added.setdefault(intent, []).append(asked)
    grown = [msgspec.structs.replace(item, phrasings=item.phrasings + added.get(item.intent, [])) for item in items]
    loaded = await load_intents(cache, policy, grown, tenant=tenant, category=category, name=head.meta.name, seed=seed)
    return Refit(approvals=sum(len(v) for v in added.values()), loaded=loaded)


async def forget_intent_record(cache: object, tag: str, tenant: str, category: str) -> int:
    """Start the rule's measured record again for a new calibration: the explored and marked
    intent hits (``intent_ok:<bin>``, ``intent_wrong:<bin>``, ``intent_*_of:<intent>`` of the tenant's pool) judged the
    previous head, and kept, they would hold a suspension the new load lifts. The pairs users
    marked wrong stay vetoed on their entries. Returns the fields removed."""
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts)
    removed = 0
    for bucket in cache.each:
        redis, key = bucket.bucket.redis, bucket.bucket.keys.observations_key(tag, category, tenant)
        fields = [f for f in map(as_text, await redis.hkeys(key))
                  if f and f.startswith((f"{OBS_INTENT_OK}:", f"{OBS_INTENT_WRONG}:", f"{OBS_INTENT_OK_OF}:",
                                          f"{OBS_INTENT_WRONG_OF}:", f"{OBS_INTENT_TRIAL_OK}:",
                                          f"{OBS_INTENT_TRIAL_WRONG}:", f"{OBS_INTENT_PROBATION_OK_OF}:",
                                          f"{OBS_INTENT_PROBATION_WRONG_OF}:", f"{OBS_INTENT_PROBATION_OK}:",
                                          f"{OBS_INTENT_PROBATION_WRONG}:"))]
        if fields:
            removed += int(await redis.hdel(key, *fields))
    return removed


def heads_reader(cache: object, *, english: bool = False, head: IntentHead | None = None) -> HeadReader:
    """What a head reads in this deployment: ``head``'s own; else, for a new head, the English
    reader for an ``english`` file where there is one (issue #58), else the deployment's (the
    index's vectors, or the intent embedder's)."""
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts)
    if cache.intents is not None:
        if head is not None:
            return cache.intents.reader_for(head)
        return cache.intents.english if english and cache.intents.english is not None else cache.intents.reader
    embedder = cache.each[0].semantic.embedder if cache.each and cache.each[0].semantic is not None else None
    if embedder is None:
        raise IntentsFileError("intents need the semantic layer (STRATA_SEMANTIC_ENABLED)")
    return HeadReader(None, f"{embedder.name}:{embedder.dims}")


async def label_documents(cache: object, head: IntentHead, tag: str, page: int = 1_000) -> int:
    """Give every cached model answer of the head's tenant and category the intent the head reads
    in its question (the curated FAQ's documents: their entry's intent, at full confidence)."""
    from app.assembly import CacheParts

    assert isinstance(cache, CacheParts)
    meta, labelled = head.meta, 0
    reader = heads_reader(cache, head=head)
    faq_intents = {n[len(FAQ_INTENT_PREFIX):] for n in meta.intents if n.startswith(FAQ_INTENT_PREFIX)}
    for bucket in cache.each:
        if bucket.semantic is None:
            continue
        index = await bucket.semantic.index(tag)
        offset = 0
        while True:
            query = FilterQuery((Tag(FIELD_TENANT) == meta.tenant) & (Tag(FIELD_CATEGORY) == meta.category),
                                return_fields=[FIELD_SOURCE, FIELD_ROOT, FIELD_INTENT, FIELD_QUESTION], num_results=page)
            query.paging(offset, page)
            rows = await index.query(query)
            redis = bucket.bucket.redis
            candidates = [r for r in rows if r.get(FIELD_SOURCE) != SOURCE_FAQ]
            # The vectors are read as bytes with HGET (a search result would hand them over as text).
            async with redis.pipeline(transaction=False) as reads:
                for row in candidates:
                    reads.hget(row["id"], FIELD_EMBEDDING)
                raw = await reads.execute() if candidates else []
            model_rows = [(row, blob) for row, blob in zip(candidates, raw, strict=True) if blob]
            async with redis.pipeline(transaction=False) as pipe:
                if model_rows:
                    vectors = np.stack([np.frombuffer(blob, dtype=np.float32) for _, blob in model_rows])
                    questions = [str(as_text(row.get(FIELD_QUESTION)) or "") for row, _ in model_rows]
                    probabilities = head.probabilities(await reader.vectors(questions, vectors))
                    predicted, confidence = probabilities.argmax(axis=1), probabilities.max(axis=1)
                    likely = likely_rows(probabilities, meta.intents)
                    for (row, _), i, sure, chances in zip(model_rows, predicted, confidence, likely, strict=True):
                        intent = meta.intents[int(i)]
                        pipe.hset(row["id"], mapping={FIELD_INTENT: intent, FIELD_INTENT_CONFIDENCE: round(float(sure), 4),
                                                      FIELD_INTENT_LIKELY: likely_json(chances)})
                        if as_text(row.get(FIELD_INTENT)) != intent:
                            pipe.hdel(row["id"], FIELD_INTENT_CHECKED)  # checked against another intent
                for row in rows:
                    root = str(as_text(row.get(FIELD_ROOT)) or row["id"])
                    short = root.rsplit("faq-", 1)[-1][:16]
                    if row.get(FIELD_SOURCE) == SOURCE_FAQ and short in faq_intents:
                        pipe.hset(row["id"], mapping={FIELD_INTENT: FAQ_INTENT_PREFIX + short, FIELD_INTENT_CONFIDENCE: 1.0,
                                                      FIELD_INTENT_LIKELY: likely_json({FAQ_INTENT_PREFIX + short: 1.0})})
                await pipe.execute()
            labelled += len(model_rows)
            if len(rows) < page:
                break
            offset += page
    return labelled
