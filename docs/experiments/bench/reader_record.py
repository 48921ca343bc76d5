"""What a reader said in a simulated replay, joined with the stream's labels.

    python -m bench.reader_record --stream .run/replay/clinc3000.jsonl [--category faq] [--policy P]

Replays the stream as ``strata replay run --simulate`` does, with the configured reader
(``STRATA_READER_EMBEDDER`` or ``STRATA_JUDGE_URL``) wrapped so that every pair it reads is kept,
and prints, per band of USE's similarity: pairs read, how many had one label (right), its yes and
how many of them were wrong, its no and how many of them were right; and, for the second
embedder, the same at other thresholds of its cosine (what its threshold would give here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from app.assembly import configured_reader
from app.cache.readers.base import ReadPair
from app.cache.readers.embedder import EmbedderReader
from app.cache.storage.keys import normalize_text
from app.replay.simulate import run_simulated
from app.replay.streams import read_stream
from app.settings import Settings


class Recording:
    """A reader that keeps what it was asked and what the reader under it said."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.name = reader.name
        self.reads: list[tuple[ReadPair, bool | None, float | None]] = []
        self.seconds: list[float] = []  # each read's time

    async def read(self, pair: ReadPair) -> bool | None:
        started = time.perf_counter()
        score = await self._reader.score(pair.asked, pair.cached) if isinstance(self._reader, EmbedderReader) else None
        said = (score >= self._reader.threshold) if score is not None else await self._reader.read(pair)
        self.seconds.append(time.perf_counter() - started)
        self.reads.append((pair, said, score))
        return said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", type=Path, required=True)
    parser.add_argument("--category", default="faq")
    parser.add_argument("--policy", default="")
    args = parser.parse_args()
    settings = Settings.from_env()
    if args.policy:
        settings = msgspec.structs.replace(settings, policy_file=args.policy)
    reader = configured_reader(settings.semantic)
    if reader is None:
        raise SystemExit("no reader configured (STRATA_READER_EMBEDDER or STRATA_JUDGE_URL)")
    recording = Recording(reader)
    stream = read_stream(args.stream)
    labels = {normalize_text(r.text): r.label for r in stream}
    report = run_simulated(stream, settings=settings, category=args.category, reader=recording)
    semantic, wrong = report.count("semantic-hit"), report.wrong("semantic-hit")
    print(f"{args.stream}: semantic {semantic / len(stream):.1%} ({semantic}, {wrong} wrong), "
          f"reader {recording.name}, {len(recording.reads)} reads "
          f"({1000 * len(recording.reads) / len(stream):.0f} per 1,000 requests)")
    if recording.seconds:
        cuts = statistics.quantiles(recording.seconds, n=20) if len(recording.seconds) > 1 else recording.seconds * 19
        print(f"read time: p50 {statistics.median(recording.seconds):.3f} s, p95 {cuts[18]:.3f} s, "
              f"max {max(recording.seconds):.3f} s")
    print("semantic hits by verdict (served, wrong):", report.semantic_by_verdict())
    print("per window of 1,000:", ", ".join(f"{w['requests']} {w['semantic']:.1%} ({w['semantic_wrong']:.2%} wrong)"
                                            for w in report.windows(1000)))
    print("| USE similarity | read | right | yes | yes wrong | no | no right | no verdict |\n|---|---|---|---|---|---|---|---|")
    bands = [(0.0, 0.75), (0.75, 0.80), (0.80, 0.85), (0.85, 0.90), (0.90, 1.01)]
    for low, high in bands:
        rows = [(labels.get(normalize_text(p.asked)) == labels.get(normalize_text(p.cached)), said)
                for p, said, _ in recording.reads if low <= p.similarity < high]
        yes = [right for right, said in rows if said is True]
        no = [right for right, said in rows if said is False]
        print(f"| {low:.2f}-{min(high, 1.0):.2f} | {len(rows)} | {sum(r for r, _ in rows)} | {len(yes)} | "
              f"{len(yes) - sum(yes)} | {len(no)} | {sum(no)} | {sum(1 for _, s in rows if s is None)} |")
    scored = [(labels.get(normalize_text(p.asked)) == labels.get(normalize_text(p.cached)), score)
              for p, _, score in recording.reads if score is not None]
    if scored:
        print("\n| its cosine at least | yes | wrong | precision | recall |\n|---|---|---|---|---|")
        positives = sum(right for right, _ in scored)
        for threshold in (0.80, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96):
            yes = [right for right, score in scored if score >= threshold]
            if yes:
                print(f"| {threshold:.2f} | {len(yes)} | {len(yes) - sum(yes)} | {sum(yes) / len(yes):.3f} | "
                      f"{sum(yes) / max(1, positives):.3f} |")


if __name__ == "__main__":
    main()
