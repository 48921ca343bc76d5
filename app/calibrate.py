"""Calibration of the semantic layer on labelled question pairs: evaluate, fit, train.

A pair ``(sentence1, sentence2, label)`` reads: ``sentence1`` is cached, ``sentence2`` arrives in
the same scope; label 1 means the cached answer is right for it. Every decision here is made by
:meth:`app.cache.verify.PairVerifier.verify`, the code path the service runs.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.cache.base import Verdict
from app.cache.keys import normalize_text
from app.cache.verify import FEATURE_NAMES, GUARD_FEATURES, VERIFIED, PairVerifier, TreeEnsemble, VerifierArtifact
from app.embed import Encoder
from app.judge import AnswerJudge
from app.policy import SemanticPolicy

REQUIRED_COLUMNS = ("sentence1", "sentence2", "label")


class PairsFileError(ValueError):
    """A pairs file that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Pair:
    cached: str
    asked: str
    label: int


def read_pairs(path: Path) -> list[Pair]:
    """Read a ``sentence1,sentence2,label`` CSV (UTF-8, byte-order mark allowed).

    Raises:
        PairsFileError: Unreadable, not UTF-8, missing columns, a label other than 0/1, or no rows.
    """
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise PairsFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PairsFileError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise PairsFileError(f"{path}: missing column(s) {', '.join(missing)}; the header must be sentence1,sentence2,label")
    pairs = []
    for line, row in enumerate(reader, start=2):
        label = (row["label"] or "").strip()
        if label not in ("0", "1"):
            raise PairsFileError(f"{path}:{line}: label must be 0 or 1, got {label!r}")
        cached, asked = (row["sentence1"] or "").strip(), (row["sentence2"] or "").strip()
        if not cached or not asked:
            raise PairsFileError(f"{path}:{line}: empty sentence")
        pairs.append(Pair(cached=cached, asked=asked, label=int(label)))
    if not pairs:
        raise PairsFileError(f"{path}: no pairs")
    return pairs


def write_pairs(pairs: Sequence[Pair], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUIRED_COLUMNS)
        for pair in pairs:
            writer.writerow([pair.cached, pair.asked, pair.label])


def _bucket(text: str) -> int:
    """A stable 0..99 bucket of a text: deterministic splits without a random generator."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100


def split_pairs(pairs: Sequence[Pair], held_out_percent: int) -> tuple[list[Pair], list[Pair]]:
    """(kept, held out), by a stable hash of the cached sentence, so a sentence stays on one side."""
    kept, held = [], []
    for pair in pairs:
        (held if _bucket(pair.cached) < held_out_percent else kept).append(pair)
    return kept, held


QQP_POOL_SIZE = 2000


def qqp_hard(path: Path, split: str, pool_size: int = QQP_POOL_SIZE) -> list[Pair]:
    """Quora duplicates with hard negatives, deterministically.

    The questions are split by a stable hash of their duplicate cluster (``train``: buckets 0-49,
    ``eval``: 50-99); pairs linked through a shared duplicate are one cluster. Within a split every
    positive pair ``(origin, similar)`` is kept. The split is cut into pools of ``pool_size`` pairs
    (ordered by cluster hash), and each origin is also paired with the lexically nearest
    ``similar`` (word TF-IDF) of another cluster in its pool: a hard negative.

    The pool size sets how hard the negatives are. Quora links only a fraction of its duplicates,
    so the larger the pool, the more often the "nearest question of another cluster" is itself an
    unlinked duplicate. Pools of 2,000 reproduce the cosine baselines of the shared data README
    (USE and all-MiniLM-L6-v2, docs/QUALITY.md); every origin row gets one negative, so an origin
    with several duplicates has its negative as often;
    ``pool_size=0`` searches the whole split (about 15,000 pairs), the harsher variant.

    Args:
        path: ``qqp_similar.json``.
        split: ``train`` or ``eval``.
        pool_size: Pairs per pool in which negatives are searched; 0 for the whole split.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    rows = json.loads(path.read_text(encoding="utf-8"))
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for row in rows:
        a, b = find(row["origin"]), find(row["similar"])
        if a != b:
            parent[max(a, b)] = min(a, b)
    wanted = range(50) if split == "train" else range(50, 100)
    chosen = [r for r in rows if _bucket(find(r["origin"])) in wanted]
    # Order by a full hash of the cluster: pools mix topics, and a cluster stays contiguous.
    chosen.sort(key=lambda r: hashlib.sha256(find(r["origin"]).encode("utf-8")).hexdigest())
    size = pool_size or len(chosen)
    pairs = [Pair(cached=r["origin"], asked=r["similar"], label=1) for r in chosen]
    for start in range(0, len(chosen), size):
        pool = chosen[start : start + size]
        origins, similars = [r["origin"] for r in pool], [r["similar"] for r in pool]
        clusters = np.array([find(o) for o in origins])
        vectorizer = TfidfVectorizer(lowercase=True, dtype=np.float32).fit(origins + similars)
        origin_matrix, similar_matrix = vectorizer.transform(origins), vectorizer.transform(similars)
        for block in range(0, len(pool), 1000):
            scores = (origin_matrix[block : block + 1000] @ similar_matrix.T).toarray()
            scores[clusters[block : block + 1000, None] == clusters[None, :]] = -1.0
            for offset, best in enumerate(scores.argmax(axis=1)):
                if scores[offset, best] >= 0.0:  # a pool of one cluster has no negative to offer
                    pairs.append(Pair(cached=origins[block + offset], asked=similars[best], label=0))
    return pairs


