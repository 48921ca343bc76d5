"""The plan of a chat request: cache lookup -> single flight -> upstream relay -> write-back.

The pipeline knows nothing of HTTP, Redis keys or verification: it takes a validated request
and returns a result the transport turns into a response. Each step is another module's job:
``app/cache/layered.py`` (plan, lookup, write-back), ``app/singleflight.py`` (coalescing),
``app/relay.py`` (the upstream call) and ``app/stream.py`` (serving hits).
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from app.cache.layered import CacheMode, CachePlan, RequestCache
from app.cache.learning.receipts import ResponseIds
from app.cache.storage.contract import CacheHit, Candidate
from app.cache.storage.keys import canonicalize
from app.cache.storage.recent import RecentHits
from app.chat import ChatCall, ChatResult, Outcome
from app.errors import StrataError
from app.metrics import Metrics
from app.relay import Exchange, Relay
from app.settings import LimitSettings
from app.singleflight import SingleFlight
from app.stream import new_completion_id, serve_hit
from app.token_caps import TokenCaps
from app.wire import ChatCompletionRequest

logger = logging.getLogger("strata.pipeline")


class ChatPipeline:
    """Serves chat completions through the cache layers, in order, then the upstream.

    Args:
        limits: Token limits (default and cap of ``max_tokens``).
        cache: The layered cache.
        relay: The upstream relay.
        metrics: Where outcomes are counted.
        flight: Single flight across workers; ``None`` to ask the upstream for every miss.
        caps: L4, the learnt ``max_tokens`` of requests that name none; ``None``: the default.
        ids: Mints hits' response ids, which carry what served them; ``None``: plain ids.
        recent: Where semantic hits are kept for the console (in memory); ``None``: nowhere.
        max_checks: Checks of served hits (a hit's ``check``) asked of the model at once; more
            are dropped and counted, and the entry is checked at a later hit; 0 asks none.
    """

    def __init__(self, *, limits: LimitSettings, cache: RequestCache, relay: Relay, metrics: Metrics,
                 flight: SingleFlight | None = None, caps: TokenCaps | None = None,
                 ids: ResponseIds | None = None, recent: RecentHits | None = None, max_checks: int = 4) -> None:
        self._limits = limits
        self._recent = recent
        self._ids = ids
        self._caps = caps
        self._cache = cache
        self._relay = relay
        self._metrics = metrics
        self._flight = flight
        self._max_checks = max_checks
        self._checking: dict[str, asyncio.Task[None]] = {}  # entry -> its check in flight

    def named_max_tokens(self, request: ChatCompletionRequest) -> int | None:
        """The client's limit, never above the configured cap; ``None`` when it named none."""
        asked = request.max_completion_tokens or request.max_tokens
        return min(asked, self._limits.max_tokens_cap) if asked else None

    async def _upstream_max_tokens(self, call: ChatCall, named: int | None) -> tuple[int, bool]:
        """(the ``max_tokens`` to send upstream, whether L4 learnt it); asked only on the way upstream."""
        if named is not None:
            return named, False
        if self._caps is None:
            return min(self._limits.default_max_tokens, self._limits.max_tokens_cap), False
        return await self._caps.cap(call.category.name, call.request.model)

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
        named = self.named_max_tokens(request)
        plan = await self._plan(call, named)
        plan, hit = await self._cache.lookup(plan)
        if hit is not None:
            assert plan.query is not None  # a hit comes from a planned query
            # The id is the hit's receipt (app/cache/learning/receipts.py): feedback reads it, Redis is not written.
            response_id = self._ids.mint(plan.query, hit) if self._ids is not None else new_completion_id()
            result = serve_hit(hit, request, started, self._metrics, category=call.category.name, response_id=response_id,
                               tenant=call.tenant)
            if self._recent is not None:
                self._recent.add(plan.query, hit, response_id)
            if hit.check is not None:
                self._check_after(call, plan, hit.check, named)
            return result
        exchange = Exchange(body={}, stream=request.stream, plan=plan, started=started, category=call.category.name,
                            tenant=call.tenant, outcome=Outcome.MISS if plan.reads else Outcome.BYPASS)
        if self._flight is not None and plan.reads and plan.writes and plan.query is not None:
            query = plan.query
            try:
                exchange.ticket = await self._flight.coalesce(
                    self._cache.lease_key(query), lambda: self._cache.read_exact(query)
                )
            except StrataError:
                self._metrics.finish(Outcome.ERROR, started, call.category.name, tenant=call.tenant)
                raise
            if exchange.ticket.answer is not None:
                coalesced = CacheHit(layer="exact", completion=exchange.ticket.answer)
                return serve_hit(coalesced, request, started, self._metrics, coalesced=True,
                                 category=call.category.name, tenant=call.tenant)
        # Only the request that asks the model needs a limit; awaited after coalescing, so that no
        # round trip widens the window between a follower's lookup and its joining the leader.
        try:
            max_tokens, exchange.learnt_cap = await self._upstream_max_tokens(call, named)
        except BaseException:
            await exchange.finish(None)  # followers must not wait for a leader that never asks
            raise
        exchange.body = {k: v for k, v in call.raw.items() if k != "max_completion_tokens"}
        exchange.body["max_tokens"] = max_tokens
        if call.cache_salt is not None:
            exchange.body["cache_salt"] = call.cache_salt
        if request.stream:
            # The usage is part of the answer a later non-streamed hit returns: always ask for it.
            exchange.client_usage = bool(request.stream_options and request.stream_options.include_usage)
            options = call.raw.get("stream_options")
            exchange.body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return await self._relay.send(exchange)

    def _check_after(self, call: ChatCall, plan: CachePlan, candidate: Candidate, named: int | None) -> None:
        """Ask the model the served hit's question off the request path, once per entry at a
        time; its answer is stored as a miss's is, and the cache checks the entry with it."""
        assert plan.query is not None
        if candidate.root in self._checking or self._max_checks <= 0:
            return
        if len(self._checking) >= self._max_checks:
            self._metrics.intent_checks.labels(plan.query.category.name, "dropped").inc()
            return
        task = asyncio.create_task(self._check(call, msgspec.structs.replace(plan, candidate=candidate), named))
        self._checking[candidate.root] = task
        task.add_done_callback(lambda done: self._forget_check(candidate.root, done))

    def _forget_check(self, root: str, task: asyncio.Task[None]) -> None:
        if self._checking.get(root) is task:  # not a later check of the same entry
            del self._checking[root]

    async def _check(self, call: ChatCall, plan: CachePlan, named: int | None) -> None:
        assert plan.query is not None and plan.candidate is not None
        try:
            max_tokens, _ = await self._upstream_max_tokens(call, named)
            body = {k: v for k, v in call.raw.items() if k not in ("max_completion_tokens", "stream", "stream_options")}
            body["max_tokens"] = max_tokens
            if call.cache_salt is not None:
                body["cache_salt"] = call.cache_salt
            raw, completion = await self._relay.ask_aside(body)
        except StrataError as exc:
            # Unchecked, the entry is checked at its next hit; the hit served stays served.
            logger.warning("checking %s against the model failed: %s", plan.candidate.root, exc)
            self._metrics.intent_checks.labels(plan.query.category.name, "failed").inc()
            return
        # Stored as a miss's answer is (the asked wording joins the index), then compared with the
        # candidate's: an agreeing answer makes the wording an alias of the checked entry.
        await self._cache.store(plan, raw, completion)

    async def settle(self, *, observations: bool = True) -> None:
        """Wait for the work left after responses: write-backs and checks of served hits, then
        (unless told not to) the observations they start."""
        await self._relay.settle()
        while self._checking:
            await asyncio.wait(list(self._checking.values()))
            for root, task in list(self._checking.items()):
                if task.done():
                    self._forget_check(root, task)
        if observations:
            await self._cache.settle()

    async def _plan(self, call: ChatCall, max_tokens: int | None) -> CachePlan:
        if (call.request.n or 1) != 1:
            return CachePlan(CacheMode.UNCACHEABLE)  # several choices cannot be replayed as one
        if call.mode in (CacheMode.REFRESH_DENIED, CacheMode.NO_USER):
            self._metrics.uncached.labels(call.category.name, call.mode.value).inc()
            return CachePlan(call.mode)
        if call.mode is CacheMode.SKIP:
            return CachePlan(call.mode)
        canonical = canonicalize(call.request, call.raw, tenant=call.tenant, category=call.category.name,
                                 max_tokens=max_tokens, user=call.user)
        return await self._cache.plan(canonical, call.category, call.mode)
