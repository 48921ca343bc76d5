"""Verification of semantic candidates: may the cached answer to one question serve another?

Raw cosine similarity cannot tell "怎么退款" from "怎么开发票" reliably, so a candidate that
passed the category's threshold goes through two more stages:

1. Guards, cheap and always on, in every band: different numbers (amounts, dates, order ids);
   different ids, codes, e-mail addresses, weekdays and dates, or named entities; the same values
   in another order or role ("from account 5 to account 9" / "from 9 to 5", "从5号账户到9号账户" /
   "从9号账户到5号账户", "c3 n9" / "c9 n3"); a negation on one side only (a word that negates
   nothing there, as in a Chinese question asked both ways, 能不能, is its own guard, which only
   the intent rule may serve past); opposite operations
   (开通/关闭, enable/disable); different named products or topics (花呗/借呗, 退款/发票). Any of them
   rejects. Lexicons live in ``schemas/verification.yaml``.
2. In the borderline band (threshold <= similarity < accept_above), a learned verifier on pair
   features must give a probability of at least the category's ``min_probability``. It is a
   gradient-boosted tree ensemble trained by ``make train-verifier`` and stored as JSON
   (``schemas/verifier.json``); inference here is plain numpy, with no pickle involved.

3. Optionally (``semantic.judge``), what the verifier accepted in the band goes to an async
   confirm hook (the LLM judge, ``app/cache/readers/judge.py``) that can only veto.

The service and ``strata calibrate`` both decide through :class:`CandidateCheck` (and so
:meth:`PairVerifier.verify`); verdicts are counted in one place, its ``on_verdict`` callback.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
import yaml

from app.cache.readers.judge import JUDGE_FAILED
from app.cache.storage.contract import Verdict, Verifier
from app.cache.storage.keys import normalize_text
from app.policy import FixedSemantic, SemanticPolicy
from app.settings import Settings

# Reasons, as they appear in metrics and the X-Cache-Verdict header.
BELOW_THRESHOLD = "below_threshold"
NUMBERS_DIFFER = "numbers_differ"
VALUES_DIFFER = "values_differ"
ORDER_DIFFERS = "order_differs"
NEGATION_DIFFERS = "negation_differs"
# The two sides differ only by a negation's word that negates nothing there (能不能, 有没有, 别人): a
# Chinese question asked both ways reads as a paraphrase a third of the time in AFQMC, so only the
# intent rule, which reads both questions as one of the team's intents, serves past it.
NEGATION_WORD_ONLY = "negation_word_only"
OPPOSITE_OPERATIONS = "opposite_operations"
ENTITIES_DIFFER = "entities_differ"
OWNER_DIFFERS = "owner_differs"
ABOVE_BAND = "above_band"
VERIFIED = "verifier_accepted"
VERIFIER_REJECTED = "verifier_rejected"
# Adaptive categories (app/cache/learning/learner.py).
WITHIN_BOUND = "within_bound"
OUTSIDE_BOUND = "outside_bound"
WRONG_BEFORE = "wrong_before"
ENTRY_RECORD = "entry_record"
# An entry's record vouched where records were not yet measured right often enough. No rule gives
# it now (the entry record needs no separate evidence: docs/experiments/removed-rules.md); the name
# stays so that review items and audit entries written with it still read in plain words.
RECORD_UNPROVEN = "record_unproven"
# A reader (app/cache/readers) said yes where its yes was measured right often enough: served.
READER_ACCEPTED = "reader_accepted"
READER_REJECTED = "reader_rejected"
# A curated answer's own wording (its question or a listed variant, up to punctuation and case):
# the operator wrote that answer for those words, so no measurement is needed to serve it.
CURATED_WORDING = "curated_wording"
# Both questions given one of the team's intents at its calibrated confidence (issue #46).
INTENT_MATCH = "intent_match"
# The team's head reads the two questions as two different intents, both confidently.
INTENT_DIFFERS = "intent_differs"
# The intent rule would have served the row, but its entry's answer was never checked against
# the model (``intent_trusted_only``): the model answers, and its answer checks the entry.
INTENT_UNCHECKED = "intent_unchecked"
# The team's head certified nothing, and the intent rule is on trial: the row is one it would
# serve; the model answers, and its answer counts on the rule's trial record (issue #58 item 6).
INTENT_TRIAL = "intent_trial"
# Both questions read as one of the team's intents at the threshold its file's cross-validation
# showed, below a certified one (or with none certified): served on probation, the model asked
# after the response, and the intent's record, read by an anytime-valid test, can stop it.
INTENT_PROBATION = "intent_probation"
# A review item, not a verdict: the intent rule served a cached answer, and the model's answer to
# the same question, asked after the response to check the entry, differed from it.
CHECK_DISAGREED = "check_disagreed"

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[\u3400-\u9fff]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?|[零一二两三四五六七八九十百千万亿]+(?=[个元块号日月年天次期笔张位岁%])")
# Values a question is about, in the order written: e-mail addresses, ids and codes (letters with
# digits: "ab12cd", "c3"), numbers (ASCII after the width fold; other decimal digits too).
_VALUE = re.compile(
    r"(?P<email>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)"
    r"|(?P<id>\b(?=[a-z0-9]*\d)(?=[a-z0-9]*[a-z])[a-z0-9]+(?:[-_][a-z0-9]+)*\b)"
    r"|(?P<number>\d+(?:[.,]\d+)*|[零一二两三四五六七八九十百千万亿]+(?=[个元块号日月年天次期笔张位岁%]))"
)
# Words that are values too: weekdays, months and relative days name a date ("may" is a verb
# far more often than a month, and is left out).
_DATE_WORDS = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday january february march april june july august "
    "september october november december today tomorrow yesterday tonight weekend".split()
)
_CN_DATE = re.compile(r"(?:周|星期|礼拜)[一二三四五六日天]|今天|明天|昨天|后天|前天|今晚|周末")
# Markers that give the value after them a role; synonyms share the role's name.
# Only markers whose roles a reordering can swap; "over", "via", "until" and the like read the same
# either way ("over 50k" / "more than 50k") and are left to the order of the values.
_ROLE_WORDS = {
    "from": "source", "to": "target", "into": "target", "onto": "target", "toward": "target", "towards": "target",
    "by": "by", "per": "per", "than": "than", "minus": "minus", "plus": "plus", "times": "times",
}
_CN_ROLES = re.compile(r"(?P<source>从|由|自)|(?P<target>到|至|向|往|转给|转入到|换成|兑换成|换为|改为|改成)"
                       r"|(?P<by>除以)|(?P<times>乘以)|(?P<than>比)")
# A role holds the first value at most this many tokens (English) or characters (Chinese) after
# its marker, within one clause; in English only across function words and the nouns that name a
# slot ("from account 5", "to my card 9"), never across a verb ("to access over 50k").
_ROLE_REACH_WORDS = 3
_ROLE_REACH_CHARS = 4
# Chinese asks a yes-no question by a verb, 不 or 没, and the verb again (能不能, 有没有, 是不是, 可以不可以),
# or by 了没(有) at the end of a clause (到账了没有): a negation's character there negates nothing.
_CN_ASKING_BOTH_WAYS = re.compile(
    r"([\u3400-\u9fff]{1,2})[不没]\1|了没有?(?=[?？吗呢啊呀,.!，。！\s]|$)")
_SLOT_NOUNS = frozenset(
    "account accounts card cards number no order invoice ticket item page step line room seat gate platform id code "
    "box unit floor row version option plan level tier chapter section part question branch store shop wallet".split()
)
_CLAUSE_BREAK = re.compile(r"[,.;:!?，。；：！？、\n]")
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:[A-Z][a-z]+)*\b")
# Profiles kept per analyzer (a few hundred bytes each).
PROFILE_MEMO = 8192
_CN_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}


class Owners(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Words naming whose thing a question asks about: the asker's own or the assistant's."""

    asker: list[str] = msgspec.field(default_factory=list)
    assistant: list[str] = msgspec.field(default_factory=list)


