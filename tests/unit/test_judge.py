"""The LLM judge's reading of replies and its failure handling, against a stub completer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.cache.readers.judge import JUDGE_ACCEPTED, JUDGE_FAILED, JUDGE_REJECTED, JUDGE_SYSTEM_PROMPT, LLMJudge
from app.errors import UpstreamUnavailable


class StubCompleter:
    def __init__(self, reply: Any = "yes", delay: float = 0.0, error: Exception | None = None) -> None:
        self.reply, self.delay, self.error = reply, delay, error
        self.bodies: list[dict[str, Any]] = []

    async def complete(self, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        self.bodies.append(body)
        await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        return b"", {"choices": [{"message": {"content": self.reply}}]}


@pytest.mark.parametrize(("reply", "reason"), [
    ("yes", JUDGE_ACCEPTED), ("Yes.", JUDGE_ACCEPTED), (" YES, same intent", JUDGE_ACCEPTED), ("是的", JUDGE_ACCEPTED),
    ("no", JUDGE_REJECTED), ("No, different product", JUDGE_REJECTED), ("yesterday", JUDGE_REJECTED),
    ("不是", JUDGE_REJECTED), ("", JUDGE_REJECTED), (None, JUDGE_REJECTED),
])
def test_only_a_yes_accepts(reply: Any, reason: str) -> None:
    verdict = asyncio.run(LLMJudge.on_upstream(StubCompleter(reply), timeout_s=1.0).confirm("怎么退款", "怎么开发票", "m"))
    assert verdict.reason == reason and verdict.accepted == (reason == JUDGE_ACCEPTED)


def test_the_prompt_is_a_stable_prefix_then_the_pair() -> None:
    stub = StubCompleter()
    asyncio.run(LLMJudge.on_upstream(stub, timeout_s=1.0).confirm("怎么退款", "怎么开发票", "request-model"))
    asyncio.run(LLMJudge.on_upstream(stub, timeout_s=1.0, model="judge-model").confirm("a", "b", "request-model"))
    first, second = stub.bodies
    assert first["messages"][0] == second["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert "Cached question: 怎么开发票\nNew question: 怎么退款" in first["messages"][1]["content"]
    assert (first["model"], second["model"]) == ("request-model", "judge-model")
    assert first["max_tokens"] <= 4 and first["temperature"] == 0.0


@pytest.mark.parametrize(("stub", "reason"), [
    (StubCompleter(delay=0.5), JUDGE_FAILED),
    (StubCompleter(error=UpstreamUnavailable("down")), JUDGE_FAILED),
    (StubCompleter(reply={"odd": 1}), JUDGE_REJECTED),
])
def test_a_failing_judge_rejects(stub: StubCompleter, reason: str) -> None:
    verdict = asyncio.run(LLMJudge.on_upstream(stub, timeout_s=0.1).confirm("a", "b", "m"))
    assert verdict.reason == reason and not verdict.accepted
