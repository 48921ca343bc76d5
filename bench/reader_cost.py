"""What one read of the second embedder costs (``STRATA_READER_EMBEDDER``): the latency of
``EmbedderReader.read`` with the cached question's vector already kept (a read embeds the new
question only), one read at a time, and its process CPU.

    python -m bench.reader_cost --model .run/models/embeddinggemma-300m [--threads 1 2] [--reads 100] [--int8]

``--int8`` also times torch's dynamic int8 quantisation of the model's linear layers, one at a
time and batched, and how far it moves the vectors (mean cosine to the fp32 ones).

A read after the response costs the asker nothing; on the request path (``reader: serve`` where
it is trusted) this is what a read lookup adds.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import time
from pathlib import Path

from app.cache.readers.base import ReadPair
from app.cache.readers.embedder import EmbedderReader, LocalModelVectors

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def questions(count: int) -> list[str]:
    with (SHARED / "clinc150.csv").open(encoding="utf-8-sig", newline="") as handle:
        texts = [row["text"] for row in csv.DictReader(handle) if row["split"] == "val"]
    return random.Random(0).sample(texts, count)


async def measure(reader: EmbedderReader, asked: list[str], cached: str) -> tuple[list[float], float]:
    await reader.read(ReadPair(asked="warm up", cached=cached))  # keeps the cached question's vector
    took, cpu = [], time.process_time()
    for text in asked:
        started = time.perf_counter()
        await reader.read(ReadPair(asked=text, cached=cached))
        took.append(time.perf_counter() - started)
    return sorted(took), (time.process_time() - cpu) / len(asked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".run/models/embeddinggemma-300m")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--reads", type=int, default=100)
    parser.add_argument("--int8", action="store_true", help="also time the dynamically quantised model")
    args = parser.parse_args()
    asked = questions(args.reads)
    print("| torch threads | reads | p50 ms | p99 ms | CPU ms a read |\n|---|---|---|---|---|")
    for threads in args.threads:
        source = LocalModelVectors(args.model, threads)
        took, cpu = asyncio.run(measure(EmbedderReader(source, 0.88), asked, "how do i reset my card pin"))
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))]
        print(f"| {threads} | {len(took)} | {took[len(took) // 2] * 1000:.1f} | {p99 * 1000:.1f} | {cpu * 1000:.1f} |")
        if args.int8 and threads == args.threads[-1]:
            quantised(source, asked)
        asyncio.run(source.close())


def quantised(source: LocalModelVectors, asked: list[str]) -> None:
    import numpy as np
    import torch

    def timed(batch: int) -> tuple[float, np.ndarray]:
        started = time.perf_counter()
        rows = np.concatenate([source.encode(asked[i:i + batch]) for i in range(0, len(asked), batch)])
        return (time.perf_counter() - started) / len(asked), rows

    fp32_one, fp32 = timed(1)
    fp32_batched, _ = timed(32)
    model = source._model  # the bench swaps the model in place; the service never does
    source._model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    int8_one, int8 = timed(1)
    int8_batched, _ = timed(32)
    source._model = model
    agreement = float(np.mean(np.sum(fp32 * int8, axis=1)))
    print(f"\nms a text, one at a time / in batches of 32: fp32 {fp32_one * 1000:.1f} / {fp32_batched * 1000:.1f}, "
          f"dynamic int8 {int8_one * 1000:.1f} / {int8_batched * 1000:.1f}; mean cosine int8 to fp32 {agreement:.3f}")


if __name__ == "__main__":
    main()