class Lexicon(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Word lists of the guards (``schemas/verification.yaml``)."""

    negations: list[str]
    opposites: list[tuple[str, str]]
    entities: list[list[str]]
    function_words: list[str]
    owners: Owners = msgspec.field(default_factory=Owners)
    # Words holding a negation's character that negate nothing (别人, 特别, 非常, 未来).
    not_negations: list[str] = msgspec.field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Lexicon:
        try:
            return msgspec.convert(yaml.safe_load(path.read_text(encoding="utf-8")), cls)
        except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
            raise ValueError(f"verification lexicon {path}: {exc}") from exc


_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Whose thing a question asks about (``owners`` in schemas/verification.yaml).
ASKER = "asker"
ASSISTANT = "assistant"


class _Terms:
    """Finds lexicon terms in lower-cased text: Latin terms as whole words (one or two words, by
    set lookup on the text's tokens), other terms by one regex, longest first (so "余额宝" is
    found as itself and not as "余额")."""

    def __init__(self, terms: Sequence[str]) -> None:
        lowered = {t.lower() for t in terms}
        self._latin = {t for t in lowered if t.isascii()}
        others = sorted((t for t in lowered if not t.isascii()), key=len, reverse=True)
        self._other = re.compile("|".join(re.escape(t) for t in others)) if others else None

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """Where the terms stand in the text: (start, end, term), Latin terms as whole words."""
        found = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text) if m.group() in self._latin]
        if self._other is not None:
            found += [(m.start(), m.end(), m.group()) for m in self._other.finditer(text)]
        return found

    def find(self, text: str, words: Sequence[str]) -> list[str]:
        found = [w for w in words if w in self._latin]
        found += [f"{a} {b}" for a, b in itertools.pairwise(words) if f"{a} {b}" in self._latin]
        if self._other is not None:
            found += self._other.findall(text)
        return found


def _chinese_number(text: str) -> str:
    """"三" -> "3", "十二" -> "12"; anything more complex is kept as written."""
    if all(c in _CN_DIGITS for c in text):
        return "".join(str(_CN_DIGITS[c]) for c in text)
    if text.startswith("十") and len(text) <= 2 and all(c in _CN_DIGITS for c in text[1:]):
        return str(10 + (_CN_DIGITS[text[1]] if len(text) == 2 else 0))
    if len(text) in (2, 3) and text[1] == "十" and text[0] in _CN_DIGITS and all(c in _CN_DIGITS for c in text[2:]):
        return str(_CN_DIGITS[text[0]] * 10 + (_CN_DIGITS[text[2]] if len(text) == 3 else 0))
    return text


class Signals(msgspec.Struct, frozen=True):
    """What the guards found in one pair."""

    numbers_differ: bool
    negation_differs: bool
    opposite_operations: bool
    entities_differ: bool
    values_differ: bool = False
    order_differs: bool = False
    owner_differs: bool = False
    negation_word_only: bool = False

    @property
    def rejection(self) -> str | None:
        found = self.rejections
        return found[0] if found else None

    @property
    def rejections(self) -> tuple[str, ...]:
        """Every guard that rejects the pair, in the order :attr:`rejection` reports the first."""
        return tuple(reason for reason, found in (
            (NUMBERS_DIFFER, self.numbers_differ),
            (VALUES_DIFFER, self.values_differ),
            (ORDER_DIFFERS, self.order_differs),
            (NEGATION_DIFFERS, self.negation_differs),
            (NEGATION_WORD_ONLY, self.negation_word_only),
            (OPPOSITE_OPERATIONS, self.opposite_operations),
            (ENTITIES_DIFFER, self.entities_differ),
            (OWNER_DIFFERS, self.owner_differs),
        ) if found)


class Slot(msgspec.Struct, frozen=True, array_like=True):
    """One value a question names, where it stands: its role ("source" after from/从, "target"
    after to/到, ..., "" for none) and the value as compared ("5", "ab12cd", "alice@x.org")."""

    role: str
    value: str


class Profile(msgspec.Struct, frozen=True):
    """Everything the guards and features need from one question, computed once."""

    text: str
    numbers: list[str]
    slots: tuple[Slot, ...]
    named: frozenset[str]
    fillers: tuple[tuple[str, str, int], ...]
    negations: int
    # The lexicon's negation words as found, those that negate nothing too (the learned verifier's
    # input, as it was trained: schemas/verifier.json).
    negation_words: int
    operations: frozenset[str]
    entities: frozenset[int]
    owners: frozenset[str]
    tokens: frozenset[str]
    grams: tuple[frozenset[str], frozenset[str], frozenset[str]]
    bigram_sequence: tuple[str, ...]


class PairAnalyzer:
    """Guards and features of question pairs, from one lexicon."""

    def __init__(self, lexicon: Lexicon) -> None:
        self._negation = _Terms(lexicon.negations)
        self._not_negating = _Terms(lexicon.not_negations)
        self._opposite_of: dict[str, set[str]] = {}
        for first, second in lexicon.opposites:
            self._opposite_of.setdefault(first.lower(), set()).add(second.lower())
            self._opposite_of.setdefault(second.lower(), set()).add(first.lower())
        self._operations = _Terms(list(self._opposite_of))
        self._entity_of: dict[str, int] = {}
        for group_id, group in enumerate(lexicon.entities):
            for name in group:
                self._entity_of[name.lower()] = group_id
        self._entities = _Terms(list(self._entity_of))
        self._function_words = {w.lower() for w in lexicon.function_words}
        self._owners = {ASKER: _Terms(lexicon.owners.asker), ASSISTANT: _Terms(lexicon.owners.assistant)}
        # A lookup profiles the asked question once per candidate, and cached questions come back
        # request after request: profiles are frozen, so recent ones are kept (per worker).
        self.profile = functools.lru_cache(maxsize=PROFILE_MEMO)(self._profile)

    def _profile(self, question: str) -> Profile:
        written = normalize_text(question)
        text = written.lower()
        compact = text.replace(" ", "")
        words = _WORD.findall(text)
        slots, fillers = self._slots(text)
        return Profile(
            text=text,
            numbers=sorted(_chinese_number(n) for n in _NUMBER.findall(text)),
            slots=slots,
            named=frozenset(m.lower() for m in _CAPITALISED.findall(written) if m != "I"),
            fillers=fillers,
            negations=len(self._negation.find(self._negating_only(text), words)),
            negation_words=len(self._negation.find(text, words)),
            operations=frozenset(self._operations.find(text, words)),
            entities=frozenset(self._entity_of[m] for m in self._entities.find(text, words)),
            owners=frozenset(owner for owner, terms in self._owners.items() if terms.find(text, words)),
            tokens=frozenset(t for t in _TOKEN.findall(text) if t not in self._function_words),
            grams=(_grams(compact, 1), _grams(compact, 2), _grams(compact, 3)),
            bigram_sequence=tuple(compact[i : i + 2] for i in range(len(compact) - 1)),
        )

    def _negating_only(self, text: str) -> str:
        """The text with the words that hold a negation's character but negate nothing blanked out:
        the lexicon's ``not_negations`` and Chinese questions asked both ways (能不能, 到账了没有)."""
        spans = [(start, end) for start, end, _ in self._not_negating.spans(text)]
        spans += [m.span() for m in _CN_ASKING_BOTH_WAYS.finditer(text)]
        if not spans:
            return text
        chars = list(text)
        for start, end in spans:
            chars[start:end] = " " * (end - start)
        return "".join(chars)

    def _slots(self, text: str) -> tuple[tuple[Slot, ...], tuple[tuple[str, str, int], ...]]:
        """The values of a question in order, each with the role of the marker before it, and the
        first content word (English) or two characters (Chinese) after each marker, to tell
        "from paris to lyon" from "from lyon to paris", which name no value."""
        found: list[tuple[int, int, str]] = [
            (m.start(), m.end(), _chinese_number(m.group()) if m.lastgroup == "number" else m.group())
            for m in _VALUE.finditer(text)
        ]
        found += [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text) if m.group() in _DATE_WORDS]
        found += [(m.start(), m.end(), m.group()) for m in _CN_DATE.finditer(text)]
        found += [(start, end, f"#{self._entity_of[name]}") for start, end, name in self._entities.spans(text)]
        # A value inside a longer one ("3" of "c3", the digits of an e-mail address) is part of it.
        found = sorted(v for v in found if not any(o[0] <= v[0] and v[1] <= o[1] and o[1] - o[0] > v[1] - v[0]
                                                  for o in found))
        tokens = list(_WORD.finditer(text))
        markers: list[tuple[int, int, str, bool]] = []  # (start, end, role, English word)
        fillers: list[tuple[str, str, int]] = []  # (role, word after the marker, the marker's start)
        for index, match in enumerate(tokens):
            role = _ROLE_WORDS.get(match.group())
            if role is None or not _standalone(text, match.start(), match.end()):
                continue  # "from" of load_from_disk is no marker
            markers.append((match.start(), match.end(), role, True))
            following = next((t.group() for t in tokens[index + 1 : index + 1 + _ROLE_REACH_WORDS]
                              if t.group() not in self._function_words and t.group() not in _ROLE_WORDS), None)
            if following is not None:
                fillers.append((role, following, match.start()))
        for match in _CN_ROLES.finditer(text):
            markers.append((match.start(), match.end(), match.lastgroup or "", False))
            following = text[match.end() : match.end() + 2]
            if len(following) == 2 and all("\u3400" <= c <= "\u9fff" for c in following):
                fillers.append((match.lastgroup or "", following, match.start()))
        markers.sort()
        breaks = [m.start() for m in _CLAUSE_BREAK.finditer(text)]
        roles = [""] * len(found)
        for index, (_, m_end, role, english) in enumerate(markers):
            # The marker's reach: up to the next marker or clause break, a few words or characters.
            limit = min([b for b in breaks if b >= m_end] + [m[0] for m in markers[index + 1 :]] + [len(text)])
            reach = [i for i, (v_start, _, _) in enumerate(found) if m_end <= v_start < limit and not roles[i]
                     and self._within_reach(text[m_end:v_start], english)]
            # "from account 5": the number is what the role is about, not the word "account".
            specific = [i for i in reach if not found[i][2].startswith("#")]
            if specific or reach:
                roles[(specific or reach)[0]] = role
        return tuple(Slot(role, value) for role, (_, _, value) in zip(roles, found, strict=True)), tuple(fillers)

    def _within_reach(self, between: str, english: bool) -> bool:
        if not english:
            return len(between.strip()) <= _ROLE_REACH_CHARS
        words = _WORD.findall(between)
        return len(words) <= _ROLE_REACH_WORDS and all(
            w in self._function_words or w in _SLOT_NOUNS or w in self._entity_of for w in words)

    def compare(self, asked: Profile, cached: Profile) -> Signals:
        # An operation on one side whose opposite is on the other side only.
        opposite = any(
            other in cached.operations and other not in asked.operations and word not in cached.operations
            for word in asked.operations
            for other in self._opposite_of[word]
        )
        numbers_differ = asked.numbers != cached.numbers
        negation_differs = (asked.negations - cached.negations) % 2 == 1
        # Named products and topics (``#<group>``) have their own guard, entities_differ.
        values_differ = not numbers_differ and (
            sorted(s.value for s in asked.slots if s.value[0] != "#")
            != sorted(s.value for s in cached.slots if s.value[0] != "#")
            or _names_differ(asked, cached)
        )
        return Signals(
            numbers_differ=numbers_differ,
            negation_differs=negation_differs,
            negation_word_only=not negation_differs and (asked.negation_words - cached.negation_words) % 2 == 1,
            opposite_operations=opposite,
            entities_differ=asked.entities != cached.entities,
            values_differ=values_differ,
            order_differs=not numbers_differ and not values_differ and _order_differs(asked, cached),
            # Each side names one owner, another one: "what is my name" / "what is your name".
            owner_differs=len(asked.owners) == 1 and len(cached.owners) == 1 and asked.owners != cached.owners,
        )

    def signals(self, asked: str, cached: str) -> Signals:
        return self.compare(self.profile(asked), self.profile(cached))

    def names_values(self, question: str) -> bool:
        """Whether the question names a number, a value (an id, a code, an address, a date) or a
        name: what the numbers and values guards compare (named products and topics aside)."""
        found = self.profile(question)
        return bool(found.numbers or found.named or any(slot.value[0] != "#" for slot in found.slots))

    def features(self, asked: str, cached: str, similarity: float) -> list[float]:
        return self.pair_features(self.profile(asked), self.profile(cached), similarity)

    def pair_features(self, a: Profile, b: Profile, similarity: float) -> list[float]:
        """The verifier's inputs for one pair; names in :data:`FEATURE_NAMES`, same order."""
        values = [similarity]
        for grams_a, grams_b in zip(a.grams, b.grams, strict=True):
            shared = len(grams_a & grams_b)
            values += [shared / max(1, len(grams_a | grams_b)), shared / max(1, min(len(grams_a), len(grams_b)))]
        only_a, only_b = len(a.tokens - b.tokens), len(b.tokens - a.tokens)
        values += [
            len(a.tokens & b.tokens) / max(1, len(a.tokens | b.tokens)),
            float(min(only_a, only_b)),
            float(max(only_a, only_b)),
            (only_a + only_b) / max(1, len(a.tokens) + len(b.tokens)),
            min(len(a.text), len(b.text)) / max(1, len(a.text), len(b.text)),
            float(abs(len(a.text) - len(b.text))),
            (len(a.text) + len(b.text)) / 2.0,
            _ordered_overlap(a.bigram_sequence, b.bigram_sequence),
        ]
        signals = self.compare(a, b)
        values += [float(signals.numbers_differ), float((a.negation_words - b.negation_words) % 2 == 1),
                   float(signals.opposite_operations), float(signals.entities_differ)]
        return values


