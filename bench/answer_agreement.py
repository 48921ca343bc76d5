"""Does the model answer paraphrases alike? What the adaptive semantic layer can learn from it.

    python -m bench.answer_agreement [--url http://127.0.0.1:8000/v1] [--intents 30] [--per-intent 3]

The adaptive layer learns from answered misses: the fresh answer is compared with the cached
candidate's (``AnswerLearner.equivalents``: equal once normalised, or the same numbers and either
most content words shared or embeddings at least ``answer_threshold`` alike). That signal exists
only if the model gives paraphrases of one question equivalent answers and other questions
different ones. This asks the model (the ``make up`` vLLM, the bank system prompt of ``make
bench-replay``, temperature 0, 256 tokens at most) a few CLINC150 utterances of each of the first
intents by name (the replay's bank bot), and reports, with the shipped ``faq`` policy, how many
pairs of answers to one intent are equivalent and how many pairs of different intents are.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import random
import sys
from collections import defaultdict
from pathlib import Path

import httpx
import msgspec
import numpy as np
from redis.asyncio import Redis

from app.cache.decision.verify import load_verifier
from app.cache.learning.learner import AnswerLearner
from app.cache.storage.keys import normalize_text
from app.embed import BatchingEmbedder, load_encoder
from app.policy import Policy
from app.settings import Settings
from bench.replay_vllm import SHARED, system_prompt

ROOT = Path(__file__).resolve().parent.parent


def utterances(path: Path, intents: int, per_intent: int, seed: int) -> list[tuple[str, str]]:
    """(intent, text) for ``per_intent`` utterances of each of the first ``intents`` intents by name."""
    groups: dict[str, list[str]] = defaultdict(list)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["intent"] != "oos":
                groups[row["intent"]].append(normalize_text(row["text"]))
    pick = random.Random(seed)
    return [(name, text) for name in sorted(groups)[:intents]
            for text in pick.sample(sorted(set(groups[name])), per_intent)]


async def answers(url: str, questions: list[str], concurrency: int) -> list[bytes]:
    """The model's completions (OpenAI JSON) for each question, in order."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        model = (await client.get("/models")).json()["data"][0]["id"]
        prompt = system_prompt("agreement")
        gate = asyncio.Semaphore(concurrency)

        async def ask(question: str) -> bytes:
            async with gate:
                response = await client.post("/chat/completions", json={
                    "model": model, "temperature": 0, "max_tokens": 256,
                    "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": question}]})
                response.raise_for_status()
                return response.content

        return list(await asyncio.gather(*(ask(q) for q in questions)))


async def agreement(rows: list[tuple[str, str]], completions: list[bytes], settings: Settings) -> None:
    policy = Policy.load(settings.resolve(settings.policy_file)).categories["faq"].semantic
    encoder = load_encoder(settings.semantic.embedder, settings.semantic.embedder_model)
    # As the service builds it; comparing answers makes no Redis call.
    learner = AnswerLearner(Redis(), BatchingEmbedder(encoder), analyzer=load_verifier(settings).analyzer)
    same, other = [], []
    for i, j in itertools.combinations(range(len(rows)), 2):
        verdict = (await learner.equivalents(completions[i], [completions[j]], policy))[0]
        (same if rows[i][0] == rows[j][0] else other).append(verdict)
    texts = [msgspec.json.decode(c)["choices"][0]["message"]["content"] for c in completions]
    vectors = encoder.encode(texts)
    cosines_same = [float(vectors[i] @ vectors[j]) for i, j in itertools.combinations(range(len(rows)), 2)
                    if rows[i][0] == rows[j][0]]
    cosines_other = [float(vectors[i] @ vectors[j]) for i, j in itertools.combinations(range(len(rows)), 2)
                     if rows[i][0] != rows[j][0]]
    print(f"{len(rows)} answers, {len({r[0] for r in rows})} intents; faq policy: answer_threshold "
          f"{policy.answer_threshold}, answer_overlap {policy.answer_overlap}")
    print(f"  pairs of one intent judged equivalent:        {sum(same):5d} of {len(same):6d} ({np.mean(same):.1%})")
    print(f"  pairs of different intents judged equivalent: {sum(other):5d} of {len(other):6d} ({np.mean(other):.2%})")
    print(f"  answer cosine, one intent: median {np.median(cosines_same):.3f}, p90 {np.percentile(cosines_same, 90):.3f}; "
          f"different intents: median {np.median(cosines_other):.3f}, p99 {np.percentile(cosines_other, 99):.3f}")
    for i in range(min(len(rows), 6)):
        print(f"  [{rows[i][0]}] {rows[i][1]!r} -> {texts[i][:160]!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the model server (OpenAI API)")
    parser.add_argument("--intents", type=int, default=30)
    parser.add_argument("--per-intent", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = utterances(SHARED / "clinc150.csv", args.intents, args.per_intent, args.seed)
    completions = asyncio.run(answers(args.url, [text for _, text in rows], args.concurrency))
    asyncio.run(agreement(rows, completions, Settings.from_env()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
