"""A second embedder as the grey zone's reader (``STRATA_READER_EMBEDDER``): it re-scores a
candidate pair USE's evidence refused, and says yes at or above its own threshold.

Two sources of vectors behind one small contract:
    a sentence-transformers folder (``make reader-model``: EmbeddingGemma-300M in
    ``.run/models/embeddinggemma-300m``), run in a thread of its own so the event loop never
    waits on it, with the model's sentence-similarity prompt when it names one;
    the URL of an OpenAI-compatible ``/v1/embeddings`` endpoint (TEI, vLLM, a hosted one).

The cached question's vector is kept in memory (an LRU by text), so a read embeds the new question
only. Its yes is not trusted for what the threshold says: like every reader's, it serves only at
scores where the tenant's pool has measured it (app/cache/decision/adaptive.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import openai

from app.cache.readers.base import ReadPair, first_model
from app.cache.readers.onnx_vectors import OnnxModelVectors, is_onnx_folder
from app.embed import BatchingEmbedder

logger = logging.getLogger("strata.readers")

# The prompt names sentence-transformers models use for symmetric similarity, first found wins
# (EmbeddingGemma: "task: sentence similarity | query: ").
SIMILARITY_PROMPTS = ("STS", "PairClassification", "query")
# What an intent head reads (STRATA_INTENT_EMBEDDER): the model's classification prompt if it has
# one (EmbeddingGemma: "task: classification | query: "), else none.
INTENT_PROMPTS = ("Classification",)


class VectorSource(Protocol):
    """Texts in, L2-normalised float32 rows out, without blocking the event loop."""

    name: str
    # ``name:dims`` where the dimension is known before a call, else the name: what a head fitted
    # on these vectors records.
    fingerprint: str

    async def vectors(self, texts: Sequence[str]) -> np.ndarray: ...

    async def close(self) -> None: ...


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    unit: np.ndarray = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    return unit


class LocalModelVectors:
    """A sentence-transformers folder, on one thread of its own (``threads`` torch threads).

    Args:
        path: The model's folder (loaded offline: nothing is fetched).
        threads: torch threads it may use.
    """

    def __init__(self, path: str, threads: int = 2, prompts: Sequence[str] = SIMILARITY_PROMPTS) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(1, threads))
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"no model folder at {path} (make reader-model assembles EmbeddingGemma there)")
        self._model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
        known = getattr(self._model, "prompts", {}) or {}
        self._prompt = next((name for name in prompts if name in known), None)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-reader-embed")
        self.name = f"embedder:{folder.name}"
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dims = int(dimension() or 0)
        self.fingerprint = f"{self.name}:{self._prompt or 'no-prompt'}:{self.dims}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous encoding (the replay's tools and the thread below)."""
        rows = self._model.encode(list(texts), prompt_name=self._prompt, batch_size=32, convert_to_numpy=True,
                                  show_progress_bar=False)
        return _unit_rows(rows)

    async def vectors(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.encode, list(texts))

    async def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


class EndpointVectors:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint.

    Args:
        url: Its base URL (``http://127.0.0.1:8003/v1``).
        model: The model to ask; empty: the endpoint's first (``GET /v1/models``, once).
        timeout_s: Seconds a call may take.
        api_key: Sent as a bearer token.
    """

    def __init__(self, url: str, model: str = "", timeout_s: float = 5.0, api_key: str = "") -> None:
        self._client = openai.AsyncOpenAI(base_url=url, api_key=api_key or "unused", max_retries=0, timeout=timeout_s)
        self._model = model
        self._resolving = asyncio.Lock()
        self.name = f"embedder:{model or url}"
        self.fingerprint = self.name

    async def _model_name(self) -> str:
        async with self._resolving:
            if not self._model:
                self._model = await first_model(self._client, "reader's embeddings")
        return self._model

    async def vectors(self, texts: Sequence[str]) -> np.ndarray:
        reply = await self._client.embeddings.create(model=await self._model_name(), input=list(texts))
        return _unit_rows(np.array([row.embedding for row in sorted(reply.data, key=lambda row: row.index)]))

    async def close(self) -> None:
        await self._client.close()


class BatchedVectors:
    """A local model behind Strata's batching queue (app/embed.py): concurrent callers' texts go
    to the model together, on its one worker thread, so a category whose every question is read
    twice (an intent head's second embedder) is not served one question at a time.

    Args:
        model: The local model.
        max_batch: Texts one batch takes.
        max_pending: Texts waiting before a read fails at once (a cache failure: a miss).
    """

    def __init__(self, model: LocalModelVectors | OnnxModelVectors, max_batch: int = 32, max_pending: int = 512) -> None:
        self._queue = BatchingEmbedder(model, max_batch=max_batch, max_pending=max_pending)
        self.name = model.name
        self.fingerprint = model.fingerprint

    async def vectors(self, texts: Sequence[str]) -> np.ndarray:
        return await self._queue.embed(texts)

    async def close(self) -> None:
        self._queue.close()


def vector_source(spec: str, threads: int = 2, timeout_s: float = 5.0, api_key: str = "", model: str = "",
                  prompts: Sequence[str] = SIMILARITY_PROMPTS) -> VectorSource:
    """``STRATA_READER_EMBEDDER`` (or ``STRATA_INTENT_EMBEDDER``): an ``http(s)://`` URL is an
    embeddings endpoint, a folder ``strata intents export-reader`` wrote an ONNX encoder, anything
    else a sentence-transformers folder (its first prompt of ``prompts`` that it names)."""
    if spec.startswith(("http://", "https://")):
        return EndpointVectors(spec, model, timeout_s, api_key)
    if is_onnx_folder(spec):  # `strata intents export-reader`: no torch at run time
        return OnnxModelVectors(spec, threads)
    return LocalModelVectors(spec, threads, prompts)


class EmbedderReader:
    """Says yes when the second embedder's cosine of the two questions reaches ``threshold``.

    Args:
        source: Where the vectors come from.
        threshold: The cosine at or above which it says yes.
        remembered: Cached questions whose vectors are kept in memory.
    """

    def __init__(self, source: VectorSource, threshold: float, remembered: int = 8192) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ValueError("the reader embedder's threshold is a cosine, from -1 to 1")
        self._source = source
        self.threshold = threshold
        self._remembered = remembered
        self._cached: OrderedDict[str, np.ndarray] = OrderedDict()
        self.name = source.name

    async def score(self, asked: str, cached: str) -> float:
        """The two questions' cosine under this embedder."""
        known = self._cached.get(cached)
        if known is None:
            rows = await self._source.vectors([asked, cached])
            new, known = rows[0], rows[1]
            self._cached[cached] = known
            if len(self._cached) > self._remembered:
                self._cached.popitem(last=False)
        else:
            self._cached.move_to_end(cached)
            new = (await self._source.vectors([asked]))[0]
        return float(np.dot(new, known))

    async def read(self, pair: ReadPair) -> bool | None:
        try:
            similarity = await self.score(pair.asked, pair.cached)
        except (openai.OpenAIError, LookupError, TimeoutError, RuntimeError) as exc:
            logger.warning("reader %s gave no verdict: %r", self.name, exc)
            return None
        return similarity >= self.threshold

    async def close(self) -> None:
        await self._source.close()