def _standalone(text: str, start: int, end: int) -> bool:
    """A word not joined to its neighbours by ``_``, ``.`` or ``-`` (part of an identifier)."""
    return (start == 0 or text[start - 1] not in "_.-") and (end == len(text) or text[end] not in "_.-")


def _names_differ(a: Profile, b: Profile) -> bool:
    """Each side names something (a capitalised name mid-sentence: "Lyon", "Paris") that the
    other does not mention at all: two named things, not one named and one left implicit."""
    only_a = {n for n in a.named if n not in b.text}
    only_b = {n for n in b.named if n not in a.text}
    return bool(only_a and only_b)


def _order_differs(a: Profile, b: Profile) -> bool:
    """The same values in other roles or another order. A value with a role on both sides (from/to,
    从/到, by, than, ...) must hold the same role there, wherever it stands; every other value must
    keep its place among the others. So "from account 5 to account 9" / "to account 9 from account
    5" agree, "from 5 to 9" / "from 9 to 5" and "10 divided by 2" / "2 divided by 10" do not. The
    words after two markers must not have swapped either ("from paris to lyon" / "from lyon to
    paris"). Values that differ are the other guards' to name."""
    if sorted(s.value for s in a.slots) == sorted(s.value for s in b.slots) and _slots_moved(a, b):
        return True
    return _fillers_swapped(a, b)


