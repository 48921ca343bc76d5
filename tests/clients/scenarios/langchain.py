"""langchain-openai's ChatOpenAI against Strata: invoke, stream, structured output, tools, usage."""

from __future__ import annotations

from common import DIRECT, MODEL, STRATA, done, twice
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel


class Capital(BaseModel):
    city: str
    country: str


@tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    return f"sunny in {city}"


def model(base: str, **extra: object) -> ChatOpenAI:
    return ChatOpenAI(base_url=base + "/v1", api_key="sk-test", model=MODEL, max_retries=0, **extra)


def message(value: object) -> dict:
    dumped = value.model_dump() if hasattr(value, "model_dump") else dict(value)  # type: ignore[attr-defined]
    return {k: dumped.get(k) for k in ("content", "tool_calls", "usage_metadata", "response_metadata",
                                       "additional_kwargs", "invalid_tool_calls") if k in dumped}


def metadata_kept(found: dict) -> dict:
    meta = dict(found.get("response_metadata") or {})
    meta.pop("id", None)
    meta.pop("system_fingerprint", None)
    found["response_metadata"] = meta
    return found


def invoked(base: str, text: str, **extra: object) -> dict:
    return metadata_kept(message(model(base, **extra).invoke(text)))


def streamed(base: str, text: str, **extra: object) -> dict:
    total = None
    for chunk in model(base, **extra).stream(text):
        total = chunk if total is None else total + chunk
    return metadata_kept(message(total))


def cache_of(case: str) -> str | None:
    return None  # LangChain hides response headers; hits are told apart in the upstream's call count


twice("invoke", lambda: (invoked(STRATA, "What is the capital of France?"), None),
      direct=lambda: invoked(DIRECT, "What is the capital of France?"))
twice("stream", lambda: (streamed(STRATA, "Tell me about Lyon."), None), direct=lambda: streamed(DIRECT, "Tell me about Lyon."))
twice("stream_usage", lambda: (streamed(STRATA, "Tell me about Nice.", stream_usage=True), None),
      direct=lambda: streamed(DIRECT, "Tell me about Nice.", stream_usage=True))


def structured(base: str, text: str, method: str, *, stream: bool = False) -> dict:
    runnable = model(base).with_structured_output(Capital, method=method)
    if stream:
        chunks = list(runnable.stream(text))
        return chunks[-1].model_dump() if chunks else {}
    return runnable.invoke(text).model_dump()


for method in ("json_schema", "function_calling"):
    twice(f"structured_{method}", lambda m=method: (structured(STRATA, "Capital of Spain?", m), None),
          direct=lambda m=method: structured(DIRECT, "Capital of Spain?", m))
    twice(f"structured_{method}_stream", lambda m=method: (structured(STRATA, "Capital of Peru?", m, stream=True), None),
          direct=lambda m=method: structured(DIRECT, "Capital of Peru?", m, stream=True))


def tools(base: str, text: str, *, stream: bool = False) -> dict:
    bound = model(base).bind_tools([get_weather])
    if stream:
        total = None
        for chunk in bound.stream(text):
            total = chunk if total is None else total + chunk
        return metadata_kept(message(total))
    return metadata_kept(message(bound.invoke(text)))


twice("bind_tools", lambda: (tools(STRATA, "Weather in Oslo?"), None), direct=lambda: tools(DIRECT, "Weather in Oslo?"))
twice("bind_tools_stream", lambda: (tools(STRATA, "Weather in Bern?", stream=True), None),
      direct=lambda: tools(DIRECT, "Weather in Bern?", stream=True))
# Usage of a non-streamed hit whose answer was first streamed without usage (cost tracking).
streamed(STRATA, "What does a stream store?")
twice("usage_after_stream", lambda: (invoked(STRATA, "What does a stream store?"), None),
      direct=lambda: invoked(DIRECT, "What does a stream store?"))
done()
