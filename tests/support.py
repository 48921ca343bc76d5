"""Test helpers: a real HTTP server in a thread, Strata served on it, a fake OpenAI-compatible
upstream, and one way of asking Strata a question."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

from app.asgi import create_app
from app.cache.readers.judge import JUDGE_SYSTEM_PROMPT
from app.embed import Encoder
from app.replay.simulate import ServerThread, free_port
from app.settings import Settings

__all__ = [
    "FAQ", "MODEL", "FakeUpstream", "ServerThread", "ask", "free_port", "run_cli", "serve_process", "serve_strata",
]

MODEL = "fake-model"
# The category the semantic tests ask in (tests/fixtures/policy.yaml).
FAQ = {"X-Cache-Category": "faq"}


class WrittenBeforeAnswered:
    """Holds each response's last body message until Strata's write-backs have landed.

    Strata writes an answer back after its response has gone out (app/relay.py), so a test that
    looks into Redis right after a miss could look too early. Behind this wrapper it never does;
    the write-back's own timing is tested on a server without it (``written_first=False``).
    Observations are not waited for: tests of learning wait for them explicitly.
    """

    def __init__(self, app: Litestar) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_when_written(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await self.app.state.resources.pipeline.settle(observations=False)
            await send(message)

        await self.app(scope, receive, send_when_written)


def serve_strata(settings: Settings, encoder: Encoder | None = None, *, written_first: bool = True) -> ServerThread:
    """Strata itself (``create_app``) on a free port, to be entered with ``with``.

    Args:
        settings: Its settings.
        encoder: An embedding model already loaded (tests share one).
        written_first: Responses leave once their write-back has landed (see
            :class:`WrittenBeforeAnswered`); ``False`` serves Strata exactly as production does.
    """
    app = create_app(settings, encoder=encoder)
    return ServerThread(WrittenBeforeAnswered(app) if written_first else app)


def ask(target: str | httpx.Client, question: str, *, key: str | None = None, system: str | None = None,
        history: list[dict[str, str]] | None = None, headers: dict[str, str] | None = None,
        **params: Any) -> httpx.Response:
    """Ask Strata one chat question (category ``faq`` unless ``headers`` say otherwise).

    Args:
        target: Strata's base URL, or a client whose base URL it is.
        question: The last user message.
        key: An API key for ``Authorization: Bearer``.
        system: A system prompt before the question.
        history: Earlier turns between the system prompt and the question.
        headers: Request headers instead of the ``faq`` category.
        **params: More body fields (``model`` replaces the fake model).
    """
    messages = ([{"role": "system", "content": system}] if system else []) + (history or [])
    messages.append({"role": "user", "content": question})
    sent = dict(headers if headers is not None else FAQ)
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    body = {"model": params.pop("model", MODEL), "messages": messages, **params}
    if isinstance(target, httpx.Client):
        return target.post("/v1/chat/completions", json=body, headers=sent)
    return httpx.post(target + "/v1/chat/completions", json=body, headers=sent, timeout=10)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``strata`` command as a user would, with the test policy file."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml", **(env or {})},
                          timeout=300)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop a Strata started by :func:`serve_process` as an orchestrator would: SIGTERM, the
    graceful window uvicorn is given (30 s, app/serve.py) and some, then SIGKILL. What a test
    checks is asserted before; its teardown does not fail on a slow exit of a busy machine."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=45)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def serve_process(env: dict[str, str], port: int, timeout: float = 60.0) -> subprocess.Popen[bytes]:
    """Start Strata as production runs it (``python -m app.serve``) and wait for ``/health``; with
    the tests' policy file unless ``env`` names another (the shipped default category is per-user)."""
    import httpx

    root = Path(__file__).resolve().parent.parent
    env = {"STRATA_POLICY_FILE": "tests/fixtures/policy.yaml", **env}
    process = subprocess.Popen([sys.executable, "-m", "app.serve"], cwd=root, env=env)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("strata did not start")
        time.sleep(0.1)


