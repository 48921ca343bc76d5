"""The model server behind Strata, reached through the official ``openai`` client.

Only transport lives here: timeouts, retries, error translation. The request body is sent
as received (after the ``max_tokens`` cap), so fields Strata does not know pass through.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import openai

from app import tracing
from app.errors import InvalidRequest, StrataError, UpstreamRejected, UpstreamTimeout, UpstreamUnavailable
from app.limits import ConcurrencyLimit
from app.settings import UpstreamSettings
from app.upstream_metrics import PrefixCache, read_prefix_cache
from app.wire import LEGACY_COMPLETION_FIELD, SSE_DONE, completion_decoder, json_encoder, legacy_as_chat

logger = logging.getLogger("strata.upstream")

# The HTTP library the SDK is built on: httpx, or its fork httpx2 in SDK 3.x. Mid-stream
# transport errors surface as its exceptions, not as openai errors.
_http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


# Headers a pass-through request and its answer keep (the rest is hop-by-hop or Strata's own).
_FORWARDED_HEADERS = frozenset({"content-type", "accept", "openai-beta", "openai-organization", "openai-project"})
_RETURNED_HEADERS = frozenset({"content-type", "cache-control", "x-request-id", "openai-processing-ms"})


def _as_openai_error(status: int, content: bytes) -> bytes:
    """An upstream error body as ``{"error": {...}}``: kept when it already is one."""
    try:
        decoded = completion_decoder.decode(content)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict) and "message" in decoded["error"]:
        error = decoded["error"]
        return json_encoder.encode({"error": {"message": str(error["message"]), "type": error.get("type") or "upstream_error",
                                              "param": error.get("param"), "code": error.get("code")}})
    detail = decoded.get("detail") if isinstance(decoded, dict) else None
    message = str(detail) if detail else content.decode("utf-8", errors="replace")[:500] or "request failed"
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error")
    return json_encoder.encode({"error": {"message": message, "type": kind, "param": None, "code": "upstream_error"}})


# SSE lines other than data: comments and the event, id and retry fields.
_SSE_OTHER_FIELDS = (":", "event:", "id:", "retry:")


def _choices_of(decoded: Any, part: str) -> bool:
    """A completion with a non-empty list of choices, each an object with its ``part`` (chat:
    ``message``, an object; legacy: ``text``, a string)."""
    choices = decoded.get("choices") if isinstance(decoded, dict) else None
    kind = dict if part == "message" else str
    return isinstance(choices, list) and bool(choices) and all(
        isinstance(c, dict) and isinstance(c.get(part), kind) for c in choices)


def _translate(exc: openai.OpenAIError) -> StrataError:
    """Map an SDK error to the error Strata answers with."""
    if isinstance(exc, openai.APITimeoutError):
        return UpstreamTimeout("the model server did not answer in time")
    if isinstance(exc, openai.APIConnectionError):
        return UpstreamUnavailable(f"the model server is unreachable: {exc}")
    if isinstance(exc, openai.APIStatusError):
        return _passed_on(exc)
    return UpstreamUnavailable(f"the model server failed: {exc}")


# OpenAI's error types by status, for an upstream error body that names none.
_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error"}


def _passed_on(exc: openai.APIStatusError) -> UpstreamRejected:
    """The model server's error as it sent it: status, type, code, param, message, Retry-After."""
    status = exc.status_code
    detail: dict[str, Any] = {}
    if isinstance(exc.body, dict):
        found = exc.body.get("error", exc.body)
        detail = found if isinstance(found, dict) else {}
    found_message = detail.get("message")
    message = found_message if isinstance(found_message, str) else str(exc.message)
    kind = detail.get("type") if isinstance(detail.get("type"), str) and detail.get("type") else (
        _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"))
    code, param = detail.get("code"), detail.get("param")
    retry_after = exc.response.headers.get("retry-after") if status in (429, 503) else None
    return UpstreamRejected(message, status_code=status, error_type=kind,
                            code=code if isinstance(code, (str, int)) else None,
                            param=param if isinstance(param, str) else None,
                            headers={"Retry-After": retry_after} if retry_after else None)


def _never_reached(exc: openai.OpenAIError) -> bool:
    """The request never reached the model server (it refused or did not accept the connection),
    so sending it again cannot repeat a generation: the only failure Strata retries."""
    if not isinstance(exc, openai.APIConnectionError):
        return False
    cause = exc.__cause__
    return isinstance(cause, (_http.ConnectError, _http.ConnectTimeout))


def _split(body: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
    return body["model"], body["messages"], rest


def _note_response(step: tracing.Span, content: bytes) -> None:
    """A completion's finish reasons and token counts on its model call's span."""
    try:
        decoded = msgspec.json.decode(content)
    except msgspec.DecodeError:
        return
    usage = decoded.get("usage") or {} if isinstance(decoded, dict) else {}
    tracing.note(step, {tracing.GEN_AI_INPUT_TOKENS: usage.get("prompt_tokens"),
                        tracing.GEN_AI_OUTPUT_TOKENS: usage.get("completion_tokens"),
                        tracing.GEN_AI_FINISH_REASONS: [str(c.get("finish_reason")) for c in decoded.get("choices") or []
                                                        if isinstance(c, dict)] if isinstance(decoded, dict) else None})


class Upstream:
    """An OpenAI-compatible model server (vLLM)."""

    def __init__(self, settings: UpstreamSettings) -> None:
        timeout = _http.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        self._client = openai.AsyncOpenAI(
            base_url=settings.url,
            api_key=settings.api_key,
            timeout=timeout,
            # Retries are ours (see _retrying): the SDK's would also repeat 5xx and 429.
            max_retries=0,
        )
        # Plain HTTP to the server's own pages (/metrics), beside the OpenAI API.
        self._server = httpx.AsyncClient(base_url=settings.url.rstrip("/").removesuffix("/v1"),
                                         timeout=settings.health_timeout_s)
        self._retries = settings.max_retries
        self._health_timeout = settings.health_timeout_s
        self._api_key = settings.api_key
        self._timeout = httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        # Protects the model server: beyond this many calls in flight, requests queue, then 503.
        self._limit = ConcurrencyLimit(settings.max_concurrency, settings.queue_timeout_s)

    async def close(self) -> None:
        await self._client.close()
        await self._server.aclose()

    async def prefix_cache(self) -> PrefixCache | None:
        """The server's prefix-cache counters from its ``/metrics``; ``None`` when it has none we
        know or does not answer in time (a vLLM without metrics is not an error)."""
        try:
            response = await self._server.get("/metrics")
        except httpx.HTTPError:
            return None
        return read_prefix_cache(response.text) if response.status_code == 200 else None

    async def complete(self, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """Send a non-streaming chat completion.

        Args:
            body: The request body, sent as is.

        Returns:
            The response body as received, and its decoded form.

        Raises:
            StrataError: The upstream failed, timed out or rejected the request.
        """
        model, messages, rest = _split(body)
        legacy = bool(rest.pop(LEGACY_COMPLETION_FIELD, False))
        operation = "text_completion" if legacy else "chat"
        with tracing.span(f"{operation} {model}", self._call_attributes(model, rest, operation) if tracing.active() else None,
                          client=True) as step:
            trace_headers = tracing.propagation_headers()
            async with self._limit.slot():
                for attempt in range(self._retries + 1):
                    try:
                        raw: Any
                        if legacy:  # a legacy text completion: its one user message is the prompt
                            raw = await self._client.completions.with_raw_response.create(
                                model=model, prompt=messages[-1]["content"], extra_body=rest, extra_headers=trace_headers
                            )
                        else:
                            raw = await self._client.chat.completions.with_raw_response.create(
                                model=model, messages=messages, extra_body=rest, extra_headers=trace_headers
                            )
                        break
                    except openai.OpenAIError as exc:
                        if attempt == self._retries or not _never_reached(exc):
                            tracing.note(step, {"error.type": type(exc).__name__})
                            raise _translate(exc) from exc
                        await self._backoff(attempt)
            content = raw.http_response.content
            if step is not None:
                _note_response(step, content)
        try:
            decoded = completion_decoder.decode(content)
        except ValueError as exc:
            raise UpstreamUnavailable("the model server sent a malformed completion") from exc
        if legacy:
            if not _choices_of(decoded, "text"):
                raise UpstreamUnavailable("the model server sent a completion without choices")
            decoded = legacy_as_chat(decoded)
            content = json_encoder.encode(decoded)
        elif not _choices_of(decoded, "message"):
            raise UpstreamUnavailable("the model server sent a completion without valid choices")
        return content, decoded

    @staticmethod
    async def _backoff(attempt: int) -> None:
        """Full jitter: many workers retrying at once do not arrive together."""
        await asyncio.sleep(random.uniform(0, 0.1 * 2**attempt))

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Send a streaming chat completion and yield each SSE ``data`` payload, ``[DONE]`` excluded.

        Args:
            body: The request body with ``stream: true``.

        Yields:
            The JSON payload of each chunk, as received.

        Raises:
            StrataError: The upstream failed before or while streaming.
        """
        model, messages, rest = _split(body)
        # Not the current span: it lives across this generator's yields (tracing.detached_span).
        with tracing.detached_span(f"chat {model}", self._call_attributes(model, rest, "chat") if tracing.active() else None,
                                   client=True) as step:
            async for payload in self._stream(model, messages, rest, tracing.propagation_headers(step) if step else {}):
                yield payload

    async def _stream(self, model: str, messages: Any, rest: dict[str, Any],
                      trace_headers: dict[str, str]) -> AsyncIterator[bytes]:
        try:
            async with self._limit.slot(), self._client.chat.completions.with_streaming_response.create(
                model=model, messages=messages, extra_body=rest, extra_headers=trace_headers
            ) as response:
                async for line in response.http_response.aiter_lines():
                    if not line.startswith("data:"):
                        if line.strip() and not line.startswith(_SSE_OTHER_FIELDS):
                            raise UpstreamUnavailable(f"the model server sent a malformed stream line: {line[:80]!r}")
                        continue
                    payload = line[5:].strip().encode()
                    if payload == SSE_DONE:
                        return
                    yield payload
            raise UpstreamUnavailable("the model server's stream ended before [DONE]")
        except openai.OpenAIError as exc:
            raise _translate(exc) from exc
        except _http.TimeoutException as exc:
            raise UpstreamTimeout("the model server stopped answering mid-stream") from exc
        except _http.HTTPError as exc:
            raise UpstreamUnavailable(f"the model server stream broke: {exc}") from exc

    def _call_attributes(self, model: str, rest: dict[str, Any], operation: str) -> dict[str, Any]:
        """The GenAI semantic conventions' attributes of a model call."""
        where = httpx.URL(str(self._client.base_url))
        return {tracing.GEN_AI_OPERATION: operation, tracing.GEN_AI_PROVIDER: "vllm", tracing.GEN_AI_REQUEST_MODEL: model,
                tracing.GEN_AI_MAX_TOKENS: rest.get("max_tokens"), tracing.SERVER_ADDRESS: where.host,
                tracing.SERVER_PORT: where.port}

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        """``POST /v1/embeddings`` on the upstream; the response body as received.

        Raises:
            StrataError: The upstream failed, timed out or rejected the request.
        """
        rest = {k: v for k, v in body.items() if k not in ("model", "input", "encoding_format")}
        async with self._limit.slot():
            try:
                raw = await self._client.embeddings.with_raw_response.create(
                    model=body["model"], input=body["input"],
                    # Named always: left out, the SDK would ask for base64 and decode it itself.
                    encoding_format=body.get("encoding_format") or "float", extra_body=rest,
                )
            except openai.OpenAIError as exc:
                raise _translate(exc) from exc
        return raw.http_response.content

    async def forward(self, method: str, path: str, query: str, headers: dict[str, str],
                      body: bytes) -> tuple[int, dict[str, str], AsyncIterator[bytes]]:
        """Pass any other request under ``/v1/`` to the upstream untouched (no cache), streaming
        the answer back; the upstream's own API key replaces the client's.

        Returns:
            The status, the response headers worth passing on, and the body's chunks.

        Raises:
            StrataError: The upstream is unreachable or timed out.
        """
        sent = {k: v for k, v in headers.items() if k.lower() in _FORWARDED_HEADERS}
        sent["authorization"] = f"Bearer {self._api_key}"
        try:
            # The path arrives decoded: encode it again, so that no character can change the request.
            url = "/v1/" + urllib.parse.quote(path, safe="/-._~!$&'()*+,;=:@")
            request = self._server.build_request(method, url, params=query or None, headers=sent, content=body,
                                                 timeout=self._timeout)
        except (httpx.InvalidURL, UnicodeError) as exc:
            raise InvalidRequest(f"a path the model server cannot be asked: {exc}", code="invalid_path") from exc
        try:
            response = await self._server.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("the model server did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"the model server is unreachable: {exc}") from exc
        kept = {k: v for k, v in response.headers.items() if k.lower() in _RETURNED_HEADERS}
        if response.status_code >= 400:
            # Errors in OpenAI's shape, whatever the server wrote ({"detail": ...} from vLLM's router).
            content = await response.aread()
            await response.aclose()
            kept["content-type"] = "application/json"
            body_out = _as_openai_error(response.status_code, content)

            async def error() -> AsyncIterator[bytes]:
                yield body_out

            return response.status_code, kept, error()

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        return response.status_code, kept, chunks()

    async def models(self) -> bytes:
        """``GET /v1/models`` on the upstream, passed through."""
        try:
            raw = await self._client.models.with_raw_response.list()
        except openai.OpenAIError as exc:
            raise _translate(exc) from exc
        return raw.http_response.content

    async def healthy(self) -> tuple[bool, str | None]:
        """Whether the upstream answers ``/models`` quickly; the error text when it does not."""
        try:
            await self._client.with_options(timeout=self._health_timeout, max_retries=0).models.list()
        except openai.OpenAIError as exc:
            return False, _translate(exc).message
        return True, None
