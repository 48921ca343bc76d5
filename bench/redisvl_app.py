"""The comparison arm of the hit-path A/B (issue #32): a plain redisvl application, an
exact-then-semantic LLM cache in front of the same upstream, as a team would write it from
redisvl's documentation. Same web framework and server as Strata (Litestar on uvicorn, uvloop,
httptools, one worker), same embedder (USE multilingual int8 ONNX), same Redis Stack.

Two exact layers, chosen by ``--exact``:

- ``embeddings`` (redisvl's own layers): the vectorizer carries redisvl's ``EmbeddingsCache``, so a
  repeated prompt's vector is read from Redis instead of computed, then ``SemanticCache.acheck``
  runs the KNN; what redisvl's docs compose.
- ``get``: a hand-written ``GET`` of sha256(model, messages) before redisvl's ``SemanticCache``;
  the fastest exact path a plain application has.

On a miss it calls the upstream with the ``openai`` client and stores the answer in both layers.

    python -m bench.redisvl_app PORT REDIS_URL UPSTREAM_URL [--exact get|embeddings]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from typing import Any

import numpy as np
import uvicorn
from litestar import Litestar, Response, get, post
from openai import AsyncOpenAI
from redis.asyncio import Redis
from redisvl.extensions.cache.embeddings import EmbeddingsCache
from redisvl.extensions.cache.llm import SemanticCache
from redisvl.utils.vectorize import CustomVectorizer

from app.embed import load_encoder

# Cosine distance 0.12 is similarity 0.88, Strata's verified category's threshold.
DISTANCE_THRESHOLD = 0.12


def build(redis_url: str, upstream_url: str, exact: str) -> Litestar:
    encoder = load_encoder("use-multilingual", "")
    redis = Redis.from_url(redis_url)
    client = AsyncOpenAI(base_url=upstream_url, api_key="unused")

    def embed(text: str) -> list[float]:
        return [float(x) for x in encoder.encode([text])[0]]

    async def aembed(text: str) -> list[float]:
        return await asyncio.to_thread(embed, text)

    vectorizer = CustomVectorizer(embed=embed, aembed=aembed,
                                  cache=EmbeddingsCache(name="baseline-embeddings", redis_url=redis_url)
                                  if exact == "embeddings" else None)
    cache = SemanticCache(name="baseline-llmcache", distance_threshold=DISTANCE_THRESHOLD, vectorizer=vectorizer,
                          redis_url=redis_url, overwrite=True)

    def completion(model: str, content: str) -> dict[str, Any]:
        return {"id": "chatcmpl-baseline", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}

    @post("/v1/chat/completions", status_code=200)
    async def chat(data: dict[str, Any]) -> Response[dict[str, Any]]:
        model, messages = data["model"], data["messages"]
        prompt = messages[-1]["content"]
        key = "baseline-exact:" + hashlib.sha256(json.dumps([model, messages], sort_keys=True).encode()).hexdigest()
        if exact == "get":
            stored = await redis.get(key)
            if stored is not None:
                return Response(completion(model, stored.decode()), headers={"X-Cache": "exact-hit"})
        vector = await vectorizer.aembed(prompt)
        found = await cache.acheck(vector=vector, num_results=1)
        if found:
            layer = "exact-hit" if float(found[0].get("vector_distance", 1.0)) < 1e-6 else "semantic-hit"
            return Response(completion(model, found[0]["response"]), headers={"X-Cache": layer})
        answered = await client.chat.completions.create(model=model, messages=messages)
        content = answered.choices[0].message.content or ""
        await cache.astore(prompt=prompt, response=content, vector=vector)
        if exact == "get":
            await redis.set(key, content)
        return Response(completion(model, content), headers={"X-Cache": "miss"})

    @get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    np.random.seed(0)
    return Litestar([chat, health])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("redis_url")
    parser.add_argument("upstream_url")
    parser.add_argument("--exact", choices=("get", "embeddings"), default="get")
    args = parser.parse_args()
    uvicorn.run(build(args.redis_url, args.upstream_url, args.exact), host="127.0.0.1", port=args.port,
                log_level="warning", loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
