"""Curated answers as one service of the cache: list, add, edit and remove them with their
variants, and load a team's file. The console, the admin API and ``strata faq load`` all call it;
nothing else writes a curated key.

A curated answer is the team's word. Saving one removes every stored model answer to its
question and variants in that tenant and category, in both layers, whatever the requests carried
(system prompt, parameters, user, protocol), and marks those wordings as curated so that no model
answer to them is stored while it stands (app/faq.py, ``Keyspace.wording_key``). Entries added
one at a time are files of one entry (``added-<digest>``), so an edit or a removal replaces a
file whole, in one MULTI/EXEC per bucket, as a reload of a team's file does.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import msgspec

from app.cache.decision.candidates import same_wording
from app.cache.learning.learner import answer_text
from app.cache.storage.keys import (
    FIELD_ANSWER,
    FIELD_CATEGORY,
    FIELD_INTENT,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_TENANT,
    as_text,
    normalize_text,
)
from app.faq import FaqItem, FaqLoaded, load_faq_in_buckets
from app.policy import Policy

if TYPE_CHECKING:
    from app.assembly import CacheParts

# The file name of an answer added on its own (the console, the admin API).
ADDED_PREFIX = "added-"


class CuratedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One curated answer as stored.

    Attributes:
        key: Its semantic document (``strata:vN:sem:faq-<sha256>``): what edits and removals name.
        file: The file it was loaded under (``added-...`` for one added on its own).
        tenant: Whose.
        category: Its category.
        question: Its question.
        variants: Its other wordings.
        answer: The answer's text.
        intent: The team's intent label, when an intents file gave it.
    """

    key: str
    file: str
    tenant: str
    category: str
    question: str
    variants: tuple[str, ...] = ()
    answer: str
    intent: str | None = None

    def as_item(self, **changes: object) -> FaqItem:
        item = FaqItem(category=self.category, question=self.question, answer=self.answer, tenant=self.tenant,
                       variants=list(self.variants), intent=self.intent)
        return msgspec.structs.replace(item, **changes) if changes else item


class CuratedSaved(msgspec.Struct, frozen=True, kw_only=True):
    """What a save did: the entry as it now stands, and the model's answers it removed
    (``replaced``: answers, one per stored answer whichever layers held it; ``keys_removed``: keys)."""

    entry: CuratedEntry
    replaced: int
    keys_removed: int


class CuratedError(Exception):
    """A curated-answer change that cannot be made; the message is one line for the operator."""


class NotCuratable(CuratedError):
    """An empty question or answer, or a category without a semantic layer."""


class AlreadyCurated(CuratedError):
    """The question (or a variant) is curated already in that tenant and category."""

    def __init__(self, message: str, existing: CuratedEntry) -> None:
        super().__init__(message)
        self.existing = existing


class NoSuchCurated(CuratedError):
    """No curated answer of that key in the operator's tenant."""


def _wordings(question: str, variants: list[str] | tuple[str, ...]) -> tuple[str, list[str]]:
    """The question and its distinct variants, normalised; a variant that is the question goes."""
    asked = normalize_text(question)
    kept = list(dict.fromkeys(v for v in (normalize_text(text) for text in variants) if v and not same_wording(v, asked)))
    return asked, kept