def _occurrences(slots: tuple[Slot, ...]) -> list[tuple[str, int, str]]:
    """(value, its occurrence number, role) in order: the k-th "5" of one side pairs with the k-th of the other."""
    seen: dict[str, int] = {}
    found = []
    for slot in slots:
        seen[slot.value] = seen.get(slot.value, -1) + 1
        found.append((slot.value, seen[slot.value], slot.role))
    return found


def _slots_moved(a: Profile, b: Profile) -> bool:
    in_a, in_b = _occurrences(a.slots), _occurrences(b.slots)
    role_b = {(value, n): role for value, n, role in in_b}
    held = set()
    for value, n, role in in_a:
        other = role_b.get((value, n), "")
        if role and other:
            if role != other:
                return True
            held.add((value, n))  # its role says what it is, wherever it stands
    order_a = [(value, n) for value, n, _ in in_a if (value, n) not in held]
    order_b = [(value, n) for value, n, _ in in_b if (value, n) not in held]
    return order_a != order_b


def _fillers_swapped(a: Profile, b: Profile) -> bool:
    """A word after a marker on one side stands before that marker on the other, and the other way
    round: "convert usd to eur" / "convert eur to usd", "from paris to lyon" / "from lyon to paris".
    (A word merely found elsewhere is a rewording, not a swap.)"""
    filled_a = {role: (word, at) for role, word, at in a.fillers}
    filled_b = {role: (word, at) for role, word, at in b.fillers}
    once = {r for r in filled_a.keys() & filled_b.keys()
            if sum(f[0] == r for f in a.fillers) == 1 and sum(f[0] == r for f in b.fillers) == 1}
    for role in once:
        (word_a, at_a), (word_b, at_b) = filled_a[role], filled_b[role]
        if word_a != word_b and a.text.rfind(word_b, 0, at_a) >= 0 and b.text.rfind(word_a, 0, at_b) >= 0:
            return True
    return False