@dataclass
class FakeUpstream:
    """An OpenAI-compatible upstream whose behaviour tests control.

    Attributes:
        url: Where it serves, once its server runs ("" before).
        calls: Chat requests received, bodies as decoded JSON.
        status: HTTP status to answer with (an error body unless 200).
        delay: Seconds to wait before answering.
        finish_reason: The finish reason of every answer.
        fail_mid_stream: Break streams after the first content chunk.
        judge_reply: What the fake answers to LLM-judge prompts (app/judge.py).
        judge_delay: Seconds to wait before answering a judge prompt.
        judge_calls: Judge prompts received, as (cached question, new question).
        answers: Fixed answers by question (normalised text), instead of the generated one.
        completion_calls: Legacy ``/v1/completions`` requests received.
        embedding_calls: ``/v1/embeddings`` requests received.
        other_calls: Requests to other paths, as (method, path, body).
        tool_calls: Answer requests that offer ``tools`` with a call of the first one, its
            arguments naming the question (finish ``stop`` for a named ``tool_choice``, as vLLM
            does, ``tool_calls`` otherwise).
    """

    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    # The W3C traceparent each chat request came with ("" without one).
    traceparents: list[str] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    finish_reason: str = "stop"
    fail_mid_stream: bool = False
    malformed_chunk: bool = False
    judge_reply: str = "yes"
    judge_delay: float = 0.0
    judge_calls: list[tuple[str, str]] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)
    completion_calls: list[dict[str, Any]] = field(default_factory=list)
    embedding_calls: list[dict[str, Any]] = field(default_factory=list)
    other_calls: list[tuple[str, str, bytes]] = field(default_factory=list)
    tool_calls: bool = False
    # Faults: a stream of lines that are not SSE, a 200 body as given, a pause between chunks.
    garbage_stream: bool = False
    bad_body: bytes | None = None
    chunk_delay: float = 0.0

    def reset(self) -> None:
        self.calls.clear()
        self.traceparents.clear()
        self.completion_calls.clear()
        self.embedding_calls.clear()
        self.other_calls.clear()
        self.status, self.delay, self.finish_reason, self.fail_mid_stream = 200, 0.0, "stop", False
        self.malformed_chunk = False
        self.judge_reply, self.judge_delay = "yes", 0.0
        self.tool_calls = False
        self.garbage_stream, self.bad_body, self.chunk_delay = False, None, 0.0
        self.judge_calls.clear()
        self.answers.clear()

    def answer_for(self, body: dict[str, Any]) -> str:
        """A deterministic answer naming the question and, in a conversation, its first turn;
        the configured reply to a judge prompt."""
        messages = body["messages"]
        if messages[0].get("content") == JUDGE_SYSTEM_PROMPT:
            cached, asked = (line.split(": ", 1)[1] for line in messages[1]["content"].splitlines()[:2])
            self.judge_calls.append((cached, asked))
            return self.judge_reply
        # Any message shape Strata accepts (a tool call has no content, say) gets an answer.
        last = messages[-1].get("content")
        if isinstance(last, str) and last.strip() in self.answers:
            return self.answers[last.strip()]
        after = f" (after: {messages[0].get('content')})" if len(messages) > 1 else ""
        return f"answer #{len(str(last))} to: {last}{after}"

    def app(self) -> Litestar:
        upstream = self

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request) -> Response[bytes] | Stream:
            body = msgspec.json.decode(await request.body())
            upstream.calls.append(body)
            upstream.traceparents.append(request.headers.get("traceparent", ""))
            if upstream.delay:
                await asyncio.sleep(upstream.delay)
            if upstream.judge_delay and body["messages"][0].get("content") == JUDGE_SYSTEM_PROMPT:
                await asyncio.sleep(upstream.judge_delay)
            failure = vllm_error(upstream.status, str(body.get("model", "")))
            if failure is not None:
                return failure
            if upstream.garbage_stream and body.get("stream"):
                async def garbage() -> Any:
                    yield b"this is not a server-sent event\n\n"
                    yield b"<html>upstream proxy error</html>\n"
                return Stream(garbage(), media_type="text/event-stream")
            if upstream.bad_body is not None and not body.get("stream"):
                return Response(upstream.bad_body, media_type="application/json")
            identity = {"id": f"chatcmpl-fake{len(upstream.calls)}", "created": 1700000000, "model": body["model"]}
            choices = [upstream.choice(body, index) for index in range(body.get("n") or 1)]
            usage = {"prompt_tokens": 7, "completion_tokens": 5 * len(choices), "total_tokens": 7 + 5 * len(choices)}
            if body.get("stream"):
                with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return Stream(upstream._chunks(identity, choices, usage if with_usage else None),
                              media_type="text/event-stream")
            completion = {**identity, "object": "chat.completion", "choices": choices, "usage": usage}
            return Response(msgspec.json.encode(completion), media_type="application/json")

        @post("/v1/messages", status_code=200)
        async def messages(request: Request) -> Response[bytes]:
            # Anthropic's Messages API as vLLM serves it (tests/clients pass it through Strata).
            body = msgspec.json.decode(await request.body())
            upstream.other_calls.append(("POST", "/v1/messages", msgspec.json.encode(body)))
            last = body["messages"][-1]["content"]
            text = last if isinstance(last, str) else " ".join(b.get("text", "") for b in last if isinstance(b, dict))
            answer = {"id": f"msg_fake{len(upstream.other_calls)}", "type": "message", "role": "assistant",
                      "model": body["model"], "content": [{"type": "text", "text": f"answer to: {text}"}],
                      "stop_reason": "end_turn", "stop_sequence": None,
                      "usage": {"input_tokens": 7, "output_tokens": 5}}
            return Response(msgspec.json.encode(answer), media_type="application/json")

        @post("/v1/responses", status_code=200)
        async def responses(request: Request) -> Response[bytes]:
            # The Responses API as vLLM serves it: what Strata passes through (stored conversations).
            body = msgspec.json.decode(await request.body())
            upstream.other_calls.append(("POST", "/v1/responses", msgspec.json.encode(body)))
            text = body["input"] if isinstance(body["input"], str) else "items"
            answer = {"id": f"resp_fake{len(upstream.other_calls)}", "object": "response", "created_at": 1700000000,
                      "status": "completed", "model": body["model"], "parallel_tool_calls": True, "tool_choice": "auto",
                      "tools": [], "output": [{"id": "msg_fake", "type": "message", "status": "completed",
                                               "role": "assistant", "content": [{"type": "output_text",
                                                                                 "text": f"stored answer to: {text}",
                                                                                 "annotations": []}]}]}
            return Response(msgspec.json.encode(answer), media_type="application/json")

        @post("/v1/completions", status_code=200)
        async def completions(request: Request) -> Response[bytes] | Stream:
            body = msgspec.json.decode(await request.body())
            upstream.completion_calls.append(body)
            if upstream.status != 200:
                error = {"error": {"message": "fake upstream failure", "type": "server_error", "code": None}}
                return Response(msgspec.json.encode(error), status_code=upstream.status, media_type="application/json")
            text = f" completes: {body['prompt']}"
            identity = {"id": f"cmpl-fake{len(upstream.completion_calls)}", "created": 1700000000, "model": body["model"]}
            if body.get("stream"):
                async def events() -> Any:
                    for piece in (text[:5], text[5:]):
                        chunk = {**identity, "object": "text_completion",
                                 "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]}
                        yield b"data: " + msgspec.json.encode(chunk) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                return Stream(events(), media_type="text/event-stream")
            completion = {**identity, "object": "text_completion",
                          "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": upstream.finish_reason}],
                          "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}}
            return Response(msgspec.json.encode(completion), media_type="application/json")

        @post("/v1/embeddings", status_code=200)
        async def embeddings(request: Request) -> dict[str, Any]:
            body = msgspec.json.decode(await request.body())
            upstream.embedding_calls.append(body)
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"object": "embedding", "index": i,
                     "embedding": [((hash(str(t)) >> shift) % 1000) / 1000 for shift in (0, 8, 16, 24)]}
                    for i, t in enumerate(texts)]
            return {"object": "list", "data": data, "model": body["model"],
                    "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}}

        @get("/v1/models/{model_id:str}")
        async def model(model_id: str) -> Response[bytes]:
            upstream.other_calls.append(("GET", f"/v1/models/{model_id}", b""))
            if model_id != "fake-model":
                error = {"error": {"message": f"no model {model_id}", "type": "invalid_request_error", "code": None}}
                return Response(msgspec.json.encode(error), status_code=404, media_type="application/json")
            return Response(msgspec.json.encode({"id": model_id, "object": "model", "created": 1700000000,
                                                 "owned_by": "tests"}), media_type="application/json")

        @post("/v1/moderations", status_code=200)
        async def moderations(request: Request) -> dict[str, Any]:
            upstream.other_calls.append(("POST", "/v1/moderations", await request.body()))
            return {"id": "modr-fake", "model": "fake-moderation",
                    "results": [{"flagged": False, "categories": {}, "category_scores": {}}]}

        @get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "tests"}]}

        @get("/metrics", media_type="text/plain")
        async def metrics() -> str:
            # vLLM's prefix-cache counters (V1 names): 75% of the queried prompt tokens were cached.
            return ('vllm:prefix_cache_queries_total{engine="0",model_name="fake-model"} 400.0\n'
                    'vllm:prefix_cache_hits_total{engine="0",model_name="fake-model"} 300.0\n')

        return Litestar([chat, messages, responses, completions, embeddings, model, moderations, models, metrics])

    def choice(self, body: dict[str, Any], index: int = 0) -> dict[str, Any]:
        """One choice as vLLM answers it: text, a call of the first tool (when ``tool_choice`` names
        it or requires one, or on ``auto`` with :attr:`tool_calls`), or JSON for ``response_format``;
        logprobs when asked. A named tool call ends with ``stop``, as vLLM's does."""
        content = self.answer_for(body)
        if index:
            content = f"{content} (choice {index})"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        finish = self.finish_reason
        tools, choice = body.get("tools"), body.get("tool_choice")
        format_ = body.get("response_format") or {}
        if tools and choice != "none" and (isinstance(choice, dict) or choice == "required" or self.tool_calls):
            named = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
            tool = next(t for t in tools if t["function"]["name"] == named)
            retry = any(m.get("role") == "tool" or (m.get("role") == "assistant" and m.get("tool_calls"))
                        for m in body["messages"])
            arguments = filled(tool["function"].get("parameters") or {}, self._asked(body), upper=retry)
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"chatcmpl-tool-{len(self.calls)}{index}", "type": "function",
                 "function": {"name": named, "arguments": msgspec.json.encode(arguments).decode()}}]}
            finish = "stop" if isinstance(choice, dict) else "tool_calls"
        elif format_.get("type") == "json_schema":
            message["content"] = msgspec.json.encode(filled(format_["json_schema"].get("schema") or {}, content)).decode()
        elif format_.get("type") == "json_object":
            message["content"] = msgspec.json.encode({"answer": content}).decode()
        logprobs = None
        if body.get("logprobs") and message.get("content"):
            logprobs = {"content": token_logprobs(message["content"], int(body.get("top_logprobs") or 0)), "refusal": None}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}

    @staticmethod
    def _asked(body: dict[str, Any]) -> str:
        users = [m.get("content") for m in body["messages"] if m.get("role") == "user"]
        return users[-1] if users and isinstance(users[-1], str) else "it"

    async def _chunks(self, identity: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> Any:
        """The stream vLLM sends: per choice a role chunk, the content in two pieces with their
        logprobs (or the tool call: id, type and name, then its arguments in two pieces), the
        finish reason; the usage chunk only when the request asked for it."""
        def event(choice_list: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk = {**identity, "object": "chat.completion.chunk", "choices": choice_list, **extra}
            return b"data: " + msgspec.json.encode(chunk) + b"\n\n"

        async def pause() -> None:
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)

        def delta(index: int, fields: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
            return {"index": index, "delta": fields, "logprobs": logprobs, "finish_reason": finish}

        for choice in choices:
            index, message = choice["index"], choice["message"]
            yield event([delta(index, {"role": "assistant", "content": ""})])
            if message.get("tool_calls"):
                call = message["tool_calls"][0]
                arguments = call["function"]["arguments"]
                yield event([delta(index, {"tool_calls": [{"id": call["id"], "type": "function", "index": 0,
                                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})])
                for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                    yield event([delta(index, {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})])
            else:
                content = message["content"]
                half = len(content) // 2
                tokens = (choice.get("logprobs") or {}).get("content") or []
                starts = list(itertools.accumulate((len(t["token"]) for t in tokens), initial=0))
                halves = ([t for t, at in zip(tokens, starts, strict=False) if at < half],
                          [t for t, at in zip(tokens, starts, strict=False) if at >= half])
                for number, piece in enumerate((content[:half], content[half:])):
                    logprobs = {"content": halves[number], "refusal": None} if tokens else None
                    yield event([delta(index, {"content": piece}, logprobs)])
                    await pause()
                    if number == 0 and self.fail_mid_stream:
                        raise RuntimeError("fake upstream broke mid-stream")
                    if number == 0 and self.malformed_chunk:
                        yield b'data: {"choices": "not a list"}\n\n'
            yield event([{**delta(index, {}, finish=choice["finish_reason"]), "stop_reason": None}])
        if usage is not None:
            yield event([], usage=usage)
        yield b"data: [DONE]\n\n"


def filled(schema: dict[str, Any], text: str, *, upper: bool = False) -> Any:
    """A value of a JSON schema built from ``text`` (tool arguments, structured outputs)."""
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {name: filled(sub, text, upper=upper) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [filled(schema.get("items") or {}, text, upper=upper)]
    if kind == "integer":
        return 7
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if "enum" in schema:
        return schema["enum"][0]
    return text.upper() if upper else text


def token_logprobs(content: str, top: int) -> list[dict[str, Any]]:
    """Per word (with its trailing space) a logprob entry, as vLLM reports them."""
    entries = []
    for token in re.findall(r"\S+\s*|\s+", content):
        alternatives = [{"token": token, "logprob": -0.25, "bytes": list(token.encode())}] * top
        entries.append({"token": token, "logprob": -0.25, "bytes": list(token.encode()), "top_logprobs": alternatives})
    return entries


# vLLM's error types by status (``{"error": {"message", "type", "param", "code"}}``).
_VLLM_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}
# Models whose name makes the fake fail, so that client tests need no coordination with it.
ERROR_MODELS = {"missing-model": 404, "limited-model": 429, "broken-model": 500, "refused-model": 400,
                "locked-model": 401}


def vllm_error(status: int, model: str) -> Response[bytes] | None:
    """The error the fake answers with: by its configured status, or by the model's name."""
    status = ERROR_MODELS.get(model, status)
    if status == 200:
        return None
    message = f"The model `{model}` does not exist." if status == 404 else "fake upstream failure"
    error = {"error": {"message": message, "type": _VLLM_TYPES.get(status, "BadRequestError"),
                       "param": "model" if status == 404 else None, "code": status}}
    headers = {"Retry-After": "7"} if status in (429, 503) else None
    return Response(msgspec.json.encode(error), status_code=status, media_type="application/json", headers=headers)


# The same tests run on one Redis and, with `pytest --redis-cluster`, on a Redis Cluster whose
# keys live in buckets (`strata:{b7}:...`, app/cache/storage/buckets.py). These helpers let a test name
# keys in the single-node layout and read them wherever they are.

def clustered(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def layout(client: Any, name: str) -> str:
    """A single-node key name or SCAN pattern (``strata:v1:exact:*``) as it is on the test Redis:
    itself on one Redis, the same name in any bucket (``strata:{*}:v1:exact:*``) on a cluster."""
    if not clustered(client) or name.startswith(("strata:meta:usage", "strata:meta:tokens", "strata:meta:audit",
                                                  "strata:meta:buckets")):
        return name  # single keys outside any bucket
    return name.replace("strata:", "strata:{*}:", 1)


def scan(client: Any, pattern: str) -> list[bytes]:
    """Every key matching a single-node pattern, on every master."""
    return list(client.scan_iter(match=layout(client, pattern)))


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``check()`` once it is truthy, or its last value after ``timeout`` s: for what Strata writes
    after the response (write-backs, observations, batched counts), waited for, not slept on."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def seed_pool(client: Any, category: str = "learn", tenant: str = "default") -> None:
    """Plenty of clean observations at every score in a category's pool: its bound passes everywhere."""
    pool = keyspace(client, tenant, category).observations_key("v1", category, tenant)
    client.hset(pool, mapping={f"ok:{b:03d}": 1000 for b in range(50, 160)})


def keyspace(client: Any, tenant: str = "default", category: str = "business") -> Any:
    """The keyspace a (tenant, category) is cached in: the plain one, or its cluster bucket's."""
    from app.cache.storage.buckets import bucket_of
    from app.cache.storage.keys import BUCKETS_KEY, KEYS, Keyspace

    if not clustered(client):
        return KEYS
    tags = client.get(BUCKETS_KEY).decode().split(",")
    return Keyspace.bucket(tags[bucket_of(tenant, category, len(tags))])


def every_keyspace(client: Any) -> list[Any]:
    from app.cache.storage.keys import BUCKETS_KEY, KEYS, Keyspace

    if not clustered(client):
        return [KEYS]
    return [Keyspace.bucket(tag) for tag in client.get(BUCKETS_KEY).decode().split(",")]


def node_of(client: Any, key: str) -> Any:
    """A plain connection to the Redis holding ``key`` (FT.* commands go to an index's master)."""
    import redis

    if not clustered(client):
        return client
    node = client.get_node_from_key(key)
    return redis.Redis(host=node.host, port=node.port)


def indexes(client: Any) -> set[str]:
    """The names of every RediSearch index, on every master."""
    import redis

    nodes = [client] if not clustered(client) else [redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()]
    return {name.decode() for node in nodes for name in node.execute_command("FT._LIST")}


async def first_bucket(redis_url: str) -> tuple[Any, Any]:
    """(a connection, its keyspace) where a component test can run a layer on its own: the test
    Redis itself, or on a cluster its first bucket (a single Redis, as the layers see it)."""
    from app.cache.storage.buckets import open_buckets
    from app.settings import RedisSettings

    buckets = await open_buckets(RedisSettings(url=redis_url, timeout_s=5.0))
    bucket = buckets.all[0]
    if buckets.shared is not bucket.redis:
        await buckets.shared.aclose()
    return bucket.redis, bucket.keys


# The admin token of every test Strata (``strata_settings``).
ADMIN_TOKEN = "test-admin-token"


def strata_settings(redis_url: str, upstream_url: str, **overrides: object) -> Settings:
    """A test Strata's settings: the test Redis, a fake upstream, the fixture policy, the exact
    layer only, short upstream bounds; ``overrides`` are flat setting names.

    Redis gets 5 s, not production's fail-fast 0.25 s: on a loaded 2-core machine a command waits
    for the scheduler longer than that, and a timed-out lookup is a bypass that calls the model,
    which breaks every test that counts model calls or expects a hit. The bound itself is tested
    where it is the subject (``test_a_paused_redis_costs_a_bounded_wait_not_an_outage``)."""
    values: dict[str, object] = {
        "redis_url": redis_url,
        "redis_timeout_s": 5.0,
        "lookup_timeout_s": 5.0,
        "upstream_url": upstream_url + "/v1",
        "upstream_timeout_s": 1.0,
        "upstream_max_retries": 0,
        "admin_token": ADMIN_TOKEN,
        "policy_file": "tests/fixtures/policy.yaml",
        "default_max_tokens": 64,
        "max_tokens_cap": 128,
        "semantic_enabled": False,
        "intent_reader_en": "off",  # as tests/conftest.py sets it for the CLI
    }
    values.update(overrides)
    return Settings.from_flat(values)


def chat(question: str = "How do I get a refund?", **extra: object) -> dict[str, object]:
    """A chat request body for the fake model."""
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], **extra}


@contextmanager
def fake_upstream_served() -> Iterator[FakeUpstream]:
    """A fake upstream serving on a free port (its ``url`` set) until the block ends."""
    upstream = FakeUpstream()
    with ServerThread(upstream.app()) as server:
        upstream.url = server.url
        yield upstream
