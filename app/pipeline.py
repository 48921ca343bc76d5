"""The layered lookup: exact -> semantic -> upstream -> write-back.

The pipeline knows nothing of HTTP: it takes a validated request and returns a result the
transport layer turns into a response. Cache failures never fail a request: they are logged,
counted, and the request goes on as a bypass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
from redis.exceptions import RedisError
from redisvl.exceptions import RedisVLError

from app.cache.base import CacheHit, CacheLayer, CacheQuery, CorruptEntry, EmbeddingFailed
from app.cache.exact import StaleVersion
from app.cache.keys import canonicalize, lease_key
from app.cache.verify import VERIFIED
from app.cache.version import VersionTag
from app.errors import StrataError, UpstreamUnavailable
from app.judge import AnswerJudge
from app.metrics import Metrics
from app.policy import CategoryPolicy
from app.settings import Settings
from app.singleflight import SingleFlight
from app.stream import SSE_DONE, StreamAssembler, decode_completion, refresh_identity, replay_chunks, sse_event
from app.upstream import Upstream
from app.wire import ChatCompletionRequest, ErrorDetail, ErrorResponse, completion_decoder, json_encoder

logger = logging.getLogger("strata.pipeline")

OUTCOME_EXACT = "exact-hit"
OUTCOME_SEMANTIC = "semantic-hit"
OUTCOME_MISS = "miss"
OUTCOME_BYPASS = "bypass"
_HIT_OUTCOMES = {"exact": OUTCOME_EXACT, "semantic": OUTCOME_SEMANTIC}

# Cache-side failures: Redis errors and timeouts, the embedder. Anything else is a bug and propagates.
CACHE_ERRORS = (RedisError, RedisVLError, OSError, TimeoutError, EmbeddingFailed, CorruptEntry)


class ChatCall(msgspec.Struct, frozen=True, kw_only=True):
    """A validated chat request and how the client wants it cached.

    Attributes:
        request: The validated request.
        raw: The request body as received; its unknown fields pass through to the upstream.
        tenant: The tenant the request is served for.
        category: The content category's policy.
        lookup: Whether the cache may be read (false for ``Cache-Control: no-cache``/``no-store``).
        store: Whether the answer may be stored (false for ``no-store``).
    """

    request: ChatCompletionRequest
    raw: dict[str, Any]
    tenant: str
    category: CategoryPolicy
    lookup: bool = True
    store: bool = True


class ChatResult(msgspec.Struct, kw_only=True):
    """What the transport sends back: a JSON body or an SSE stream, and the cache headers."""

    outcome: str
    headers: dict[str, str]
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None


class ChatPipeline:
    """Serves chat completions through the cache layers, in order, then the upstream."""

    def __init__(
        self,
        *,
        settings: Settings,
        versions: VersionTag,
        layers: Sequence[CacheLayer],
        upstream: Upstream,
        metrics: Metrics,
        flight: SingleFlight | None = None,
        judge: AnswerJudge | None = None,
    ) -> None:
        self._settings = settings
        self._versions = versions
        self._layers = list(layers)
        self._flight = flight
        self._upstream = upstream
        self._metrics = metrics
        self._judge = judge

    def effective_max_tokens(self, request: ChatCompletionRequest) -> int:
        """The client's limit (or the default), never above the configured cap."""
        asked = request.max_completion_tokens or request.max_tokens or self._settings.default_max_tokens
        return min(asked, self._settings.max_tokens_cap)

    async def handle(self, call: ChatCall) -> ChatResult:
        """Answer one chat request.

        Args:
            call: The validated request.

        Returns:
            The result, its outcome among exact-hit, semantic-hit, miss and bypass.

        Raises:
            StrataError: The upstream failed before anything was sent to the client.
        """
        started = time.perf_counter()
        request = call.request
        max_tokens = self.effective_max_tokens(request)
        body = {k: v for k, v in call.raw.items() if k != "max_completion_tokens"}
        body["max_tokens"] = max_tokens

        # Several choices cannot be replayed as one; such requests skip the cache.
        cacheable = (request.n or 1) == 1
        query: CacheQuery | None = None
        if cacheable and (call.lookup or call.store):
            canonical = canonicalize(
                request, call.raw, tenant=call.tenant, category=call.category.name, max_tokens=max_tokens
            )
            query = await self._query(canonical, call.category)

        if query is not None and call.lookup:
            query, hit, available = await self._lookup(query)
            if hit is not None:
                return self._serve_hit(hit, request, started)
            if not available:
                query = None  # Redis is failing: do not try to store either
        outcome = OUTCOME_MISS if query is not None and call.lookup else OUTCOME_BYPASS
        if self._flight is not None and query is not None and call.lookup and call.store:
            return await self._single_flight(self._flight, body, query, request, outcome, started)
        return await self._ask_upstream(body, query if call.store else None, request.stream, outcome, started)

    # --- single flight -----------------------------------------------------------------------

    async def _single_flight(
        self, flight: SingleFlight, body: dict[str, Any], query: CacheQuery, request: ChatCompletionRequest,
        outcome: str, started: float,
    ) -> ChatResult:
        """Ask the upstream once for identical concurrent misses; the others get the same answer."""
        key = lease_key(query.version, query.canonical.exact_digest)
        leader = flight.follow_local(key)
        if leader is not None:
            answer = await asyncio.shield(leader)
            if isinstance(answer, StrataError):
                self._finish("error", started)
                raise answer
            if answer is not None:
                return self._serve_coalesced(answer, request, started, "local")
            return await self._ask_upstream(body, query, request.stream, outcome, started)
        future = flight.lead_local(key)
        lease = None
        try:
            lease = await flight.acquire(key)
            if lease is None:  # another worker is asking the model: wait for its answer
                answer = await flight.wait(key, lambda: self._read_exact(query))
                if answer is not None:
                    flight.finish_local(key, future, answer)
                    return self._serve_coalesced(answer, request, started, "remote")
                lease = await flight.acquire(key)  # it is gone without an answer: lead instead
        except CACHE_ERRORS as exc:
            self._cache_failed("singleflight", "lease", exc)  # go on uncoordinated
        except BaseException:
            flight.finish_local(key, future, None)
            raise
        self._metrics.singleflight.labels("leader").inc()

        async def finish(answer: bytes | StrataError | None) -> None:
            flight.finish_local(key, future, answer)
            if lease is not None:
                try:
                    await lease.release()
                except CACHE_ERRORS as exc:
                    self._cache_failed("singleflight", "release", exc)  # it expires by itself

        try:
            return await self._ask_upstream(body, query, request.stream, outcome, started, finish)
        except StrataError as exc:
            await finish(exc)
            raise
        except BaseException:
            await finish(None)
            raise

    async def _read_exact(self, query: CacheQuery) -> bytes | None:
        try:
            hit = await self._layers[0].lookup(query)
        except StaleVersion:
            return None  # invalidated while waiting: the leader's answer will not be stored
        return None if hit is None else hit.completion

    def _serve_coalesced(self, answer: bytes, request: ChatCompletionRequest, started: float, where: str) -> ChatResult:
        self._metrics.singleflight.labels(f"follower_{where}").inc()
        result = self._serve_hit(CacheHit(layer="exact", completion=answer), request, started)
        result.headers["X-Cache-Coalesced"] = "true"
        return result

    async def _ask_upstream(
        self, body: dict[str, Any], query: CacheQuery | None, stream: bool, outcome: str, started: float,
        on_done: Callable[[bytes | StrataError | None], Awaitable[None]] | None = None,
    ) -> ChatResult:
        if stream:
            return await self._relay(body, query, outcome, started, on_done)
        return await self._complete(body, query, outcome, started, on_done)

    # --- lookup ------------------------------------------------------------------------------

    async def _query(self, canonical: Any, category: CategoryPolicy) -> CacheQuery | None:
        version = self._versions.known
        if version is None:
            try:
                version = await self._versions.refresh()
            except CACHE_ERRORS as exc:
                self._cache_failed("version", "read", exc)
                return None
        return CacheQuery(canonical=canonical, category=category, version=version)

    async def _lookup(self, query: CacheQuery) -> tuple[CacheQuery, CacheHit | None, bool]:
        """Ask each layer in turn.

        Returns:
            The query as finally used (its version may have moved on), the hit, and whether
            the cache was available.
        """
        for layer in self._layers:
            try:
                async with asyncio.timeout(self._settings.lookup_timeout_s):
                    try:
                        hit = await layer.lookup(query)
                    except StaleVersion as stale:
                        # Another worker bumped the version: adopt it and look again, once.
                        tag = self._versions.observe(stale.current) or await self._versions.refresh()
                        query = msgspec.structs.replace(query, version=tag)
                        hit = await layer.lookup(query)
            except CACHE_ERRORS as exc:
                self._cache_failed(layer.name, "lookup", exc)
                return query, None, False
            if hit is not None:
                completion = decode_completion(hit.completion)
                if completion is None:
                    self._cache_failed(layer.name, "lookup", CorruptEntry(f"{layer.name} entry is not a completion"))
                    hit = None  # a miss: the fresh answer overwrites the entry
                else:
                    hit = msgspec.structs.replace(hit, decoded=completion)
            if hit is not None and hit.reason == VERIFIED and query.category.semantic.judge:
                hit = await self._judged(query, hit)
            self._metrics.lookups.labels(layer.name, "hit" if hit else "miss").inc()
            if hit is not None:
                return query, hit, True
        return query, None, True

    async def _judged(self, query: CacheQuery, hit: CacheHit) -> CacheHit | None:
        """The hit if the LLM judge confirms it; ``None`` (a miss) if it says no or fails."""
        if self._judge is None or query.canonical.question is None or hit.matched_question is None:
            return None  # the policy asks for a judge that is not there: do not serve unconfirmed
        verdict = await self._judge.confirm(query.canonical.question, hit.matched_question, query.canonical.model)
        self._metrics.verifications.labels("accept" if verdict.accepted else "reject", verdict.reason).inc()
        return msgspec.structs.replace(hit, reason=verdict.reason) if verdict.accepted else None

    def _serve_hit(self, hit: CacheHit, request: ChatCompletionRequest, started: float) -> ChatResult:
        outcome = _HIT_OUTCOMES[hit.layer]
        # Lookups hand over the completion already decoded; a coalesced answer is decoded here.
        decoded = hit.decoded if hit.decoded is not None else completion_decoder.decode(hit.completion)
        completion = refresh_identity(decoded)
        headers = {"X-Cache": outcome}
        if hit.similarity is not None:
            headers["X-Cache-Similarity"] = f"{hit.similarity:.3f}"
        if hit.reason is not None:
            headers["X-Cache-Verdict"] = hit.reason
        self._finish(outcome, started)
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return ChatResult(outcome=outcome, headers=headers, stream=_iterate(replay_chunks(completion, include_usage=include_usage)))
        return ChatResult(outcome=outcome, headers=headers, body=json_encoder.encode(completion))

    # --- upstream and write-back -------------------------------------------------------------

    async def _complete(
        self, body: dict[str, Any], query: CacheQuery | None, outcome: str, started: float,
        on_done: Callable[[bytes | None], Awaitable[None]] | None = None,
    ) -> ChatResult:
        try:
            raw, completion = await self._upstream.complete(body)
        except StrataError:
            self._metrics.upstream_requests.labels("error").inc()
            self._finish("error", started)
            raise
        self._metrics.upstream_requests.labels("ok").inc()
        self._count_tokens(completion.get("usage"))
        if query is not None:
            await self._store(query, raw, completion)
        if on_done is not None:
            await on_done(raw)
        self._finish(outcome, started)
        return ChatResult(outcome=outcome, headers={"X-Cache": outcome}, body=raw)

    async def _relay(
        self, body: dict[str, Any], query: CacheQuery | None, outcome: str, started: float,
        on_done: Callable[[bytes | None], Awaitable[None]] | None = None,
    ) -> ChatResult:
        chunks = self._upstream.stream(body).__aiter__()
        # Wait for the first chunk, so that an upstream that is down answers with a real
        # 502/504 status instead of a broken 200 stream.
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = None
        except StrataError:
            self._metrics.upstream_requests.labels("error").inc()
            self._finish("error", started)
            raise
        return ChatResult(
            outcome=outcome,
            headers={"X-Cache": outcome},
            stream=self._relay_rest(first, chunks, query, outcome, started, on_done),
        )

    async def _relay_rest(
        self, first: bytes | None, chunks: AsyncIterator[bytes], query: CacheQuery | None, outcome: str,
        started: float, on_done: Callable[[bytes | None], Awaitable[None]] | None,
    ) -> AsyncIterator[bytes]:
        assembler = StreamAssembler()
        answer: bytes | None = None
        try:
            try:
                if first is not None:
                    assembler.add(first)
                    yield sse_event(first)
                    async for payload in chunks:
                        assembler.add(payload)
                        yield sse_event(payload)
            except (StrataError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                if not isinstance(exc, StrataError):
                    exc = UpstreamUnavailable(f"the model server sent a malformed chunk: {exc}")
                # Headers are gone already: report in-band, as OpenAI does, and store nothing.
                self._metrics.upstream_requests.labels("error").inc()
                self._finish("error", started)
                detail = ErrorDetail(message=exc.message, type=exc.error_type, code=exc.code)
                yield sse_event(json_encoder.encode(ErrorResponse(error=detail)))
                return
            self._metrics.upstream_requests.labels("ok").inc()
            self._count_tokens(assembler.usage)
            completion = assembler.completion()
            answer = json_encoder.encode(completion)
            if query is not None:
                await self._store(query, answer, completion)
            self._finish(outcome, started)
            yield SSE_DONE
        finally:
            # Also when the client went away mid-stream: followers must not wait for nothing.
            if on_done is not None:
                await on_done(answer if assembler.complete else None)

    async def _store(self, query: CacheQuery, raw: bytes, completion: dict[str, Any]) -> None:
        """Write a complete answer to every layer; anything else is not cached."""
        choices = completion.get("choices") or []
        if not choices or any(c.get("finish_reason") != "stop" for c in choices):
            self._skip_store("skipped_incomplete")
            return
        # The answer took seconds to generate: if the cache was invalidated meanwhile, it was
        # generated for a world that no longer holds, and must not be cached under any version.
        try:
            current = await self._versions.refresh()
        except CACHE_ERRORS as exc:
            self._cache_failed("version", "read", exc)
            return
        if current != query.version:
            self._skip_store("skipped_stale_version")
            return
        for layer in self._layers:
            try:
                await layer.store(query, raw)
            except CACHE_ERRORS as exc:
                self._cache_failed(layer.name, "store", exc)
                continue
            self._metrics.stores.labels(layer.name, "stored").inc()

    # --- bookkeeping -------------------------------------------------------------------------

    def _skip_store(self, reason: str) -> None:
        for layer in self._layers:
            self._metrics.stores.labels(layer.name, reason).inc()

    def _cache_failed(self, layer: str, operation: str, exc: BaseException) -> None:
        logger.warning("cache %s %s failed, treated as a miss: %r", layer, operation, exc)
        self._metrics.cache_errors.labels(layer, operation).inc()

    def _count_tokens(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for kind in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(kind), int):
                    self._metrics.upstream_tokens.labels(kind.removesuffix("_tokens")).inc(usage[kind])

    def _finish(self, outcome: str, started: float) -> None:
        self._metrics.requests.labels(outcome).inc()
        self._metrics.latency.labels(outcome).observe(time.perf_counter() - started)


async def _iterate(events: Any) -> AsyncIterator[bytes]:
    for event in events:
        yield event
