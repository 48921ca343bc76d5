"""The optional LLM judge: the upstream model confirms a borderline semantic candidate.

Off by default (``semantic.judge`` in the policy file). When a category turns it on, a candidate
the learned verifier accepted in the borderline band (reason ``verifier_accepted``) is served
only if the model, asked whether the two questions ask for the same thing, answers yes. The judge
can only veto: it never serves a candidate the guards or the verifier rejected. A failure or a
timeout of the judge is a rejection (a miss), never an error for the client.

Only the two questions go into the prompt, not the cached answer, so ``strata calibrate evaluate``
(which has questions only) asks exactly what the service asks.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Protocol

from app.cache.base import Verdict
from app.errors import StrataError

logger = logging.getLogger("strata.judge")

JUDGE_ACCEPTED = "judge_accepted"
JUDGE_REJECTED = "judge_rejected"
JUDGE_FAILED = "judge_failed"

# Kept byte-identical across calls so vLLM's prefix cache reuses its KV blocks (L3).
JUDGE_SYSTEM_PROMPT = (
    "You check a cache of customer-service answers. Two questions are given. Reply with one word: "
    "yes if an answer to the cached question fully answers the new question (same intent, same "
    "product, same numbers), otherwise no."
)
# "yes" as a word ("yesterday" is not), or 是 (是的, 是。) at the start of the reply.
JUDGE_REPLY_YES = re.compile(r"^\W*(?:yes\b|是)", re.IGNORECASE)


def judge_messages(asked: str, cached: str) -> list[dict[str, str]]:
    """The chat messages of one judge call; the system prompt is the stable prefix."""
    return [
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": f"Cached question: {cached}\nNew question: {asked}\nSame answer? yes or no:"},
    ]


class Completer(Protocol):
    """What the judge needs of the upstream: :meth:`app.upstream.Upstream.complete`."""

    async def complete(self, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]: ...


class AnswerJudge:
    """Asks the upstream model whether a cached question's answer serves a new question.

    Args:
        upstream: The model server client.
        timeout_s: Seconds to wait for the verdict; past it the candidate is rejected.
        model: The model to ask; empty to ask the model the request named.
    """

    def __init__(self, upstream: Completer, timeout_s: float, model: str = "") -> None:
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._model = model

    async def confirm(self, asked: str, cached: str, model: str) -> Verdict:
        """The judge's verdict on serving ``cached``'s answer to ``asked``.

        Args:
            asked: The new question.
            cached: The cached question that passed the verifier.
            model: The model the request named (used unless the judge has its own).

        Returns:
            ``judge_accepted``, ``judge_rejected``, or ``judge_failed`` (also a rejection).
        """
        body = {
            "model": self._model or model,
            "messages": judge_messages(asked, cached),
            "max_tokens": 2,
            "temperature": 0.0,
        }
        try:
            async with asyncio.timeout(self._timeout_s):
                _, completion = await self._upstream.complete(body)
            reply = completion["choices"][0]["message"]["content"]
        except (StrataError, TimeoutError, KeyError, IndexError, TypeError) as exc:
            logger.warning("LLM judge failed, candidate rejected: %r", exc)
            return Verdict(False, JUDGE_FAILED)
        accepted = isinstance(reply, str) and JUDGE_REPLY_YES.match(reply) is not None
        return Verdict(True, JUDGE_ACCEPTED) if accepted else Verdict(False, JUDGE_REJECTED)
