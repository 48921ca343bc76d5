"""The replay's tally of wrong hits by kind (issue #24: twin intents are measured apart)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.replay.run import replay
from app.replay.streams import Request


class _Response:
    def __init__(self, layer: str, content: str, verdict: str = "") -> None:
        self.status_code = 200
        self.headers = {"x-cache": layer, "x-cache-similarity": "0.9" if layer == "semantic-hit" else "",
                        "x-cache-verdict": verdict}
        self._content = content

    def json(self) -> Any:
        return {"id": "chatcmpl-x", "choices": [{"message": {"role": "assistant", "content": self._content}}]}


class _Scripted:
    """Answers each request with the next (layer, content) of a script."""

    def __init__(self, script: list[tuple[str, ...]]) -> None:
        self._script = list(script)

    async def post(self, url: str, *, json: Any, headers: dict[str, str]) -> Any:
        return _Response(*self._script.pop(0))


def test_wrong_hits_are_told_apart_first_meetings_twins_and_repeats() -> None:
    stream = [Request(text="a1", label="A"), Request(text="b1", label="B"), Request(text="b2", label="B"),
              Request(text="b3", label="B"), Request(text="b3", label="B"), Request(text="a2", label="A")]
    script = [("miss", "answer A"),           # A answered: its answer is cached
              ("semantic-hit", "answer A"),   # B's first question gets A's: nothing could have answered it
              ("miss", "answer B"),           # B answered
              ("semantic-hit", "answer A"),   # B's answer was cached, A's served: a twin
              ("semantic-hit", "answer A"),   # the same question again, served wrongly again
              ("semantic-hit", "answer A")]   # right
    report = asyncio.run(replay(stream, _Scripted(script), model="m", category="faq"))
    assert [o.wrong_kind for o in report.outcomes] == [None, "first_meeting", None, "twin", "repeat", None]
    assert report.wrong_kinds() == {"first_meeting": 1, "twin": 1, "repeat": 1}
    assert "first_meeting 1, twin 1, repeat 1" in report.summary(500)


def test_semantic_hits_are_tallied_by_the_rule_that_served_them() -> None:
    stream = [Request(text="a1", label="A"), Request(text="a2", label="A"), Request(text="b1", label="B"),
              Request(text="a3", label="A")]
    script = [("miss", "answer A"),
              ("semantic-hit", "answer A", "entry_record"),   # right
              ("semantic-hit", "answer A", "above_band"),     # wrong: B asked
              ("semantic-hit", "answer A", "entry_record")]   # right
    report = asyncio.run(replay(stream, _Scripted(script), model="m", category="faq"))
    assert report.semantic_by_verdict() == {"above_band": (1, 1), "entry_record": (2, 0)}
    assert "above_band 1 (1), entry_record 2 (0)" in report.summary(500)
    assert b'"verdict": "above_band"' in report.to_json(500)
