"""Relaying a request to the model server: the complete answer or its SSE stream, token counts,
write-back of complete answers, and handing the answer to single-flight followers.

The write-back runs after the response has gone out: a miss's client waits for the model, not
for Redis. Nothing is lost by it: the request's single-flight lease is released only once the
answer is stored, so an identical request arriving meanwhile waits for this answer instead of
asking the model again, in this worker or any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from app.cache.layered import CachePlan, RequestCache
from app.chat import ChatResult, Outcome
from app.errors import StrataError, UpstreamUnavailable
from app.metrics import Metrics
from app.singleflight import Ticket
from app.stream import StreamAssembler, sse_event
from app.token_caps import TokenCaps
from app.upstream import Upstream
from app.wire import SSE_DONE, ErrorDetail, ErrorResponse, json_encoder

logger = logging.getLogger("strata.relay")


class Exchange(msgspec.Struct, kw_only=True):
    """One request on its way to the model, with everything its answer is owed to.

    Attributes:
        body: The body sent upstream (``max_tokens`` capped, pass-through fields kept).
        stream: Whether the client asked for SSE.
        plan: The cache plan; a complete answer is written back when it ``writes``.
        outcome: ``miss`` or ``bypass``, as the response will say.
        started: When the request arrived (``perf_counter``).
        category: The content category's name.
        tenant: The tenant it is asked for (``None``: not counted per tenant).
        learnt_cap: Whether ``max_tokens`` is L4's learnt cap (its cuts are counted).
        ticket: The single-flight ticket to finish with the answer, if the request leads.
        client_usage: Whether a streaming client asked for the usage chunk itself (Strata always
            asks the model for it, to store the usage; the client gets it only if it asked).
    """

    body: dict[str, Any]
    stream: bool
    plan: CachePlan
    outcome: Outcome
    started: float
    category: str = ""
    tenant: str | None = None
    learnt_cap: bool = False
    ticket: Ticket | None = None
    client_usage: bool = False

    async def finish(self, answer: bytes | StrataError | None) -> None:
        if self.ticket is not None:
            await self.ticket.finish(answer)


class Relay:
    """Asks the upstream for one exchange and writes its complete answer back."""

    def __init__(self, upstream: Upstream, cache: RequestCache, metrics: Metrics, caps: TokenCaps | None = None) -> None:
        self._upstream = upstream
        self._cache = cache
        self._metrics = metrics
        self._caps = caps
        self._writing: set[asyncio.Task[None]] = set()

    def _answered(self, exchange: Exchange, raw: bytes, completion: dict[str, Any], handoff: bytes | None) -> None:
        """Book an upstream answer (tokens) and write it back once the response is out; then
        hand ``handoff`` (the answer, or ``None``: followers ask by themselves) to followers."""
        self._metrics.upstream_requests.labels("ok").inc()
        self._metrics.count_tokens(completion.get("usage"))
        # Started now, it runs when the request's task next waits, which is after the response
        # has been written (sending a response this size does not wait).
        task = asyncio.create_task(self._write_back(exchange, raw, completion, handoff))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _write_back(self, exchange: Exchange, raw: bytes, completion: dict[str, Any], handoff: bytes | None) -> None:
        """Store the answer and L4's length statistics, then hand it to single-flight followers
        and release the lease (always, so that nobody waits for a write that failed)."""
        try:
            stores = [self._cache.store(exchange.plan, raw, completion)]
            if self._caps is not None:
                stores.append(self._caps.observe(exchange.category, str(exchange.body.get("model", "")), completion,
                                                 exchange.learnt_cap))
            # Independent round trips, each handling its own failures: side by side.
            await asyncio.gather(*stores)
        except Exception:  # a bug, not a cache failure (those are handled inside): never silent
            self._metrics.cache_errors.labels("writeback", "store").inc()
            logger.exception("write-back of an answer failed")
        finally:
            await exchange.finish(handoff)

    async def settle(self) -> None:
        """Wait for the write-backs in flight (shutdown, replays that must be deterministic); a
        waiter that is cancelled leaves them running (``wait``, unlike ``gather``, cancels nothing)."""
        while self._writing:
            await asyncio.wait(list(self._writing))

    async def send(self, exchange: Exchange) -> ChatResult:
        """The upstream's answer as a result (JSON, or a stream that is relayed as it comes).

        Raises:
            StrataError: The upstream failed before anything was sent to the client.
        """
        try:
            if exchange.stream:
                return await self._open_stream(exchange)
            return await self._complete(exchange)
        except StrataError as exc:
            await exchange.finish(exc)
            raise
        except BaseException:
            await exchange.finish(None)
            raise

    async def ask_aside(self, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The upstream's complete answer (raw, decoded) to a body asked off the request path (a
        check of a served hit): booked as an upstream request; the caller stores it.

        Raises:
            StrataError: The upstream failed.
        """
        try:
            raw, completion = await self._upstream.complete(body)
        except StrataError:
            self._metrics.upstream_requests.labels("error").inc()
            raise
        self._metrics.upstream_requests.labels("ok").inc()
        return raw, completion

    def _failed(self, exchange: Exchange) -> None:
        self._metrics.upstream_requests.labels("error").inc()
        self._metrics.finish(Outcome.ERROR, exchange.started, exchange.category, tenant=exchange.tenant)

    async def _complete(self, exchange: Exchange) -> ChatResult:
        called = time.perf_counter()
        try:
            raw, completion = await self._upstream.complete(exchange.body)
        except StrataError:
            self._failed(exchange)
            raise
        upstream_s = time.perf_counter() - called
        self._answered(exchange, raw, completion, raw)
        self._metrics.finish(exchange.outcome, exchange.started, exchange.category, tenant=exchange.tenant)
        if exchange.outcome == Outcome.MISS:
            self._metrics.miss_overhead.observe(time.perf_counter() - exchange.started - upstream_s)
        return ChatResult(outcome=exchange.outcome, headers=_headers(exchange), body=raw)

    async def _open_stream(self, exchange: Exchange) -> ChatResult:
        chunks = self._upstream.stream(exchange.body).__aiter__()
        # Wait for the first chunk, so that an upstream that is down answers with a real
        # 502/504 status instead of a broken 200 stream.
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = None
        except StrataError:
            self._failed(exchange)
            raise
        if first is None:  # a stream of nothing is no answer: say so with a real status
            self._failed(exchange)
            raise UpstreamUnavailable("the model server's stream carried no chunk")
        return ChatResult(
            outcome=exchange.outcome,
            headers=_headers(exchange),
            stream=self._relay(first, chunks, exchange),
        )

    async def _relay(self, first: bytes | None, chunks: AsyncIterator[bytes], exchange: Exchange) -> AsyncIterator[bytes]:
        assembler = StreamAssembler()
        answered = False
        try:
            try:
                if first is not None:
                    assembler.add(first)
                    yield sse_event(first)
                    async for payload in chunks:
                        chunk = assembler.add(payload)
                        if not chunk.choices and chunk.usage is not None and not exchange.client_usage:
                            continue  # asked for the cache's sake: this client did not ask for it
                        yield sse_event(payload)
            except (StrataError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                if not isinstance(exc, StrataError):
                    exc = UpstreamUnavailable(f"the model server sent a malformed chunk: {exc}")
                # Headers are gone already: report in-band, as OpenAI does, and store nothing.
                self._failed(exchange)
                detail = ErrorDetail(message=exc.message, type=exc.error_type, code=exc.code)
                yield sse_event(json_encoder.encode(ErrorResponse(error=detail)))
                return
            if not assembler.finished:
                # Every choice must end with a finish reason: a stream cut short is no answer.
                self._failed(exchange)
                error = UpstreamUnavailable("the model server's stream ended before every choice finished")
                detail = ErrorDetail(message=error.message, type=error.error_type, code=error.code)
                yield sse_event(json_encoder.encode(ErrorResponse(error=detail)))
                return
            completion = assembler.completion()
            answer = json_encoder.encode(completion)
            self._answered(exchange, answer, completion, answer if assembler.complete else None)
            answered = True  # the write-back finishes the exchange
            self._metrics.finish(exchange.outcome, exchange.started, exchange.category, tenant=exchange.tenant)
            yield sse_event(SSE_DONE)
        finally:
            # Also when the client went away mid-stream: followers must not wait for nothing.
            if not answered:
                await exchange.finish(None)


def _headers(exchange: Exchange) -> dict[str, str]:
    return {"X-Cache": exchange.outcome.value, "X-Cache-Source": "model"}
