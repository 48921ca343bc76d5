"""The readers' contract: a candidate pair in, yes / no / no verdict out.

A reader never decides alone. The adaptive decision (app/cache/decision/adaptive.py) asks it about a
candidate the category's own evidence refused, and serves on its "yes" only at scores where the
tenant's pool has measured its "yes" wrong less often than the bound (``reader_ok:<bin>`` /
``reader_wrong:<bin>``, counted by app/cache/learning/learner.py against the model's answer).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import msgspec
import openai

# How a reader's verdicts are counted (metrics, audit).
READ_YES = "yes"
READ_NO = "no"
READ_FAILED = "failed"


class ReadPair(msgspec.Struct, frozen=True, kw_only=True):
    """One question a reader is asked.

    Attributes:
        asked: The new question.
        cached: The cached question whose answer would be served.
        answer: That answer's text (a reader may read it; the LLM judge reads the questions only).
        model: The model the request named.
        similarity: The two questions' cosine similarity (for the audit, not for the verdict).
    """

    asked: str
    cached: str
    answer: str = ""
    model: str = ""
    similarity: float = 0.0


class Reader(Protocol):
    """Anything that reads a candidate pair.

    Attributes:
        name: Names the reader in metrics, ``/health`` and the audit (``llm:<model>``, ``oracle``).
    """

    name: str

    async def read(self, pair: ReadPair) -> bool | None:
        """Whether the cached answer answers the new question; ``None`` when the reader could not
        tell (a failure, a timeout, an unreadable reply): no verdict, nothing counted."""
        ...


class Unanimous:
    """Several readers as one: yes when every one says yes, no when any says no, else no verdict.

    Args:
        readers: The readers, asked together.
    """

    def __init__(self, readers: list[Reader]) -> None:
        self._readers = readers
        self.name = "+".join(reader.name for reader in readers)

    async def read(self, pair: ReadPair) -> bool | None:
        said = await asyncio.gather(*(reader.read(pair) for reader in self._readers))
        if False in said:
            return False
        return None if None in said else True


async def first_model(client: openai.AsyncOpenAI, what: str) -> str:
    """The first model an OpenAI-compatible endpoint lists (a reader's default model).

    Raises:
        LookupError: It lists none.
    """
    listed = await client.models.list()
    if not listed.data:
        raise LookupError(f"the {what} endpoint lists no model")
    return listed.data[0].id
