"""Readers (issue #33): the oracle of simulated replays, the LLM judge on an OpenAI-compatible
endpoint, the bounded and fair queue of reads after the response, and trust measured per score."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from litestar import Litestar, Request, get, post

from app.cache.decision.stats import PooledCounts, reader_error_here, reader_trusted, rule_trusted
from app.cache.readers.base import ReadPair
from app.cache.readers.judge import LLMJudge
from app.cache.readers.oracle import OracleReader
from app.cache.readers.queue import ReadQueue
from app.cache.storage.keys import VOUCH_READER, VOUCH_RECORD
from app.policy import AdaptiveSemantic
from app.replay.simulate import ServerThread

POLICY = AdaptiveSemantic(threshold=0.6, accept_above=0.9, error_bound=0.01, confidence=0.85)


def read(reader: Any, asked: str, cached: str) -> bool | None:
    return asyncio.run(reader.read(ReadPair(asked=asked, cached=cached)))


def test_the_oracle_answers_from_labels_and_errs_on_the_share_it_is_given() -> None:
    labels = {"how do i reset my pin": "pin", "pin reset please": "pin", "what is my balance": "balance"}
    oracle = OracleReader(labels)
    assert read(oracle, "how do i reset my pin", "pin reset please") is True
    assert read(oracle, "what is my balance", "pin reset please") is False
    assert read(oracle, "something else", "pin reset please") is None
    noisy = OracleReader(labels, error=0.2, seed=3)

    async def many() -> list[bool | None]:
        return [await noisy.read(ReadPair(asked="what is my balance", cached="pin reset please")) for _ in range(2000)]

    wrong = sum(1 for said in asyncio.run(many()) if said)
    assert 300 < wrong < 500  # about a fifth of 2,000
    with pytest.raises(ValueError):
        OracleReader(labels, error=1.5)


def test_the_entry_record_is_trusted_only_where_its_verdicts_were_measured() -> None:
    clean = PooledCounts({"record_ok:080": 120})
    assert rule_trusted(clean, VOUCH_RECORD, 80, POLICY) and rule_trusted(clean, VOUCH_RECORD, 60, POLICY)
    assert not rule_trusted(clean, VOUCH_RECORD, 81, POLICY)  # nothing measured above 0.80
    assert not rule_trusted(clean, VOUCH_READER, 80, POLICY)  # another rule's record is its own
    assert not rule_trusted(PooledCounts({"record_ok:080": 60}), VOUCH_RECORD, 80, POLICY)  # too few to tell
    assert not rule_trusted(PooledCounts({"record_ok:080": 120, "record_wrong:095": 2}), VOUCH_RECORD, 80, POLICY)
    counts = PooledCounts({"ok:070": 5, "reader_no_ok:071": 3, "reader_no_wrong:070": 4, "record_wrong:072": 1})
    assert counts.at_or_above(70) == (0, 5) and counts.vouched_at_or_above(VOUCH_RECORD, 70) == (1, 1)
    assert (counts.reader_no_ok, counts.reader_no_wrong) == (3, 4)


def read_pool(bin_: int, *, same: int, other: int, yes_on_same: float, yes_on_other: float) -> dict[str, int]:
    """The pool fields of a reader that read ``same`` + ``other`` candidates at one score bin
    (each also an observation of the pool), saying yes on the given shares."""
    b = f"{bin_:03d}"
    yes_same, yes_other = round(same * yes_on_same), round(other * yes_on_other)
    return {f"ok:{b}": same, f"wrong:{b}": other, f"reader_ok:{b}": yes_same, f"reader_no_ok:{b}": same - yes_same,
            f"reader_wrong:{b}": yes_other, f"reader_no_wrong:{b}": other - yes_other}


def test_a_readers_yes_is_trusted_as_far_as_its_record_and_its_rates_allow() -> None:
    # Right on every pair, 150 of them of another answer, where 30% of the candidates are wrong.
    perfect = PooledCounts(read_pool(75, same=350, other=150, yes_on_same=1.0, yes_on_other=0.0))
    assert reader_trusted(perfect, 75, POLICY) and reader_error_here(perfect, 75, POLICY) == 0.0
    assert not reader_trusted(perfect, 80, POLICY)  # nothing measured at 0.80 or above
    # The same reader after 30 pairs of the same answer: too few yes to tell.
    assert not reader_trusted(PooledCounts(read_pool(75, same=30, other=10, yes_on_same=1.0, yes_on_other=0.0)),
                              75, POLICY)
    # Right on 80% of pairs, measured mostly high up, where nearly every candidate is right:
    # trusted there ...
    noisy = read_pool(70, same=350, other=150, yes_on_same=0.8, yes_on_other=0.2) \
        | read_pool(90, same=20000, other=5, yes_on_same=0.8, yes_on_other=0.2)
    assert reader_trusted(PooledCounts(noisy), 90, POLICY)
    # ... but not at 0.70, where 30% of the candidates are wrong and its yes is wrong ~10% of the
    # time, though its yes at 0.70 or above is wrong 0.2% of the time.
    assert rule_trusted(PooledCounts(noisy), VOUCH_READER, 70, POLICY)
    assert not reader_trusted(PooledCounts(noisy), 70, POLICY)
    assert 0.05 < reader_error_here(PooledCounts(noisy), 70, POLICY) < 0.2
    assert not reader_trusted(PooledCounts({}), 70, POLICY)


class _Held:
    """A reader that holds every read until released."""

    name = "held"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def read(self, pair: ReadPair) -> bool | None:
        await self.release.wait()
        return True


def test_reads_after_the_response_are_bounded_and_fair_per_tenant() -> None:
    async def go() -> tuple[list[bool | None], list[tuple[str, str]], list[int]]:
        reader, verdicts, pending = _Held(), [], []
        queue = ReadQueue(reader, max_pending=8, per_tenant_share=0.25,
                          on_read=lambda name, verdict: verdicts.append((name, verdict)), on_pending=pending.append)
        pair = ReadPair(asked="a", cached="b")
        busy = [asyncio.create_task(queue.read("loud", pair)) for _ in range(2)]
        await asyncio.sleep(0)
        assert queue.pending == 2
        dropped = await queue.read("loud", pair)  # the loud tenant's share (2 of 8) is taken
        quiet = asyncio.create_task(queue.read("quiet", pair))  # another tenant still gets a slot
        await asyncio.sleep(0)
        assert queue.pending == 3
        reader.release.set()
        results = [dropped, *await asyncio.gather(*busy, quiet)]
        assert queue.pending == 0
        return results, verdicts, pending

    results, verdicts, pending = asyncio.run(go())
    assert results == [None, True, True, True]
    assert verdicts.count(("held", "dropped")) == 1 and verdicts.count(("held", "yes")) == 3
    assert pending[-1] == 0 and max(pending) == 3


@pytest.fixture(scope="module")
def judge_double() -> Iterator[dict[str, Any]]:
    """An OpenAI-compatible judge: yes when both questions end in the same word."""
    state: dict[str, Any] = {"asked": [], "delay": 0.0}

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> bytes:
        body = msgspec.json.decode(await request.body())
        state["asked"].append(body)
        await asyncio.sleep(state["delay"])
        cached, new = (line.split(": ", 1)[1] for line in body["messages"][1]["content"].splitlines()[:2])
        reply = "Yes." if cached.split()[-1] == new.split()[-1] else "no"
        return msgspec.json.encode({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                    "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": reply}}]})

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "judge-double", "object": "model", "owned_by": "tests"}]}

    with ServerThread(Litestar([chat, models])) as server:
        state["url"] = server.url + "/v1"
        yield state


def test_the_llm_judge_asks_the_endpoints_first_model_two_lines_and_reads_yes(judge_double: dict[str, Any]) -> None:
    judge = LLMJudge.on_endpoint(judge_double["url"], timeout_s=30.0)

    async def go() -> tuple[bool | None, bool | None, str]:
        yes = await judge.read(ReadPair(asked="how do I block my card", cached="please block my card"))
        no = await judge.read(ReadPair(asked="how do I block my card", cached="what is my balance"))
        await judge.close()
        return yes, no, judge.name

    yes, no, name = asyncio.run(go())
    assert (yes, no, name) == (True, False, "llm:judge-double")
    body = judge_double["asked"][-1]
    assert body["model"] == "judge-double" and body["max_tokens"] == 2 and body["temperature"] == 0.0
    assert body["messages"][1]["content"].splitlines()[:2] == ["Cached question: what is my balance",
                                                               "New question: how do I block my card"]


def test_a_judge_past_its_deadline_or_unreachable_gives_no_verdict(judge_double: dict[str, Any]) -> None:
    judge_double["delay"] = 2.0
    try:
        late = read(LLMJudge.on_endpoint(judge_double["url"], model="judge-double", timeout_s=0.2), "my card", "my card")
    finally:
        judge_double["delay"] = 0.0
    assert late is None
    assert read(LLMJudge.on_endpoint("http://127.0.0.1:1/v1", model="m", timeout_s=5.0), "my card", "my card") is None


def test_a_rule_wrong_too_often_everywhere_is_ignored_visibly() -> None:
    from app.cache.decision.stats import rule_figures

    assert rule_figures(PooledCounts({}), VOUCH_READER, POLICY).status == "measuring"
    ignored = rule_figures(PooledCounts({"reader_ok:070": 180, "reader_wrong:070": 20}), VOUCH_READER, POLICY)
    assert (ignored.status, ignored.vouched, ignored.wrong, ignored.trusted_from) == ("ignored", 200, 20, None)
    # Wrong only low in the band: trusted from above where it erred.
    split = rule_figures(PooledCounts(read_pool(65, same=20, other=20, yes_on_same=1.0, yes_on_other=1.0)
                                      | read_pool(90, same=300, other=200, yes_on_same=1.0, yes_on_other=0.0)),
                         VOUCH_READER, POLICY)
    assert split.status == "trusted" and split.trusted_from == 0.66
