"""The model server behind Strata, reached through the official ``openai`` client.

Only transport lives here: timeouts, retries, error translation. The request body is sent
as received (after the ``max_tokens`` cap), so fields Strata does not know pass through.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai

from app.errors import StrataError, UpstreamRejected, UpstreamTimeout, UpstreamUnavailable
from app.limits import ConcurrencyLimit
from app.settings import UpstreamSettings
from app.upstream_metrics import PrefixCache, read_prefix_cache
from app.wire import SSE_DONE, completion_decoder

logger = logging.getLogger("strata.upstream")

# The HTTP library the SDK is built on: httpx, or its fork httpx2 in SDK 3.x. Mid-stream
# transport errors surface as its exceptions, not as openai errors.
_http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


def _translate(exc: openai.OpenAIError) -> StrataError:
    """Map an SDK error to the error Strata answers with."""
    if isinstance(exc, openai.APITimeoutError):
        return UpstreamTimeout("the model server did not answer in time")
    if isinstance(exc, openai.APIConnectionError):
        return UpstreamUnavailable(f"the model server is unreachable: {exc}")
    if isinstance(exc, openai.APIStatusError):
        message = exc.message
        if isinstance(exc.body, dict):
            detail = exc.body.get("error", exc.body)
            if isinstance(detail, dict) and isinstance(detail.get("message"), str):
                message = detail["message"]
        if 400 <= exc.status_code < 500:
            return UpstreamRejected(message, status_code=exc.status_code, code="upstream_rejected")
        return UpstreamUnavailable(f"the model server failed ({exc.status_code}): {message}")
    return UpstreamUnavailable(f"the model server failed: {exc}")


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
        async with self._limit.slot():
            for attempt in range(self._retries + 1):
                try:
                    raw = await self._client.chat.completions.with_raw_response.create(
                        model=model, messages=messages, extra_body=rest
                    )
                    break
                except openai.OpenAIError as exc:
                    if attempt == self._retries or not _never_reached(exc):
                        raise _translate(exc) from exc
                    await self._backoff(attempt)
        content = raw.http_response.content
        try:
            return content, completion_decoder.decode(content)
        except ValueError as exc:
            raise UpstreamUnavailable("the model server sent a malformed completion") from exc

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
        try:
            async with self._limit.slot(), self._client.chat.completions.with_streaming_response.create(
                model=model, messages=messages, extra_body=rest
            ) as response:
                async for line in response.http_response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip().encode()
                    if payload == SSE_DONE:
                        return
                    yield payload
        except openai.OpenAIError as exc:
            raise _translate(exc) from exc
        except _http.TimeoutException as exc:
            raise UpstreamTimeout("the model server stopped answering mid-stream") from exc
        except _http.HTTPError as exc:
            raise UpstreamUnavailable(f"the model server stream broke: {exc}") from exc

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