class CuratedAnswers:
    """The curated answers of a cache (every bucket), under its current version tag.

    Args:
        cache: The cache, with its semantic layer.
        policy: The categories (a curated answer needs one with a semantic layer).
    """

    def __init__(self, cache: CacheParts, policy: Policy) -> None:
        self._cache = cache
        self._policy = policy

    def curatable(self) -> list[str]:
        """The categories a curated answer can be saved in."""
        return sorted(name for name, c in self._policy.categories.items() if c.semantic.enabled)

    async def entries(self, tenant: str | None = None) -> list[CuratedEntry]:
        """Every curated answer, or one tenant's, by tenant, category and question."""
        found: list[CuratedEntry] = []
        for bucket in self._cache.each:
            tag = await bucket.versions.refresh()
            redis, keys = bucket.bucket.redis, bucket.bucket.keys
            async for set_key in redis.scan_iter(match=keys.faq_set_key(tag, "*"), count=500):
                name = str(as_text(set_key)).rsplit(":", 1)[-1]
                members = sorted(str(as_text(m)) for m in await redis.smembers(set_key))
                if not members:
                    continue
                async with redis.pipeline(transaction=False) as pipe:
                    for member in members:
                        pipe.hmget(member, [FIELD_QUESTION, FIELD_ANSWER, FIELD_ROOT, FIELD_TENANT, FIELD_CATEGORY,
                                            FIELD_INTENT])
                    rows = await pipe.execute()
                variants: dict[str, list[str]] = {}
                roots: list[tuple[str, list[bytes | None]]] = []
                for member, row in zip(members, rows, strict=True):
                    if row[0] is None:
                        continue  # expired or removed meanwhile
                    if str(as_text(row[2])) != member:
                        variants.setdefault(str(as_text(row[2])), []).append(str(as_text(row[0])))
                    elif tenant is None or str(as_text(row[3])) == tenant:
                        roots.append((member, row))
                for member, (question, answer, _, owner, category, intent) in roots:
                    found.append(CuratedEntry(
                        key=member, file=name, tenant=str(as_text(owner)), category=str(as_text(category)),
                        question=str(as_text(question)), variants=tuple(sorted(variants.get(member, []))),
                        answer=(answer_text(answer) if isinstance(answer, bytes) else None) or "",
                        intent=as_text(intent)))
        return sorted(found, key=lambda e: (e.tenant, e.category, e.question))

    async def get(self, key: str, tenant: str | None = None) -> CuratedEntry:
        """One curated answer by key (in ``tenant`` when given).

        Raises:
            NoSuchCurated: None of that key there.
        """
        entry = next((e for e in await self.entries(tenant) if e.key == key), None)
        if entry is None:
            raise NoSuchCurated(f"no curated answer {key}" + (f" in tenant {tenant}" if tenant else ""))
        return entry

    async def add(self, *, tenant: str, category: str, question: str, answer: str,
                  variants: list[str] | tuple[str, ...] = ()) -> CuratedSaved:
        """Add a curated answer with its variants; the model's answers to those words go.

        Raises:
            NotCuratable: An empty question or answer, or a category without a semantic layer.
            AlreadyCurated: The question or a variant is curated already there.
        """
        asked, kept = _wordings(question, variants)
        self._check(category, asked, answer)
        for existing in await self.entries(tenant):
            if existing.category != category:
                continue
            taken = next((w for w in (asked, *kept) if any(same_wording(w, t) for t in (existing.question, *existing.variants))), None)
            if taken is not None:
                raise AlreadyCurated(f"“{taken}” is curated already in {category} for tenant {tenant} "
                                     f"(as “{existing.question}”): edit that answer instead.", existing)
        name = ADDED_PREFIX + hashlib.sha256(f"{tenant}\x1f{category}\x1f{asked}".encode()).hexdigest()[:16]
        item = FaqItem(category=category, question=asked, answer=answer.strip(), tenant=tenant, variants=kept)
        loaded = await load_faq_in_buckets(self._cache, [item], name, self._policy)
        return CuratedSaved(entry=await self._entry_of(name, tenant, category, asked), replaced=loaded.replaced,
                            keys_removed=loaded.keys_removed)

    async def edit(self, key: str, *, answer: str, variants: list[str] | tuple[str, ...] | None = None,
                   tenant: str | None = None) -> CuratedSaved:
        """Give a curated answer a new text (and, when given, a new list of variants): its file
        is written again with the change; the model's answers to its words go.

        Raises:
            NoSuchCurated: No curated answer of that key (in ``tenant`` when given).
            NotCuratable: An empty answer.
            AlreadyCurated: A new variant is another curated answer's wording.
        """
        entry = await self.get(key, tenant)
        kept = list(entry.variants) if variants is None else _wordings(entry.question, variants)[1]
        self._check(entry.category, entry.question, answer)
        for other in await self.entries(entry.tenant):
            if other.key == entry.key or other.category != entry.category:
                continue
            taken = next((w for w in kept if any(same_wording(w, t) for t in (other.question, *other.variants))), None)
            if taken is not None:
                raise AlreadyCurated(f"“{taken}” is curated already as “{other.question}”.", other)
        siblings = [e for e in await self.entries() if e.file == entry.file]
        items = [e.as_item(answer=answer.strip(), variants=kept) if e.key == entry.key else e.as_item() for e in siblings]
        loaded = await load_faq_in_buckets(self._cache, items, entry.file, self._policy)
        return CuratedSaved(entry=await self._entry_of(entry.file, entry.tenant, entry.category, entry.question),
                            replaced=loaded.replaced, keys_removed=loaded.keys_removed)

    async def remove(self, key: str, *, tenant: str | None = None) -> CuratedEntry:
        """Remove a curated answer and its variants; its words are the model's to answer again.

        Raises:
            NoSuchCurated: No curated answer of that key (in ``tenant`` when given).
        """
        entry = await self.get(key, tenant)
        siblings = [e.as_item() for e in await self.entries() if e.file == entry.file and e.key != entry.key]
        await load_faq_in_buckets(self._cache, siblings, entry.file, self._policy)
        return entry

    async def load(self, items: list[FaqItem], name: str) -> FaqLoaded:
        """A team's file (``strata faq load``, an intents file's answers): replaces what was
        loaded under ``name``."""
        return await load_faq_in_buckets(self._cache, items, name, self._policy)

    def _check(self, category: str, question: str, answer: str) -> None:
        if category not in self.curatable():
            raise NotCuratable(f"category {category!r} has no semantic layer: curated answers need one "
                               f"({', '.join(self.curatable())})")
        if not question or not answer.strip():
            raise NotCuratable("a curated answer needs a question and an answer")

    async def _entry_of(self, name: str, tenant: str, category: str, question: str) -> CuratedEntry:
        return next(e for e in await self.entries(tenant)
                    if e.file == name and e.category == category and e.question == question)

