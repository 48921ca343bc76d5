"""Replay streams: one request per line, ``{"text": ..., "label": ...}``; one label, one answer.

Built deterministically (seeded) from the shared data: CLINC150 intents (Zipf over intents, a
fresh utterance of the intent each time while any is left; out-of-scope queries are each their
own label) and AFQMC positives chained into clusters of questions with one answer.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.cache.storage.keys import normalize_text
from app.calibrate.pairs import Clusters, read_utf8


class StreamFileError(ValueError):
    """A stream file that cannot be used; the message is one line for the user."""


# How the simulated model words an answer: the same facts, said differently each time.
WORDINGS = (
    "For {topic}, follow guide {number} in section {section}.",
    "Follow guide {number} in section {section} for {topic}.",
    "Regarding {topic}: see guide {number}, section {section}.",
    "{Topic} is covered by guide {number} in section {section}.",
)


# An operator's curated answer to a label: the same facts as the model's, in the FAQ's words.
_CURATED = "{Topic}: please see guide {number}, section {section} (from our FAQ)."


def label_number(label: str) -> int:
    """The guide number of a label's answer: stable across streams and FAQ files."""
    return 1000 + int(hashlib.sha256(label.encode("utf-8")).hexdigest()[:12], 16) % 9_000_000


def worded(label: str, wording: str) -> str:
    number = label_number(label)
    topic = label.split(":", 1)[-1].replace("_", " ")[:60]
    return wording.format(topic=topic, Topic=topic[:1].upper() + topic[1:], number=number, section=chr(65 + number % 26))


def curated_answer(label: str) -> str:
    """The answer a FAQ file built for replays gives a label (``strata replay faq``)."""
    return worded(label, _CURATED)


@dataclass(frozen=True)
class Request:
    text: str
    label: str


def zipf_stream(groups: dict[str, list[str]], requests: int, seed: int, exponent: float = 1.0) -> list[Request]:
    """Requests drawn by group with Zipf weights over a seeded order of groups; each draw takes
    the group's next unused text while any is left, then a random one of them again."""
    rng = random.Random(seed)
    names = sorted(groups)
    rng.shuffle(names)
    pools = {name: rng.sample(groups[name], len(groups[name])) for name in names}
    weights = [1.0 / (rank + 1) ** exponent for rank in range(len(names))]
    used: dict[str, int] = defaultdict(int)
    out = []
    for _ in range(requests):
        name = rng.choices(names, weights)[0]
        pool, position = pools[name], used[name]
        used[name] += 1
        out.append(Request(text=pool[position] if position < len(pool) else rng.choice(pool), label=name))
    return out


# CLINC150's "banking" and "credit cards" domains (Larson et al. 2019, table 1): one bank's
# customer service, where intents sit close together (credit_limit / credit_limit_change).
CLINC_DOMAINS: dict[str, tuple[str, ...]] = {
    "bank": (
        "account_blocked", "balance", "bill_balance", "bill_due", "freeze_account", "interest_rate",
        "min_payment", "order_checks", "pay_bill", "pin_change", "report_fraud", "routing",
        "spending_history", "transactions", "transfer",
        "application_status", "apr", "card_declined", "credit_limit", "credit_limit_change", "credit_score",
        "damaged_card", "expiration_date", "improve_credit_score", "international_fees", "new_card",
        "redeem_rewards", "replacement_card_duration", "report_lost_card", "rewards_balance",
    ),
}


def clinc_stream(path: Path, requests: int = 3000, seed: int = 0, oos_share: float = 0.0,
                 domain_intents: int = 0, phrasings: int = 0, domain: str = "",
                 splits: tuple[str, ...] = ()) -> list[Request]:
    """A CLINC150 stream: in-scope intents by Zipf; with ``oos_share`` that share of requests is
    out of scope, each its own label. ``domain_intents`` > 0 keeps only that many intents (a
    narrower bot); ``domain`` keeps the intents of one of :data:`CLINC_DOMAINS`; ``phrasings`` > 0
    keeps that many utterances per intent (seeded), so that customers repeat each other word for
    word, as they do; ``splits`` (``("test",)``) draws from those splits only, out-of-scope queries
    from ``oos_<split>`` (a team's ``train`` split then never reaches the stream)."""
    groups: dict[str, list[str]] = defaultdict(list)
    out_of_scope = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if splits and row["split"] not in splits and row["split"] not in {f"oos_{s}" for s in splits}:
                continue
            text = normalize_text(row["text"])
            if row["intent"] == "oos":
                out_of_scope.append(text)
            else:
                groups[row["intent"]].append(text)
    if domain:
        groups = defaultdict(list, {name: groups[name] for name in CLINC_DOMAINS[domain]})
    if domain_intents:
        keep = sorted(groups)[:domain_intents]
        groups = defaultdict(list, {name: groups[name] for name in keep})
    if phrasings:
        pick = random.Random(seed + 2)
        groups = defaultdict(list, {name: pick.sample(sorted(texts), min(phrasings, len(texts)))
                                    for name, texts in groups.items()})
    stream = zipf_stream(groups, requests, seed)
    if oos_share > 0:
        rng = random.Random(seed + 1)
        pool = rng.sample(sorted(set(out_of_scope)), len(set(out_of_scope)))
        for i in range(len(stream)):
            if pool and rng.random() < oos_share:
                text = pool.pop()
                stream[i] = Request(text=text, label=f"oos:{text}")
    return stream


