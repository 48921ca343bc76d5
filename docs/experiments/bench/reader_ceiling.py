"""How far a reader could take a stream at all: the oracle trusted from the first request.

    python -m bench.reader_ceiling --stream .run/replay/clinc3000-s0.jsonl [--category faq]

Issue #33's oracle targets (CLINC150 >= 50%, its bank domain >= 55%, the Chinese set >= 35%
semantically) ask how much a perfect reader adds. Under the shipped rule a reader serves only
where its verdicts were measured (docs/QUALITY.md), so the first ~1,000 requests of a cold stream
go without it. This bench removes that delay and nothing else: the oracle (the stream's labels)
is asked on the request path for every candidate the category's evidence refused, as if already
trusted everywhere, in an otherwise unchanged simulated replay (``strata replay run --simulate``).
Its reach is therefore the ceiling of any rule of trust over the candidates Strata finds (the
nearest answer the guards let through, one read per lookup). It is not a mode of the service:
the trust check is replaced in this process only.

It also prints the stream's hindsight ceiling: the share of requests neither an exact repeat of
an earlier wording nor the first asking of their label, which is what a perfect semantic layer
would serve.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from app.cache.decision import rules
from app.cache.readers.oracle import OracleReader
from app.cache.storage.keys import normalize_text
from app.replay.simulate import run_simulated
from app.replay.streams import read_stream
from app.settings import Settings


def hindsight(stream: list[Any]) -> tuple[float, float]:
    """(exact repeats, what a perfect semantic layer serves) as shares of the stream."""
    wordings: set[str] = set()
    labels: set[str] = set()
    exact = semantic = 0
    for request in stream:
        text = normalize_text(request.text)
        if text in wordings:
            exact += 1
        elif request.label in labels:
            semantic += 1
        wordings.add(text)
        labels.add(request.label)
    return exact / len(stream), semantic / len(stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", type=Path, required=True)
    parser.add_argument("--category", default="faq")
    args = parser.parse_args()
    stream = list(read_stream(args.stream))
    exact_share, semantic_ceiling = hindsight(stream)
    oracle = OracleReader({normalize_text(r.text): r.label for r in stream})
    measured = rules.reader_trusted
    rules.reader_trusted = lambda counts, bin_, policy: True  # the one change: no measuring first
    try:
        report = run_simulated(stream, settings=Settings.from_env(), category=args.category, reader=oracle)
    finally:
        rules.reader_trusted = measured
    total = len(report.outcomes)
    semantic, wrong = report.count("semantic-hit"), report.wrong("semantic-hit")
    reader = report.semantic_by_verdict().get("reader_accepted", (0, 0))
    windows = ", ".join(f"{row['semantic']:.1%}" for row in report.windows(500))
    print(f"{args.stream}: {total} requests; hindsight: exact repeats {exact_share:.1%}, "
          f"a perfect semantic layer {semantic_ceiling:.1%}")
    print(f"oracle trusted from the start: semantic {semantic / total:.1%} ({semantic}, {wrong} wrong), "
          f"exact {report.count('exact-hit') / total:.1%}, the reader's hits {reader[0]} ({reader[1]} wrong); "
          f"windows of 500: {windows}")


if __name__ == "__main__":
    main()