def _ordered_overlap(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Share of character bigrams that appear in the same relative order on both sides: the
    longest common subsequence of the bigram sequences, by patience-style LIS (fast, order-aware)."""
    if not a or not b:
        return 0.0
    positions: dict[str, list[int]] = {}
    for index, gram in enumerate(b):
        positions.setdefault(gram, []).append(index)
    # Longest strictly increasing run of matched positions (each bigram of a matched in b, latest first).
    tails: list[int] = []
    for gram in a:
        for position in reversed(positions.get(gram, ())):
            slot = bisect.bisect_left(tails, position)
            if slot == len(tails):
                tails.append(position)
            else:
                tails[slot] = position
    return 2.0 * len(tails) / (len(a) + len(b))


FEATURE_NAMES = (
    "cosine",
    "char1_jaccard", "char1_containment", "char2_jaccard", "char2_containment", "char3_jaccard", "char3_containment",
    "content_jaccard", "content_only_min", "content_only_max", "content_only_share",
    "length_ratio", "length_difference", "length_mean", "ordered_bigram_overlap",
    "numbers_differ", "negation_differs", "opposite_operations", "entities_differ",
)


def _grams(compact: str, n: int) -> frozenset[str]:
    if len(compact) < n:
        return frozenset({compact} if compact else ())
    return frozenset(compact[i : i + n] for i in range(len(compact) - n + 1))


class TreeEnsemble(msgspec.Struct, frozen=True, kw_only=True):
    """A binary gradient-boosted tree ensemble: sigmoid(baseline + sum of leaf values).

    Each tree is stored as parallel arrays; a node with ``feature < 0`` is a leaf. A sample goes
    left when its feature value is <= the threshold.
    """

    baseline: float
    feature: list[list[int]]
    threshold: list[list[float]]
    left: list[list[int]]
    right: list[list[int]]
    value: list[list[float]]

    def probability_row(self, row: Sequence[float]) -> float:
        """P(same intent) of one pair: plain Python, far cheaper than numpy for a single row."""
        raw = self.baseline
        for feature, threshold, left, right, value in zip(
            self.feature, self.threshold, self.left, self.right, self.value, strict=True
        ):
            node = 0
            while feature[node] >= 0:
                node = left[node] if row[feature[node]] <= threshold[node] else right[node]
            raw += value[node]
        return 1.0 / (1.0 + math.exp(-raw))

    def probability(self, features: np.ndarray) -> np.ndarray:
        """P(same intent) for each row of a (n, n_features) matrix (batch evaluation)."""
        rows = np.asarray(features, dtype=np.float64)
        raw = np.full(rows.shape[0], self.baseline)
        every = np.arange(rows.shape[0])
        for feature, threshold, left, right, value in zip(
            self.feature, self.threshold, self.left, self.right, self.value, strict=True
        ):
            f, t, lft, rgt, v = (np.asarray(x) for x in (feature, threshold, left, right, value))
            node = np.zeros(rows.shape[0], dtype=np.int64)
            active = f[node] >= 0
            while active.any():
                idx = every[active]
                current = node[idx]
                goes_left = rows[idx, f[current]] <= t[current]
                node[idx] = np.where(goes_left, lft[current], rgt[current])
                active = f[node] >= 0
            raw += v[node]
        probability: np.ndarray = 1.0 / (1.0 + np.exp(-raw))
        return probability


class VerifierArtifact(msgspec.Struct, frozen=True, kw_only=True):
    """The committed, trained verifier and how it was made.

    Attributes:
        features: Feature names, in the order the model expects.
        model: The tree ensemble.
        trained_on: Data files (name, rows, sha256) and the command that produced the artifact.
        checks: Sample pairs with the probability training computed, to detect drift on load.
    """

    features: list[str]
    model: TreeEnsemble
    trained_on: dict[str, Any]
    checks: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> VerifierArtifact:
        try:
            artifact = msgspec.json.decode(path.read_bytes(), type=cls)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"verifier artifact {path}: {exc}") from exc
        if tuple(artifact.features) != FEATURE_NAMES:
            raise ValueError(f"verifier artifact {path} was trained on other features; run `make train-verifier`")
        return artifact


class PairVerifier:
    """The verification stage, as the service and ``strata calibrate`` run it."""

    def __init__(self, analyzer: PairAnalyzer, model: TreeEnsemble | None) -> None:
        self.analyzer = analyzer
        self.model = model

    @classmethod
    def from_files(cls, lexicon_path: Path, artifact_path: Path | None) -> PairVerifier:
        model = VerifierArtifact.load(artifact_path).model if artifact_path is not None else None
        return cls(PairAnalyzer(Lexicon.load(lexicon_path)), model)

    def probability(self, asked: str, cached: str, similarity: float) -> float:
        """P(same intent) by the learned verifier; 0 without one, so the band never serves."""
        return self._probability(self.analyzer.profile(asked), self.analyzer.profile(cached), similarity)

    def _probability(self, asked: Profile, cached: Profile, similarity: float) -> float:
        if self.model is None:
            return 0.0
        return self.model.probability_row(self.analyzer.pair_features(asked, cached, similarity))

    def same_content(self, asked: str, cached: str) -> bool:
        """Whether two questions have the same content words and numbers (they differ only in
        function words, particles, punctuation, case or order): the same question for any domain."""
        a, b = self.analyzer.profile(asked), self.analyzer.profile(cached)
        return a.tokens == b.tokens and a.numbers == b.numbers and bool(a.tokens)

    def guard(self, asked: str, cached: str) -> str | None:
        """The guards alone: the reason they reject the pair, or ``None``."""
        return self.analyzer.signals(asked, cached).rejection

    def guards(self, asked: str, cached: str) -> tuple[str, ...]:
        """Every guard that rejects the pair (none: an empty tuple)."""
        return self.analyzer.signals(asked, cached).rejections

    def names_values(self, question: str) -> bool:
        return self.analyzer.names_values(question)

    def verify(self, asked: str, cached: str, similarity: float, policy: SemanticPolicy) -> Verdict:
        """Decide whether the answer cached for ``cached`` may serve ``asked``.

        Args:
            asked: The new question.
            cached: The cached question that is the candidate.
            similarity: Their cosine similarity.
            policy: The category's semantic policy.

        Returns:
            The decision and its reason.
        """
        if similarity < policy.threshold:
            return Verdict(False, BELOW_THRESHOLD)
        asked_profile, cached_profile = self.analyzer.profile(asked), self.analyzer.profile(cached)
        rejection = self.analyzer.compare(asked_profile, cached_profile).rejection
        if rejection is not None:
            return Verdict(False, rejection)
        if similarity >= policy.accept_above:
            return Verdict(True, ABOVE_BAND)
        if not isinstance(policy, FixedSemantic):
            return Verdict(False, OUTSIDE_BOUND)  # an adaptive category has no verifier: its cold start
        if self._probability(asked_profile, cached_profile, similarity) >= policy.min_probability:
            return Verdict(True, VERIFIED)
        return Verdict(False, VERIFIER_REJECTED)


class ThresholdVerifier:
    """Cosine similarity against the category's threshold, nothing more (no guards, no model)."""

    def guard(self, asked: str, cached: str) -> str | None:
        return None

    def guards(self, asked: str, cached: str) -> tuple[str, ...]:
        return ()

    def same_content(self, asked: str, cached: str) -> bool:
        return False

    def names_values(self, question: str) -> bool:
        return False

    def verify(self, asked: str, cached: str, similarity: float, policy: SemanticPolicy) -> Verdict:
        if similarity >= policy.threshold:
            return Verdict(True, "above_threshold")
        return Verdict(False, BELOW_THRESHOLD)


class Confirm(Protocol):
    """An async second opinion on a band acceptance (the LLM judge); it can only veto."""

    async def confirm(self, asked: str, cached: str, model: str) -> Verdict: ...


class CandidateCheck:
    """Verification as the semantic layer runs it: guards and verifier, then the confirm hook.

    Args:
        verifier: The synchronous stage (guards, learned verifier).
        confirm: The hook asked about ``verifier_accepted`` candidates of categories with
            ``semantic.judge``; without one such candidates are rejected (``judge_failed``).
        on_verdict: Called with every verdict (the one place they are counted).
    """

    def __init__(self, verifier: Verifier, confirm: Confirm | None = None,
                 on_verdict: Callable[[Verdict], None] | None = None) -> None:
        self.verifier = verifier
        self._confirm = confirm
        self._on_verdict = on_verdict

    def count(self, verdict: Verdict) -> Verdict:
        """Count a verdict reached elsewhere (the adaptive decision's); returns it."""
        if self._on_verdict is not None:
            self._on_verdict(verdict)
        return verdict

    async def decide(self, asked: str, cached: str, similarity: float, policy: SemanticPolicy, model: str) -> Verdict:
        """Whether the answer cached for ``cached`` may serve ``asked`` (every stage).

        Args:
            asked: The new question.
            cached: The candidate's question.
            similarity: Their cosine similarity.
            policy: The category's semantic policy.
            model: The model the request named (the judge asks it unless configured otherwise).
        """
        verdict = self.count(self.verifier.verify(asked, cached, similarity, policy))
        return await self.confirmed(verdict, asked, cached, policy, model)

    def guarded(self, asked: str, cached: str) -> Verdict | None:
        """The guards' rejection (counted), or ``None`` when they let the pair through."""
        rejection = self.verifier.guard(asked, cached)
        return None if rejection is None else self.held(rejection)

    def guard(self, asked: str, cached: str) -> str | None:
        """The guard that rejects the pair, not yet counted: the Guards rule turns it into a
        ruling, and the intents' calibration asks it of pairs that never reach the rules."""
        return self.verifier.guard(asked, cached)

    def guards(self, asked: str, cached: str) -> tuple[str, ...]:
        """Every guard that rejects the pair, not yet counted (:meth:`guard` is the first)."""
        return self.verifier.guards(asked, cached)

    def same_content(self, asked: str, cached: str) -> bool:
        """Whether the pair differs only in function words, punctuation, case or order."""
        return self.verifier.same_content(asked, cached)

    def names_values(self, question: str) -> bool:
        """Whether the question names a value the guards compare."""
        return self.verifier.names_values(question)

    def held(self, rejection: str) -> Verdict:
        """Count a guard's rejection that stands."""
        return self.count(Verdict(False, rejection))

    async def confirmed(self, verdict: Verdict, asked: str, cached: str, policy: SemanticPolicy, model: str) -> Verdict:
        """The confirm step alone: a band acceptance goes to the hook when the policy asks for it."""
        if verdict.reason != VERIFIED or not policy.judge_before_serving:
            return verdict
        if self._confirm is None:
            return self.count(Verdict(False, JUDGE_FAILED))  # never serve unconfirmed what must be confirmed
        return self.count(await self._confirm.confirm(asked, cached, model))


def load_verifier(settings: Settings) -> PairVerifier:
    """The verifier the settings name: its lexicon and (optional) trained artifact."""
    artifact = settings.resolve(settings.semantic.verifier_artifact) if settings.semantic.verifier_artifact else None
    return PairVerifier.from_files(settings.resolve(settings.semantic.verification_lexicon), artifact)
