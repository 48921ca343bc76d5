"""Plain words for what the cache decided and what a console change did; the codes stay in the
metrics, headers and a tooltip, where operators who read ``X-Cache-Verdict`` look for them."""

from __future__ import annotations

from app.cache.decision.verify import (
    ABOVE_BAND,
    BELOW_THRESHOLD,
    CHECK_DISAGREED,
    CURATED_WORDING,
    ENTITIES_DIFFER,
    ENTRY_RECORD,
    INTENT_DIFFERS,
    INTENT_MATCH,
    INTENT_UNCHECKED,
    NEGATION_DIFFERS,
    NUMBERS_DIFFER,
    OPPOSITE_OPERATIONS,
    ORDER_DIFFERS,
    OUTSIDE_BOUND,
    OWNER_DIFFERS,
    READER_ACCEPTED,
    READER_REJECTED,
    RECORD_UNPROVEN,
    VALUES_DIFFER,
    VERIFIED,
    VERIFIER_REJECTED,
    WITHIN_BOUND,
    WRONG_BEFORE,
)
from app.cache.readers.judge import JUDGE_ACCEPTED, JUDGE_FAILED, JUDGE_REJECTED
from app.cache.semantic import QUESTION_TOO_LONG
from app.cache.storage.recent import EXACT_REPEAT

VERDICT_WORDS = {
    EXACT_REPEAT: "the same request again, word for word (the exact layer)",
    BELOW_THRESHOLD: "not similar enough",
    NUMBERS_DIFFER: "the questions name different numbers",
    VALUES_DIFFER: "the questions name different values (ids, dates, amounts)",
    ORDER_DIFFERS: "the same words in another order (who does what to whom)",
    NEGATION_DIFFERS: "one question is negated, the other not",
    OPPOSITE_OPERATIONS: "opposite actions (open / close, add / remove)",
    ENTITIES_DIFFER: "the questions name different things",
    OWNER_DIFFERS: "one asks about the asker's own, the other about the assistant's (my name / your name)",
    ABOVE_BAND: "similar enough to serve without a check",
    VERIFIED: "the verifier said they are the same question",
    VERIFIER_REJECTED: "the verifier said they differ",
    WITHIN_BOUND: "measured right often enough at this similarity",
    OUTSIDE_BOUND: "not yet measured right often enough at this similarity",
    WRONG_BEFORE: "marked wrong before at this similarity",
    ENTRY_RECORD: "this cached answer was confirmed for questions this close",
    RECORD_UNPROVEN: "this answer's record vouches, but such records are not yet proven",
    READER_ACCEPTED: "a reader judged them the same question",
    READER_REJECTED: "a reader judged them different questions",
    CURATED_WORDING: "a curated answer's own question or variant",
    INTENT_MATCH: "the team's intents read both as one intent",
    INTENT_UNCHECKED: "one intent, but the cached answer was not yet checked against the model",
    INTENT_DIFFERS: "the team's intents read them as two different intents",
    CHECK_DISAGREED: "served for its intent; the model's answer to it, asked after, differed",
    JUDGE_ACCEPTED: "the judge model said they are the same question",
    JUDGE_REJECTED: "the judge model said they differ",
    JUDGE_FAILED: "the judge model did not answer",
    QUESTION_TOO_LONG: "the question is too long to compare",
}


def verdict_words(code: str) -> str:
    """A verdict in plain words (the code itself when none are known)."""
    return VERDICT_WORDS.get(code, code.replace("_", " "))


# What a console change did, by the code its redirect carries: the page shows these words and
# never a text taken from the URL (details the console wrote itself are signed, app/web/console.py).
MESSAGES = {
    "marked-wrong": "Marked wrong: it is not served there again.",
    "not-recorded": "Not recorded.",
    "approved": "Approved: the next paraphrase is served this answer.",
    "rejected": "Rejected: this answer is not served there.",
    "not-applied": "Not applied: the entry is gone or full.",
    "curated-saved": "Saved: the next request gets it.",
    "curated-removed": "Removed: the model answers these words again.",
    "signed-out": "Signed out.",
    "refit-started": "Refit started: the head is fitted and calibrated again; this page shows when it is done.",
    "refit-running": "A refit is running already.",
}


# Nouns whose plural is not the noun and an "s".
_PLURALS = {"entry": "entries", "reply": "replies"}


def counted(number: int, noun: str) -> str:
    """``1 variant``, ``2 variants``, ``1 entry``, ``3 entries``: a count with its noun agreeing;
    the last word of ``noun`` takes the plural."""
    if number == 1:
        return f"{number} {noun}"
    head, _, last = noun.rpartition(" ")
    plural = _PLURALS.get(last, last + "s")
    return f"{number} {head + ' ' if head else ''}{plural}"
