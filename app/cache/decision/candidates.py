"""A KNN row as the decision reads it: its entry, who wrote its answer, its neighbours of other
answers, and whether two questions are one wording."""

from __future__ import annotations

from collections.abc import Sequence

from app.cache.storage.contract import CorruptEntry, Nearest, Neighbour
from app.cache.storage.keys import (
    FIELD_ANSWER,
    FIELD_QUESTION,
    FIELD_ROOT,
    FIELD_SOURCE,
    SOURCE_MODEL,
    as_text,
    fold_wording,
)

# Other entries of model answers handed to the learner with a candidate: the nearest few are
# where a second entry of the same answer would be.
NEIGHBOURS = 3


def same_wording(asked: str, cached: bytes | str) -> bool:
    """Whether two questions are one wording, up to case, spaces and punctuation (how a curated
    answer's own question or variant is asked again). Narrower than
    :meth:`CandidateCheck.same_content` on purpose: "why must I verify my identity" and "how do
    I verify my identity" share their content words, not their wording."""
    folded = fold_wording(asked)
    return bool(folded) and folded == fold_wording(str(as_text(cached)))


def check_row(row: Nearest) -> None:
    """Raises CorruptEntry for a document without its question or answer (a cache failure)."""
    if not row.fields.get(FIELD_QUESTION) or not row.fields.get(FIELD_ANSWER):
        raise CorruptEntry(f"semantic entry {row.key} lacks its question or answer")


def root_of(row: Nearest) -> str:
    """The entry whose answer a document serves (itself when it is an entry)."""
    return as_text(row.fields.get(FIELD_ROOT)) or row.key


def source_of(row: Nearest) -> str:
    """``model`` or ``faq``: who wrote a document's answer."""
    return as_text(row.fields.get(FIELD_SOURCE)) or SOURCE_MODEL


def answer_bytes(row: Nearest) -> bytes:
    answer = row.fields[FIELD_ANSWER]
    return answer.encode() if isinstance(answer, str) else bytes(answer)


def neighbours_of(root: str, row: Nearest, rows: Sequence[Nearest], floor: float) -> tuple[Neighbour, ...]:
    """Entries of model answers in the band other than the candidate's, nearest first (none for
    a curated candidate: operators' entries are never merged)."""
    if source_of(row) != SOURCE_MODEL:
        return ()
    found: dict[str, Neighbour] = {}
    for other in rows:
        other_root = root_of(other)
        if other.similarity < floor or len(found) == NEIGHBOURS:
            break
        if other_root != root and other_root not in found and source_of(other) == SOURCE_MODEL \
                and other.fields.get(FIELD_ANSWER):
            found[other_root] = Neighbour(root=other_root, answer=answer_bytes(other))
    return tuple(found.values())