def read_faqset(path: Path) -> list[dict[str, Any]]:
    """A FAQ set (bench/data/zh_shop_bank_faq.yaml): per label its standard question, answer and
    the variants customers ask.

    Raises:
        StreamFileError: Unreadable, or an item without label, question or variants.
    """
    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise StreamFileError(f"{path}: {exc}") from exc
    if not isinstance(items, list) or not all(isinstance(i, dict) and i.get("label") and i.get("question")
                                              and isinstance(i.get("variants"), list) for i in items):
        raise StreamFileError(f"{path}: a list of {{label, question, answer, variants}} items")
    return items


def faqset_stream(path: Path, requests: int = 1500, seed: int = 0, held: int = 0) -> list[Request]:
    """A stream from a FAQ set: labels by Zipf, each draw the label's next unused wording (the
    standard question or a variant), then a random one again. ``held`` > 0 leaves out the
    standard question and the first ``held - 1`` variants, which a curated-answer file holds
    (:func:`faqset_faq`), so the stream asks only what an operator did not write down."""
    groups = {}
    for item in read_faqset(path):
        wordings = [normalize_text(t) for t in (item["question"], *item["variants"])]
        groups[str(item["label"])] = wordings[held:] or wordings
    return zipf_stream(groups, requests, seed)


def faqset_faq(path: Path, per_label: int, category: str = "faq") -> list[dict[str, object]]:
    """A curated-answer file of a FAQ set for replays: per label its standard question and its
    first ``per_label - 1`` variants, answered with :func:`curated_answer`."""
    items: list[dict[str, object]] = []
    for item in read_faqset(path):
        wordings = [normalize_text(t) for t in (item["question"], *item["variants"])][:max(1, per_label)]
        items.append({"category": category, "question": wordings[0], "variants": wordings[1:],
                      "answer": curated_answer(str(item["label"]))})
    return items


def team_intents(source: str, path: Path, per_intent: int = 0, seed: int = 0, domain: str = "",
                 first_intents: int = 0, out_of_scope: bool = False) -> list[tuple[str, str]]:
    """A team's labelled phrasings for ``strata intents load`` (issue #46), as (text, intent) rows:
    CLINC150's *train* split (every utterance, or ``per_intent`` of each, seeded; one domain's
    intents with ``domain``; the first ``first_intents`` by name, as ``clinc_stream``'s
    ``domain_intents`` keeps them), or a FAQ set's first ``per_intent`` wordings per label (what
    ``replay build --held`` keeps out of its stream). ``out_of_scope``: CLINC150's ``oos_train``
    questions too, labelled ``out_of_scope`` (as Rasa names them; never served, the calibration's
    out-of-scope questions)."""
    rows: list[tuple[str, str]] = []
    if source == "faqset":
        for item in read_faqset(path):
            wordings = [normalize_text(t) for t in (item["question"], *item["variants"])][:max(2, per_intent)]
            rows.extend((text, str(item["label"])) for text in wordings)
        return rows
    groups: dict[str, list[str]] = defaultdict(list)
    unknown: list[str] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["intent"] != "oos" and row["split"] == "train":
                groups[row["intent"]].append(normalize_text(row["text"]))
            elif row["intent"] == "oos" and row["split"] == "oos_train":
                unknown.append(normalize_text(row["text"]))
    if domain:
        groups = defaultdict(list, {name: groups[name] for name in CLINC_DOMAINS[domain]})
    if first_intents:
        groups = defaultdict(list, {name: groups[name] for name in sorted(groups)[:first_intents]})
    rng = random.Random(seed)
    for intent in sorted(groups):
        texts = sorted(set(groups[intent]))
        if per_intent:
            texts = rng.sample(texts, min(per_intent, len(texts)))
        rows.extend((text, intent) for text in texts)
    if out_of_scope:
        rows.extend((text, "out_of_scope") for text in sorted(set(unknown)))
    return rows


