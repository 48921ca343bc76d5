"""The precision-recall picture of `strata calibrate fit` (matplotlib, an optional extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.calibrate.evaluate import score
from app.calibrate.fit import PairTable, decide
from app.policy import FixedSemantic


def plot(table: PairTable, policy: FixedSemantic, output: Path, title: str, target_precision: float) -> None:
    """Precision-recall curves: cosine alone, the verifier's probability past the guards at any
    cosine and under the policy's gate, the chosen policy and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def curve(scores: np.ndarray, eligible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(-np.where(eligible, scores, -np.inf))
        hits = eligible[order]
        labels = table.label[order] * hits
        true_hits = np.cumsum(labels)
        counted = np.cumsum(hits)
        keep = hits
        return (true_hits / max(1, table.label.sum()))[keep], (true_hits / np.maximum(counted, 1))[keep]

    figure, axis = plt.subplots(figsize=(7, 5), dpi=110)
    recall, precision = curve(table.similarity, np.ones(len(table.label), dtype=bool))
    axis.plot(recall, precision, label="cosine similarity alone")
    recall, precision = curve(table.probability, table.guard_ok)
    axis.plot(recall, precision, label="guards + verifier, any cosine")
    gate = (table.similarity >= policy.threshold) & table.guard_ok
    recall, precision = curve(table.probability, gate)
    axis.plot(recall, precision, label=f"guards + verifier, cosine >= {policy.threshold:.2f}")
    chosen = score(decide(table, policy), table.label)
    axis.scatter([chosen.recall], [chosen.precision], color="black", zorder=3,
                 label=f"chosen policy: P={chosen.precision:.3f} R={chosen.recall:.3f}")
    axis.axhline(target_precision, color="grey", linestyle=":", linewidth=1, label=f"target {target_precision}")
    axis.set(xlabel="recall (true paraphrases served)", ylabel="precision (hits that are right)",
             title=title, xlim=(0, 1), ylim=(0.3, 1.005))
    axis.legend(loc="lower left")
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)
    plt.close(figure)