def similarities(pairs: Sequence[Pair], encoder: Encoder, batch: int = 128) -> np.ndarray:
    """Cosine similarity of each pair, embedding the normalised text as the service does."""
    texts = sorted({normalize_text(t) for p in pairs for t in (p.cached, p.asked)})
    index = {t: i for i, t in enumerate(texts)}
    vectors = np.concatenate([encoder.encode(texts[i : i + batch]) for i in range(0, len(texts), batch)])
    left = vectors[[index[normalize_text(p.cached)] for p in pairs]]
    right = vectors[[index[normalize_text(p.asked)] for p in pairs]]
    return np.einsum("ij,ij->i", left, right)


@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    hits: int
    positives: int
    pairs: int

    def line(self) -> str:
        return (f"precision={self.precision:.4f} recall={self.recall:.4f} hits={self.hits} "
                f"positives={self.positives} pairs={self.pairs}")


def score(decisions: np.ndarray, labels: np.ndarray) -> Score:
    hits = int(decisions.sum())
    true_hits = int((decisions & (labels == 1)).sum())
    positives = int((labels == 1).sum())
    return Score(
        precision=true_hits / hits if hits else 1.0,
        recall=true_hits / positives if positives else 0.0,
        hits=hits,
        positives=positives,
        pairs=len(labels),
    )


def verify_all(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier, policy: SemanticPolicy) -> list[Verdict]:
    """The verification stage's verdict for every pair, as the service would give it."""
    return [
        verifier.verify(normalize_text(pair.asked), normalize_text(pair.cached), float(similarity), policy)
        for pair, similarity in zip(pairs, sims, strict=True)
    ]


async def judge_all(pairs: Sequence[Pair], verdicts: list[Verdict], judge: AnswerJudge, model: str,
                    concurrency: int = 4) -> tuple[list[Verdict], list[float]]:
    """Put the LLM judge's verdict in place of every ``verifier_accepted`` one, as the service does.

    Returns:
        The verdicts, and the judge's latency in seconds for each call made.
    """
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    judged = list(verdicts)

    async def one(i: int) -> None:
        async with slots:
            started = time.perf_counter()
            judged[i] = await judge.confirm(normalize_text(pairs[i].asked), normalize_text(pairs[i].cached), model)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(i) for i, v in enumerate(verdicts) if v.reason == VERIFIED))
    return judged, latencies


def evaluate(pairs: Sequence[Pair], verdicts: Sequence[Verdict]) -> tuple[Score, dict[str, int]]:
    """Score the service's decisions; returns the score and the count of each reason."""
    decisions = np.array([v.accepted for v in verdicts], dtype=bool)
    reasons: dict[str, int] = {}
    for verdict in verdicts:
        reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
    return score(decisions, np.array([p.label for p in pairs])), reasons


# --- fitting -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairTable:
    """Everything a policy decision needs, precomputed per pair."""

    similarity: np.ndarray
    guard_ok: np.ndarray
    probability: np.ndarray
    label: np.ndarray


