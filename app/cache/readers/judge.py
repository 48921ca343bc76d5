"""The LLM judge: a chat model says whether two questions share an answer.

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
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import openai

from app.cache.readers.base import ReadPair, first_model
from app.cache.storage.contract import Verdict
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


# One judge call: (the request body) -> the reply's text; raises on any failure.
Ask = Callable[[dict[str, Any]], Awaitable[str | None]]


class LLMJudge:
    """The one LLM judge: asks a chat model whether the cached question's answer serves the new
    question, two tokens at temperature 0, and reads yes or no.

    It answers as the verifier's confirm step (:meth:`confirm`: a verdict, for ``semantic.judge:
    true`` and ``judge: async``) and as a reader of the grey zone (:meth:`read`: yes, no or
    nothing, app/cache/readers/base.py). Build it on the upstream (:meth:`on_upstream`) or on any
    OpenAI-compatible endpoint (:meth:`on_endpoint`: ``STRATA_JUDGE_URL``, ``make judge-up``).

    Args:
        ask: Sends one judge request and returns the reply's text.
        timeout_s: Seconds a verdict may take; past it there is none.
        model: The model to ask; empty: the request's (upstream) or the endpoint's first.
        name: How metrics and logs name it.
        resolve_model: Finds the endpoint's first model, when none is configured.
        close: Closes the transport.
    """

    def __init__(self, ask: Ask, timeout_s: float, model: str = "", name: str = "llm",
                 resolve_model: Callable[[], Awaitable[str]] | None = None,
                 close: Callable[[], Awaitable[None]] | None = None) -> None:
        self._ask = ask
        self._timeout_s = timeout_s
        self._model = model
        self._resolve_model = resolve_model
        self._resolving = asyncio.Lock()
        self._close = close
        self.name = f"{name}:{model}" if model else name

    @classmethod
    def on_upstream(cls, upstream: Completer, timeout_s: float, model: str = "") -> LLMJudge:
        """The judge on the model server Strata answers from (the request's model unless ``model``)."""

        async def ask(body: dict[str, Any]) -> str | None:
            _, completion = await upstream.complete(body)
            reply = completion["choices"][0]["message"]["content"]
            return reply if isinstance(reply, str) else ""  # an answer, and not a yes

        return cls(ask, timeout_s, model, name="upstream")

    @classmethod
    def on_endpoint(cls, url: str, model: str = "", timeout_s: float = 5.0, api_key: str = "unused") -> LLMJudge:
        """The judge on an OpenAI-compatible endpoint of its own (``http://127.0.0.1:8002/v1``)."""
        client = openai.AsyncOpenAI(base_url=url, api_key=api_key or "unused", max_retries=0, timeout=timeout_s)

        async def ask(body: dict[str, Any]) -> str | None:
            reply = await client.chat.completions.create(**body)
            text = reply.choices[0].message.content if reply.choices else None
            return text if isinstance(text, str) else None

        return cls(ask, timeout_s, model, name="llm", resolve_model=lambda: first_model(client, "judge"),
                   close=client.close)

    async def model(self, requested: str = "") -> str:
        """The model asked: the configured one, else the request's, else the endpoint's first (read once)."""
        if self._model or self._resolve_model is None:
            return self._model or requested
        async with self._resolving:
            if not self._model:
                self._model = await self._resolve_model()
                self.name = f"llm:{self._model}"
        return self._model

    async def said_yes(self, asked: str, cached: str, model: str = "") -> bool | None:
        """Whether the model says the cached question's answer serves the asked one; ``None``: no verdict."""
        try:
            async with asyncio.timeout(self._timeout_s):
                body = {"model": await self.model(model), "messages": judge_messages(asked, cached),
                        "max_tokens": 2, "temperature": 0.0}
                reply = await self._ask(body)
        except (StrataError, openai.OpenAIError, TimeoutError, LookupError, TypeError) as exc:
            logger.warning("judge %s gave no verdict: %r", self.name, exc)
            return None
        return None if reply is None else JUDGE_REPLY_YES.match(reply) is not None

    async def confirm(self, asked: str, cached: str, model: str) -> Verdict:
        """The judge's verdict on serving ``cached``'s answer to ``asked``: ``judge_accepted``,
        ``judge_rejected``, or ``judge_failed`` (also a rejection)."""
        said = await self.said_yes(asked, cached, model)
        if said is None:
            return Verdict(False, JUDGE_FAILED)
        return Verdict(True, JUDGE_ACCEPTED) if said else Verdict(False, JUDGE_REJECTED)

    async def read(self, pair: ReadPair) -> bool | None:
        """As a reader of the grey zone: yes, no, or ``None`` (no verdict in time)."""
        return await self.said_yes(pair.asked, pair.cached, pair.model)

    async def close(self) -> None:
        if self._close is not None:
            await self._close()
