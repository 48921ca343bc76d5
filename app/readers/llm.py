"""An LLM judge on any OpenAI-compatible endpoint (``STRATA_JUDGE_URL``): vLLM on a GPU, TEI's
chat route, llama.cpp's server (``make judge-up``), a test double.

It asks the prompt of app/cache/judge.py (a stable system prompt, then the two lines ``Cached
question: ...`` and ``New question: ...``), two tokens at temperature 0, and reads yes or no.
"""

from __future__ import annotations

import asyncio
import logging

import openai

from app.cache.judge import JUDGE_REPLY_YES, judge_messages
from app.readers.base import ReadPair, first_model

logger = logging.getLogger("strata.readers")


class LLMJudge:
    """Asks a chat model whether the cached question's answer serves the new question.

    Args:
        url: The endpoint's base URL (``http://127.0.0.1:8002/v1``).
        model: The model to ask; empty: the endpoint's first model (``GET /v1/models``, once).
        timeout_s: Seconds a verdict may take; past it there is none.
        api_key: Sent as a bearer token (most local servers ignore it).
    """

    def __init__(self, url: str, model: str = "", timeout_s: float = 5.0, api_key: str = "unused") -> None:
        self._client = openai.AsyncOpenAI(base_url=url, api_key=api_key or "unused", max_retries=0,
                                          timeout=timeout_s)
        self._model = model
        self._timeout_s = timeout_s
        self._resolving = asyncio.Lock()
        self.name = f"llm:{model}" if model else "llm"

    async def model(self) -> str:
        """The model asked: the configured one, else the endpoint's first (read once)."""
        if self._model:
            return self._model
        async with self._resolving:
            if not self._model:
                self._model = await first_model(self._client, "judge")
                self.name = f"llm:{self._model}"
        return self._model

    async def read(self, pair: ReadPair) -> bool | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await self._client.chat.completions.create(
                    model=await self.model(), messages=judge_messages(pair.asked, pair.cached),  # type: ignore[arg-type]
                    max_tokens=2, temperature=0.0)
        except (openai.OpenAIError, TimeoutError, LookupError) as exc:
            logger.warning("judge %s gave no verdict: %r", self.name, exc)
            return None
        text = reply.choices[0].message.content if reply.choices else None
        if not isinstance(text, str):
            return None
        return JUDGE_REPLY_YES.match(text) is not None

    async def close(self) -> None:
        await self._client.close()
