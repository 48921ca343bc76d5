"""Training the learned verifier (scikit-learn, an optional extra) and exporting it as JSON trees."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.cache.decision.verify import FEATURE_NAMES, PairVerifier, TreeEnsemble, VerifierArtifact
from app.calibrate.fit import features_of
from app.calibrate.pairs import Pair

# --- training ------------------------------------------------------------------------------------


def export_trees(model: Any) -> TreeEnsemble:
    """A fitted sklearn HistGradientBoostingClassifier (binary) as a plain tree ensemble."""
    feature, threshold, left, right, value = [], [], [], [], []
    for (predictor,) in model._predictors:
        nodes = predictor.nodes
        feature.append([int(f) if not leaf else -1 for f, leaf in zip(nodes["feature_idx"], nodes["is_leaf"], strict=True)])
        threshold.append([float(t) for t in nodes["num_threshold"]])
        left.append([int(x) for x in nodes["left"]])
        right.append([int(x) for x in nodes["right"]])
        value.append([float(v) for v in nodes["value"]])
    baseline = float(np.asarray(model._baseline_prediction).ravel()[0])
    return TreeEnsemble(baseline=baseline, feature=feature, threshold=threshold, left=left, right=right, value=value)


def train(sources: dict[str, list[Pair]], sims: dict[str, np.ndarray], verifier: PairVerifier, command: str,
          data_files: dict[str, Path], embedder_name: str) -> VerifierArtifact:
    """Train the verifier on the given pairs; deterministic (fixed seed, no early stopping)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    matrix = np.concatenate([features_of(sources[name], sims[name], verifier) for name in sources])
    labels = np.concatenate([[p.label for p in sources[name]] for name in sources])
    model = HistGradientBoostingClassifier(
        max_iter=250, learning_rate=0.06, max_leaf_nodes=15, min_samples_leaf=40, l2_regularization=1.0,
        early_stopping=False, random_state=0,
    )
    model.fit(matrix, labels)
    ensemble = export_trees(model)
    sklearn_probability = model.predict_proba(matrix)[:, 1]
    exported = ensemble.probability(matrix)
    if not np.allclose(sklearn_probability, exported, atol=1e-9):
        raise RuntimeError("exported trees disagree with the trained model")
    rng = np.random.default_rng(0)
    sample = rng.choice(len(labels), size=min(40, len(labels)), replace=False)
    everything = [p for name in sources for p in sources[name]]
    checks = [{"cached": everything[i].cached, "asked": everything[i].asked,
               "similarity": float(matrix[i, 0]), "probability": float(exported[i])} for i in sorted(sample)]
    trained_on = {
        "command": command,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "model": "sklearn HistGradientBoostingClassifier, exported to JSON trees",
        "embedder": embedder_name,
        "data": {name: {"pairs": len(sources[name]), "positives": sum(p.label for p in sources[name]),
                        **({"file": data_files[name].name,
                            "sha256": hashlib.sha256(data_files[name].read_bytes()).hexdigest()}
                           if name in data_files else {})}
                 for name in sources},
    }
    return VerifierArtifact(features=list(FEATURE_NAMES), model=ensemble, trained_on=trained_on, checks=checks)