# CLINC150 intents whose answer depends on what the question names (a restaurant, a food, a word,
# a place, a date, an amount, a new name, a setting's value), read by a person for the replay's
# 40 intents (the first by name, bench/replay_vllm.py): a team would mark them `shared: false`.
CLINC_NAMED_INTENTS = frozenset({
    "accept_reservations", "alarm", "bill_balance", "bill_due", "book_flight", "book_hotel", "calculator",
    "calendar", "calendar_update", "calories", "cancel_reservation", "car_rental", "carry_on", "change_ai_name",
    "change_language", "change_speed", "change_user_name", "change_volume", "confirm_reservation", "cook_time",
    "date", "definition", "directions", "distance", "exchange_rate",
})


def intents_with_answers(rows: list[tuple[str, str]]) -> list[dict[str, object]]:
    """A team's YAML intents file (``strata intents load``) from (text, intent) rows: each intent's
    phrasings and :func:`curated_answer`'s wording of its answer, the answer the curated FAQ of
    ``strata replay faq`` gives the same label; the intents of :data:`CLINC_NAMED_INTENTS` are
    marked not shared and have no answer (no one answer serves them: the head never serves them,
    they still teach it what the others are not)."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for text, intent in rows:
        grouped[intent].append(text)
    return [{"intent": intent, "phrasings": texts, "shared": False} if intent in CLINC_NAMED_INTENTS
            else {"intent": intent, "phrasings": texts, "answer": curated_answer(intent)} for intent, texts in grouped.items()]


def clinc_faq(path: Path, per_intent: int, seed: int = 0, category: str = "faq") -> list[dict[str, object]]:
    """A curated-answer file for replays: per CLINC150 intent, ``per_intent`` of its *train*
    utterances (seeded), the first as the question and the rest as variants, answered with
    :func:`curated_answer` (the operator's wording of the label's answer)."""
    groups: dict[str, list[str]] = defaultdict(list)
    unknown: list[str] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["intent"] != "oos" and row["split"] == "train":
                groups[row["intent"]].append(normalize_text(row["text"]))
            elif row["intent"] == "oos" and row["split"] == "oos_train":
                unknown.append(normalize_text(row["text"]))
    rng = random.Random(seed)
    items: list[dict[str, object]] = []
    for intent in sorted(groups):
        texts = rng.sample(sorted(set(groups[intent])), min(per_intent, len(set(groups[intent]))))
        items.append({"category": category, "question": texts[0], "variants": texts[1:], "answer": curated_answer(intent)})
    return items


def pairs_stream(path: Path, requests: int = 3000, seed: int = 0, min_cluster: int = 3) -> list[Request]:
    """A stream from positive paraphrase pairs (AFQMC ``label`` 1) chained into clusters: every
    question linked by a positive pair shares its cluster's answer."""
    clusters = Clusters()
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["label"].strip() == "1":
                clusters.link(normalize_text(row["sentence1"]), normalize_text(row["sentence2"]))
    groups: dict[str, list[str]] = defaultdict(list)
    for text in clusters.texts():
        groups[clusters.find(text)].append(text)
    kept = {f"cluster-{i}": sorted(texts) for i, (_, texts) in enumerate(sorted(groups.items())) if len(texts) >= min_cluster}
    return zipf_stream(kept, requests, seed)


def write_stream(stream: list[Request], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": r.text, "label": r.label}, ensure_ascii=False) + "\n" for r in stream),
                    encoding="utf-8")


def read_stream(path: Path) -> list[Request]:
    """Read a JSONL (``{"text", "label"}`` per line) or CSV (``text,label`` header) stream.

    Raises:
        StreamFileError: Unreadable, malformed, a missing field, or no requests.
    """
    raw = read_utf8(path, StreamFileError)
    stream = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(raw))
        if not {"text", "label"} <= set(reader.fieldnames or []):
            raise StreamFileError(f"{path}: the header must have text and label")
        rows = [(line, row) for line, row in enumerate(reader, start=2)]
    else:
        rows = []
        for line, text in enumerate(raw.splitlines(), start=1):
            if not text.strip():
                continue
            try:
                rows.append((line, json.loads(text)))
            except json.JSONDecodeError as exc:
                raise StreamFileError(f"{path}:{line}: not JSON: {exc.msg}") from exc
    for line, row in rows:
        if not isinstance(row, dict) or not str(row.get("text") or "").strip() or not str(row.get("label") or "").strip():
            raise StreamFileError(f"{path}:{line}: needs a non-empty text and label")
        stream.append(Request(text=str(row["text"]).strip(), label=str(row["label"]).strip()))
    if not stream:
        raise StreamFileError(f"{path}: no requests")
    return stream