def tabulate(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier) -> PairTable:
    features = features_of(pairs, sims, verifier)
    # The last four features are the guard signals: a pair passes the guards when all are 0.
    guard_ok = ~features[:, -len(GUARD_FEATURES):].astype(bool).any(axis=1)
    probability = verifier.model.probability(features) if verifier.model else np.zeros(len(pairs))
    return PairTable(np.asarray(sims), guard_ok, probability, np.array([p.label for p in pairs]))


def decide(table: PairTable, policy: SemanticPolicy) -> np.ndarray:
    """Vectorised :meth:`PairVerifier.verify` over a table (tested to agree with it)."""
    gate = (table.similarity >= policy.threshold) & table.guard_ok
    return gate & ((table.similarity >= policy.accept_above) | (table.probability >= policy.min_probability))


def precision_lower_bound(true_hits: np.ndarray | int, hits: np.ndarray | int, z: float) -> np.ndarray:
    """Wilson score lower bound of precision, ``z`` standard errors below; 1.0 with no hits.

    A policy chosen for its point precision on a few hundred pairs is chosen partly for luck: the
    best of many grid points lands above its true precision. Asking the lower bound to reach the
    target leaves that margin (``z=0`` is the point precision).
    """
    k, n = np.asarray(true_hits, dtype=float), np.asarray(hits, dtype=float)
    safe = np.maximum(n, 1.0)
    p = k / safe
    centre = p + z * z / (2 * safe)
    spread = z * np.sqrt(p * (1 - p) / safe + z * z / (4 * safe * safe))
    return np.where(n > 0, (centre - spread) / (1 + z * z / safe), 1.0)


def fit(table: PairTable, target_precision: float, min_hits: int = 20,
        margin: float = 1.0) -> tuple[SemanticPolicy, Score] | None:
    """The policy with the highest recall whose precision reaches the target on the table.

    A policy counts only with at least ``min_hits`` hits, and only when the Wilson lower bound of
    its precision, ``margin`` standard errors down, reaches the target: a handful of lucky pairs
    does not pass for precision. Of policies with equal recall the one with the highest cosine
    threshold wins: fewer candidates reach the learned verifier.
    """
    best: tuple[SemanticPolicy, Score] | None = None
    thresholds = np.round(np.arange(0.98, 0.499, -0.02), 2)
    probabilities = np.round(np.concatenate([np.arange(0.5, 0.95, 0.05), np.arange(0.95, 1.0, 0.005)]), 3)
    for threshold in thresholds:
        # accept_above 1.0: only identical questions skip the learned verifier.
        for accept_above in (1.0, 0.995, 0.99, 0.98, 0.97):
            if accept_above < threshold:
                continue
            for min_probability in probabilities:
                policy = SemanticPolicy(threshold=float(threshold), accept_above=accept_above,
                                        min_probability=float(min_probability))
                decisions = decide(table, policy)
                result = score(decisions, table.label)
                true_hits = int((decisions & (table.label == 1)).sum())
                if result.hits < min_hits or precision_lower_bound(true_hits, result.hits, margin) < target_precision:
                    continue
                if best is None or result.recall > best[1].recall:
                    best = (policy, result)
    return best


def cosine_only_recall(table: PairTable, target_precision: float, min_hits: int = 20,
                       margin: float = 0.0) -> tuple[float, float | None]:
    """Recall of cosine alone at the target precision, and the threshold that gives it.

    ``margin`` as in :func:`fit`; 0 (point precision) makes this the best any threshold can do.
    """
    order = np.argsort(-table.similarity)
    labels = table.label[order]
    true_hits = np.cumsum(labels)
    hits = np.arange(1, len(labels) + 1)
    ok = np.where((precision_lower_bound(true_hits, hits, margin) >= target_precision) & (hits >= min_hits))[0]
    if not len(ok):
        return 0.0, None
    last = ok.max()
    return float(true_hits[last] / max(1, labels.sum())), float(table.similarity[order][last])


def plot(table: PairTable, policy: SemanticPolicy, output: Path, title: str, target_precision: float) -> None:
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


def features_of(pairs: Sequence[Pair], sims: np.ndarray, verifier: PairVerifier) -> np.ndarray:
    analyzer = verifier.analyzer
    return np.array([
        analyzer.features(normalize_text(p.asked), normalize_text(p.cached), float(s))
        for p, s in zip(pairs, sims, strict=True)
    ])


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
