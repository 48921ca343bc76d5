"""QQP with hard negatives, built deterministically from the shared Quora duplicates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from app.calibrate.pairs import QQP_POOL_SIZE, Clusters, Pair, stable_bucket


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
    clusters = Clusters()
    for row in rows:
        clusters.link(row["origin"], row["similar"])
    find = clusters.find
    wanted = range(50) if split == "train" else range(50, 100)
    chosen = [r for r in rows if stable_bucket(find(r["origin"])) in wanted]
    # Order by a full hash of the cluster: pools mix topics, and a cluster stays contiguous.
    chosen.sort(key=lambda r: hashlib.sha256(find(r["origin"]).encode("utf-8")).hexdigest())
    size = pool_size or len(chosen)
    pairs = [Pair(cached=r["origin"], asked=r["similar"], label=1) for r in chosen]
    for start in range(0, len(chosen), size):
        pool = chosen[start : start + size]
        origins, similars = [r["origin"] for r in pool], [r["similar"] for r in pool]
        labels = np.array([find(o) for o in origins])
        vectorizer = TfidfVectorizer(lowercase=True, dtype=np.float32).fit(origins + similars)
        origin_matrix, similar_matrix = vectorizer.transform(origins), vectorizer.transform(similars)
        for block in range(0, len(pool), 1000):
            scores = (origin_matrix[block : block + 1000] @ similar_matrix.T).toarray()
            scores[labels[block : block + 1000, None] == labels[None, :]] = -1.0
            for offset, best in enumerate(scores.argmax(axis=1)):
                if scores[offset, best] >= 0.0:  # a pool of one cluster has no negative to offer
                    pairs.append(Pair(cached=origins[block + offset], asked=similars[best], label=0))
    return pairs
