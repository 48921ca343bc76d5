"""What the guards turn down on a labelled replay stream, by guard and by whether the two
questions share a label (so would have been right to serve, in the stream's own terms).

    python -m bench.guard_effect --stream .run/replay/clinc3000.jsonl [--category faq]

Runs `strata replay run --simulate` in process and counts every time a guard fires on a
candidate (``CandidateCheck.guard``), with a few same-label examples per guard. A guard rejecting
same-label pairs is not necessarily wrong: the simulated upstream answers by label and ignores
the numbers a question names, a real one may not.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

from app.cache.decision.verify import CandidateCheck
from app.replay.simulate import run_simulated
from app.replay.streams import read_stream
from app.settings import Settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--category", default="faq")
    parser.add_argument("--examples", type=int, default=3)
    args = parser.parse_args()
    stream = read_stream(Path(args.stream))
    label = {request.text: request.label for request in stream}
    counts: Counter[tuple[str, bool]] = Counter()
    examples: dict[str, list[tuple[str, str]]] = defaultdict(list)
    guard = CandidateCheck.guard

    def counting(self: CandidateCheck, asked: str, cached: str) -> str | None:
        reason = guard(self, asked, cached)
        if reason is not None:
            same = label.get(asked) == label.get(cached)
            counts[(reason, same)] += 1
            if same and len(examples[reason]) < args.examples:
                examples[reason].append((asked, cached))
        return reason

    CandidateCheck.guard = counting  # type: ignore[method-assign]
    try:
        run_simulated(stream, settings=Settings.from_env(), category=args.category)
    finally:
        CandidateCheck.guard = guard  # type: ignore[method-assign]
    print(f"{args.stream}, category {args.category}: candidates the guards fired on")
    for reason in sorted({reason for reason, _ in counts}):
        print(f"  {reason:22s} same label {counts[(reason, True)]:5d}   other label {counts[(reason, False)]:5d}")
    for reason, pairs in sorted(examples.items()):
        for asked, cached in pairs:
            print(f"  e.g. {reason}: {asked!r} / {cached!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
