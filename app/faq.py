"""Curated answers: ``strata faq load FILE`` seeds the semantic layer with an operator's answers.

A file lists entries (category, tenant, question, variants, answer), as CSV (variants separated
by ``|``) or YAML (a list of mappings). Each question becomes a semantic entry whose answer is the
operator's text in OpenAI's completion shape (the model name filled in from each request), in the
tenant's curated-answer scope: it serves that tenant's category whatever the model, system prompt
or parameters. Each variant becomes an alias of its entry and a positive observation. A file is
loaded under a name (its stem by default); loading it again replaces its entries in one
MULTI/EXEC, so a reader sees the old set or the new one, never a mix. A bad file changes nothing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import yaml
from redis.asyncio import Redis
from redisvl.query import VectorRangeQuery
from redisvl.query.filter import Tag

from app.cache.decision.candidates import same_wording
from app.cache.storage.entry import CacheEntry
from app.cache.storage.exact import wording_keys_of
from app.cache.storage.keys import (
    CURATED_MARK,
    FIELD_ALIASES,
    FIELD_CATEGORY,
    FIELD_EMBEDDING,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SOURCE,
    FIELD_TENANT,
    KEYS,
    SOURCE_FAQ,
    Keyspace,
    as_text,
    faq_scope_digest,
    normalize_text,
)
from app.calibrate.pairs import read_utf8
from app.embed import Embedder, embed_in_slices
from app.policy import Policy, UnknownCategory
from app.wire import json_encoder

if TYPE_CHECKING:  # the assembly is above this module; only its type is needed here
    from app.assembly import CacheParts
    from app.cache.semantic import SemanticCache

# How far (cosine distance) a model answer's question may lie from a curated wording and still be
# looked at; only those of the same wording (up to case, spaces and punctuation) are removed.
_SAME_WORDING_RADIUS = 0.1
_COPIES_PER_WORDING = 1000

class FaqFileError(ValueError):
    """A curated-answer file that cannot be loaded; the message is one line for the user."""


class FaqItem(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    category: str
    question: str
    answer: str
    tenant: str = "default"
    variants: list[str] = msgspec.field(default_factory=list)
    # The intent a team's intents file gave this answer (`strata intents load`): its documents are
    # labelled with it, so a confident question of that intent is served it on its first ask.
    intent: str | None = None


def read_faq(path: Path, policy: Policy) -> list[FaqItem]:
    """Read and check a curated-answer file.

    Raises:
        FaqFileError: Unreadable, malformed, an unknown category, an empty text, or a question
            given twice for one tenant and category.
    """
    text = read_utf8(path, FaqFileError)
    try:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(io.StringIO(text))
            missing = {"category", "question", "answer"} - set(reader.fieldnames or [])
            if missing:
                raise FaqFileError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            raw = [{"category": (row.get("category") or "").strip(), "question": row.get("question") or "",
                    "answer": row.get("answer") or "", "tenant": (row.get("tenant") or "default").strip(),
                    "variants": [v for v in (row.get("variants") or "").split("|") if v.strip()]}
                   for row in reader]
        else:
            raw = yaml.safe_load(text)
        items = msgspec.convert(raw, list[FaqItem])
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise FaqFileError(f"{path}: {exc}") from exc
    seen: set[tuple[str, str, str]] = set()
    for number, item in enumerate(items, start=1):
        where = f"{path}: entry {number}"
        try:
            category = policy.category(item.category)
        except UnknownCategory as exc:
            raise FaqFileError(f"{where}: {exc}") from exc
        if not category.semantic.enabled:
            raise FaqFileError(f"{where}: category {item.category!r} has no semantic layer")
        if not normalize_text(item.question) or not item.answer.strip() or not item.tenant:
            raise FaqFileError(f"{where}: question, answer and tenant must not be empty")
        if any(not normalize_text(v) for v in item.variants):
            raise FaqFileError(f"{where}: an empty variant")
        identity = (item.tenant, item.category, normalize_text(item.question))
        if identity in seen:
            raise FaqFileError(f"{where}: the question is given twice for tenant {item.tenant!r}")
        seen.add(identity)
    if not items:
        raise FaqFileError(f"{path}: no entries")
    return items


def curated_completion(answer: str, created: int) -> bytes:
    """An operator's answer as a stored completion (the model name is the request's, at serve time)."""
    return json_encoder.encode({
        "id": "chatcmpl-faq", "object": "chat.completion", "created": created, "model": "",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.strip()}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


async def load_faq(redis: Redis, embedder: Embedder, tag: str, items: list[FaqItem], name: str,
                   policy: Policy, keys: Keyspace = KEYS) -> tuple[int, int]:
    """Write the entries and variants of one file under ``name``, replacing what it wrote before.

    The semantic index of ``tag`` must exist. On a cluster, called once per bucket with the
    bucket's items (none: what the file wrote there before is removed). Returns (entries,
    variants) written.
    """
    now = int(time.time())
    texts = [normalize_text(t) for item in items for t in (item.question, *item.variants)]
    vectors = await embed_in_slices(embedder, texts)
    set_key = keys.faq_set_key(tag, name)
    old_keys = await redis.smembers(set_key)
    # The wordings the file owned before and no longer does serve the model's answers again.
    owned = {keys.wording_key(tag, item.tenant, item.category, text)
             for item in items for text in (item.question, *item.variants)}
    released = await wording_keys_of(redis, keys, tag, [str(as_text(k)) for k in old_keys]) - owned
    new_keys: list[str] = []
    position = 0
    async with redis.pipeline(transaction=True) as pipe:
        if old_keys:
            pipe.delete(*old_keys)
        pipe.delete(set_key)
        for wording in released:
            pipe.srem(wording, CURATED_MARK)
        longest = 1
        for item in items:
            category = policy.categories[item.category]
            longest = max(longest, category.ttl_seconds)
            question = normalize_text(item.question)
            key = keys.faq_key(tag, _digest(name, item.tenant, item.category, question))
            question_vector = vectors[position]
            position += 1
            # The entry; each variant is a copy with its own question and vector.
            entry = CacheEntry(question=question, embedding=_bytes(question_vector),
                               answer=curated_completion(item.answer, now), model="", tenant=item.tenant,
                               category=item.category, created_at=now, expires_at=now + category.ttl_seconds,
                               scope=faq_scope_digest(item.tenant, item.category), root=key, source=SOURCE_FAQ,
                               intent=item.intent, intent_confidence=1.0 if item.intent is not None else None)
            documents = [(key, entry)]
            for variant in item.variants:
                text = normalize_text(variant)
                vector = vectors[position]
                position += 1
                documents.append((keys.faq_key(tag, _digest(name, item.tenant, item.category, question, text)),
                                  msgspec.structs.replace(entry, question=text, embedding=_bytes(vector))))
            for doc_key, document in documents:
                pipe.hset(doc_key, mapping=document.to_hash())
                pipe.expire(doc_key, document.ttl_seconds)
                new_keys.append(doc_key)
                # From now on no model answer to this wording is stored in the exact layer.
                wording = keys.wording_key(tag, item.tenant, item.category, document.question)
                pipe.sadd(wording, CURATED_MARK)
                pipe.expire(wording, document.ttl_seconds)
            pipe.hset(key, FIELD_ALIASES, len(item.variants))
        if new_keys:
            pipe.sadd(set_key, *new_keys)
            pipe.expire(set_key, longest)
        await pipe.execute()
    return len(items), len(new_keys) - len(items)


class FaqLoaded(msgspec.Struct, frozen=True, kw_only=True):
    """What loading curated answers did.

    Attributes:
        tags: The version tags written to.
        entries: Curated answers written.
        variants: Their variants written.
        replaced: Model answers removed because a curated one now answers their question: entries
            (with their exact copies and their aliases) whose question is one of the curated wordings.
        keys_removed: Redis keys those removals deleted (exact and semantic).
    """

    tags: str
    entries: int
    variants: int
    replaced: int = 0
    keys_removed: int = 0


async def remove_model_copies(semantic: SemanticCache, tag: str, items: list[FaqItem]) -> tuple[int, int]:
    """Delete the model's answers to the curated questions and variants in their tenant and
    category, in both layers, so that the next request gets the curated answer whatever was
    cached before, and whatever that request carries.

    Every exact entry of a wording is in its wording set, whatever its system prompt, parameters,
    user or protocol (answers cut by ``max_tokens`` live there alone). A model answer's semantic
    document and its exact entry share one digest, so each document found (by a range query
    around the wording, then the same wording) names its exact copy; its aliases go with it: they
    were learnt to mean the same question. Returns (answers, keys) removed: an answer stored in
    both layers counts once.
    """
    redis, keys = semantic.keys_redis, semantic.keys
    index = await semantic.index(tag)
    wordings = [(item, text) for item in items for text in (item.question, *item.variants)]
    if not wordings:
        return 0, 0
    exact_prefix = keys.exact_prefix(tag)
    copies: set[str] = set()
    for item, text in wordings:
        members = await redis.smembers(keys.wording_key(tag, item.tenant, item.category, text))
        copies.update(str(as_text(m)) for m in members if str(as_text(m)).startswith(exact_prefix))
    vectors = await embed_in_slices(semantic.embedder, [normalize_text(text) for _, text in wordings])
    roots: set[str] = set()
    for (item, text), vector in zip(wordings, vectors, strict=True):
        query = VectorRangeQuery(
            vector=np.asarray(vector, dtype=np.float32).tobytes(), vector_field_name=FIELD_EMBEDDING,
            distance_threshold=_SAME_WORDING_RADIUS, num_results=_COPIES_PER_WORDING,
            return_fields=[FIELD_QUESTION, FIELD_ROOT, FIELD_SOURCE],
            filter_expression=(Tag(FIELD_TENANT) == item.tenant) & (Tag(FIELD_CATEGORY) == item.category))
        for row in await index.query(query):
            if row.get(FIELD_SOURCE) == SOURCE_FAQ or not same_wording(text, row.get(FIELD_QUESTION, "")):
                continue
            roots.add(str(row.get(FIELD_ROOT) or row["id"]))
    doomed: set[str] = set(copies)
    prefix = keys.semantic_prefix(tag)
    for root in roots:
        for document in await semantic.documents_of(tag, root) | {root}:
            doomed.add(document)
            if document.startswith(prefix):
                doomed.add(exact_prefix + document[len(prefix):])
    if not doomed:
        return 0, 0
    ordered = sorted(doomed)
    async with redis.pipeline(transaction=False) as pipe:
        for key in ordered:
            pipe.exists(key)
        present = [key for key, there in zip(ordered, await pipe.execute(), strict=True) if there]
    # One answer per digest: its exact entry and its semantic entry are one answer.
    answers = {key[len(exact_prefix):] for key in present if key.startswith(exact_prefix)}
    answers |= {root[len(prefix):] for root in roots if root in present}
    removed = int(await redis.unlink(*present)) if present else 0
    return len(answers), removed


async def load_faq_in_buckets(cache: CacheParts, items: list[FaqItem], name: str, policy: Policy) -> FaqLoaded:
    """:func:`load_faq` into every bucket (the one Redis, or each bucket of a cluster), each item
    into the bucket of its tenant and category, where that tenant's lookups search; then the
    model's answers to the same wordings there are removed (:func:`remove_model_copies`).

    Args:
        cache: The cache (with its semantic layer).
        items: The file's items.
        name: The file's name.
        policy: The categories.

    Returns:
        What was written and removed.
    """
    tags, entries, variants, replaced, removed = set(), 0, 0, 0, 0
    for i, bucket in enumerate(cache.each):
        assert bucket.semantic is not None, "curated answers need the semantic layer"
        tag = await bucket.versions.refresh()
        await bucket.semantic.index(tag)
        mine = [item for item in items if cache.buckets.of(item.tenant, item.category) == i]
        written = await load_faq(bucket.bucket.redis, bucket.semantic.embedder, tag, mine, name, policy, bucket.bucket.keys)
        copies = await remove_model_copies(bucket.semantic, tag, mine)
        tags.add(tag)
        entries, variants = entries + written[0], variants + written[1]
        replaced, removed = replaced + copies[0], removed + copies[1]
    return FaqLoaded(tags=", ".join(sorted(tags)), entries=entries, variants=variants, replaced=replaced,
                     keys_removed=removed)


def _bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()
