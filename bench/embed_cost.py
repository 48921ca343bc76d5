"""What embedding one question costs by its length (the shipped USE multilingual int8 ONNX, one
thread), the reason for STRATA_SEMANTIC_MAX_QUESTION_CHARS.

    python -m bench.embed_cost
"""

from __future__ import annotations

import statistics
import time

from app.embed import load_encoder
from bench.run import machine

LENGTHS = (20, 200, 1_000, 2_000, 4_000, 16_000, 65_536)


def main() -> None:
    encoder = load_encoder("use-multilingual")
    encoder.encode(["warm-up"])
    print(f"embedding cost by question length ({machine()}; median of 3)")
    for language, unit in (("zh", "怎么申请退款，"), ("en", "how do I get a refund? ")):
        for length in LENGTHS:
            text = (unit * (length // len(unit) + 1))[:length]
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                encoder.encode([text])
                runs.append(time.perf_counter() - started)
            median = statistics.median(runs)
            print(f"{language} {length:6d} chars: {median * 1000:8.1f} ms ({median / length * 1e6:5.1f} us a character)")


if __name__ == "__main__":
    main()
