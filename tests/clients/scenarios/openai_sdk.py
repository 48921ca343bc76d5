"""The openai SDK (2.x or 3.x, whichever the interpreter has) against Strata: every call twice."""

from __future__ import annotations

import asyncio

import openai
from common import DIRECT, MODEL, STRATA, cases, clean, done, record, twice
from pydantic import BaseModel

client = openai.OpenAI(base_url=STRATA + "/v1", api_key="sk-test", max_retries=0)
direct = openai.OpenAI(base_url=DIRECT + "/v1", api_key="sk-test", max_retries=0)
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}]


class Capital(BaseModel):
    city: str
    country: str


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def created(sdk: openai.OpenAI, text: str, **extra: object) -> tuple[dict, str | None]:
    raw = sdk.chat.completions.with_raw_response.create(model=MODEL, messages=ask(text), **extra)
    return raw.parse().model_dump(), raw.headers.get("x-cache")


def streamed(sdk: openai.OpenAI, text: str, **extra: object) -> tuple[dict, str | None]:
    """A raw stream (create(stream=True)) as a client library accumulates it."""
    with sdk.chat.completions.with_streaming_response.create(model=MODEL, messages=ask(text), stream=True,
                                                             **extra) as response:
        cache = response.headers.get("x-cache")
        content: dict[int, str] = {}
        calls: dict[tuple[int, int], dict] = {}
        finish: dict[int, str | None] = {}
        logprobs: dict[int, list] = {}
        objects, usage = set(), None
        for chunk in response.parse():
            objects.add(chunk.object)
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
                for call in choice.delta.tool_calls or []:
                    known = calls.setdefault((choice.index, call.index), {"id": None, "name": None, "arguments": ""})
                    known["id"] = call.id or known["id"]
                    if call.function is not None:
                        known["name"] = call.function.name or known["name"]
                        known["arguments"] += call.function.arguments or ""
                if choice.logprobs is not None and choice.logprobs.content:
                    logprobs.setdefault(choice.index, []).extend(t.model_dump() for t in choice.logprobs.content)
                if choice.finish_reason is not None:
                    finish[choice.index] = choice.finish_reason
    return {"objects": sorted(o or "<missing>" for o in objects), "content": content, "finish": finish,
            "tool_calls": [{"choice": c, "index": i, **v} for (c, i), v in sorted(calls.items())],
            "logprobs": logprobs, "usage": usage}, cache


def helper(text: str, **extra: object) -> tuple[dict, str | None]:
    """The SDK's `.stream()` helper, which checks every chunk it accumulates."""
    with client.chat.completions.stream(model=MODEL, messages=ask(text), **extra) as stream:
        cache = stream.response.headers.get("x-cache") if hasattr(stream, "response") else None
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    parsed = message.parsed.model_dump() if getattr(message, "parsed", None) is not None else None
    return {"content": message.content, "parsed": parsed, "finish": final.choices[0].finish_reason,
            "tool_calls": [c.model_dump() for c in message.tool_calls or []],
            "usage": final.usage.model_dump() if final.usage else None}, cache


twice("create", lambda: created(client, "What is the capital of France?"),
      direct=lambda: created(direct, "What is the capital of France?")[0])
twice("create_stream", lambda: streamed(client, "Tell me about Lyon."),
      direct=lambda: streamed(direct, "Tell me about Lyon.")[0])
twice("stream_include_usage", lambda: streamed(client, "Tell me about Nice.", stream_options={"include_usage": True}),
      direct=lambda: streamed(direct, "Tell me about Nice.", stream_options={"include_usage": True})[0])
twice("stream_helper", lambda: helper("Tell me about Lille."))
twice("stream_helper_json_schema", lambda: helper("Which is the capital of Spain?", response_format=Capital))
twice("stream_helper_named_tool", lambda: helper(
    "Weather in Rome?", tools=[openai.pydantic_function_tool(Capital, name="capital")],
    tool_choice={"type": "function", "function": {"name": "capital"}}))


def parsed(text: str) -> tuple[dict, str | None]:
    raw = client.chat.completions.with_raw_response.parse(model=MODEL, messages=ask(text), response_format=Capital)
    message = raw.parse().choices[0].message
    return {"parsed": message.parsed.model_dump(), "content": message.content}, raw.headers.get("x-cache")


twice("parse", lambda: parsed("Which is the capital of Italy?"))
twice("tools_auto", lambda: created(client, "Weather in Paris?", tools=WEATHER, tool_choice="auto"),
      direct=lambda: created(direct, "Weather in Paris?", tools=WEATHER, tool_choice="auto")[0])
named = {"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
twice("tools_named", lambda: created(client, "Weather in Oslo?", **named),
      direct=lambda: created(direct, "Weather in Oslo?", **named)[0])
twice("tools_named_stream", lambda: streamed(client, "Weather in Bern?", **named),
      direct=lambda: streamed(direct, "Weather in Bern?", **named)[0])
twice("tools_auto_stream", lambda: streamed(client, "Weather in Graz?", tools=WEATHER),
      direct=lambda: streamed(direct, "Weather in Graz?", tools=WEATHER)[0])
twice("logprobs", lambda: created(client, "Say three words.", logprobs=True, top_logprobs=2),
      direct=lambda: created(direct, "Say three words.", logprobs=True, top_logprobs=2)[0])
twice("logprobs_stream", lambda: streamed(client, "Say four words.", logprobs=True, top_logprobs=1),
      direct=lambda: streamed(direct, "Say four words.", logprobs=True, top_logprobs=1)[0])
twice("n_2", lambda: created(client, "Two answers, please.", n=2), direct=lambda: created(direct, "Two answers, please.", n=2)[0])

# A question first streamed (no usage asked), then asked without streaming: the hit is the answer
# the client would have got from the model server, usage and logprobs included.
_, stream_cache = streamed(client, "What does a stream store?", logprobs=True)
hit, hit_cache = created(client, "What does a stream store?", logprobs=True)
cases["stream_then_create"] = {"direct": clean(created(direct, "What does a stream store?", logprobs=True)[0]),
                               "hit": clean(hit), "headers": [stream_cache, hit_cache]}


async def concurrent() -> dict:
    sdk = openai.AsyncOpenAI(base_url=STRATA + "/v1", api_key="sk-test", max_retries=0)
    calls = [sdk.chat.completions.with_raw_response.create(model=MODEL, messages=ask("Twenty at once?"))
             for _ in range(20)]
    responses = await asyncio.gather(*calls)
    await sdk.close()
    return {"contents": sorted({r.parse().choices[0].message.content for r in responses}),
            "caches": sorted(r.headers.get("x-cache") for r in responses)}


record("async_20_concurrent", asyncio.run(concurrent()))


def error_of(sdk: openai.OpenAI, model: str) -> dict:
    try:
        sdk.chat.completions.create(model=model, messages=ask("hello"))
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return {"class": type(exc).__name__, "status": exc.status_code, "body": body.get("error", body),
                "retry_after": exc.response.headers.get("retry-after")}
    return {"class": None}


for model in ("missing-model", "limited-model", "broken-model", "refused-model", "locked-model"):
    cases[f"error_{model}"] = {"miss": error_of(client, model), "hit": error_of(client, model),
                               "direct": error_of(direct, model), "headers": [None, None]}
done()
