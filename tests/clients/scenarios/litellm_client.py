"""LiteLLM as a client of Strata: completion, streaming with its chunk builder, error classes."""

from __future__ import annotations

import litellm
from common import DIRECT, MODEL, STRATA, cases, clean, done, twice

litellm.suppress_debug_info = True


def call(base: str, text: str, **extra: object) -> dict:
    response = litellm.completion(model=f"openai/{MODEL}", api_base=base + "/v1", api_key="sk-test",
                                  messages=[{"role": "user", "content": text}], num_retries=0, **extra)
    dumped = response.model_dump()
    return {"choices": dumped["choices"], "usage": dumped.get("usage"), "model": dumped.get("model")}


def streamed(base: str, text: str, **extra: object) -> dict:
    chunks = list(litellm.completion(model=f"openai/{MODEL}", api_base=base + "/v1", api_key="sk-test",
                                     messages=[{"role": "user", "content": text}], stream=True, num_retries=0, **extra))
    built = litellm.stream_chunk_builder(chunks).model_dump()
    return {"choices": built["choices"], "usage": built.get("usage")}


named = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
twice("completion", lambda: (call(STRATA, "What is the capital of France?"), None),
      direct=lambda: call(DIRECT, "What is the capital of France?"))
twice("streaming", lambda: (streamed(STRATA, "Tell me about Lyon."), None), direct=lambda: streamed(DIRECT, "Tell me about Lyon."))
twice("streaming_tool_call", lambda: (streamed(STRATA, "Weather in Oslo?", **named), None),
      direct=lambda: streamed(DIRECT, "Weather in Oslo?", **named))


def error_of(base: str, model: str, key: str = "sk-test") -> dict:
    try:
        litellm.completion(model=f"openai/{model}", api_base=base + "/v1", api_key=key,
                           messages=[{"role": "user", "content": "hello"}], num_retries=0)
    except Exception as exc:  # the class is the result
        return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None)}
    return {"class": None}


for model in ("missing-model", "limited-model", "broken-model", "refused-model", "locked-model"):
    cases[f"error_{model}"] = {"hit": clean(error_of(STRATA, model)), "direct": clean(error_of(DIRECT, model))}
done()
