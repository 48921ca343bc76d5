"""What ``strata replay --simulate`` runs in process: an own Redis Stack on a free port, and an
upstream that answers one answer per label, worded differently each time it is asked.

The test suite uses the same pieces (``ServerThread``, ``own_redis_stack``).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import msgspec
import uvicorn
from litestar import Litestar, Request, get, post

from app.cache.storage.keys import normalize_text
from app.replay.streams import WORDINGS, curated_answer, worded
from app.settings import PROJECT_ROOT, Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerThread:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        # As app.serve runs it with no trusted proxy: forwarding headers are not believed.
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", loop="asyncio",
                                proxy_headers=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def own_redis_stack(port: int | None = None, maxmemory: str = "256mb") -> Iterator[str]:
    """A Redis Stack of its own on a free port (never 6380), with a temporary data folder."""
    port = port or free_port()
    if port == 6380:
        raise ValueError("6380 is the make-up Redis: never used for a private one")
    data = tempfile.mkdtemp(prefix="strata-redis-")
    env = {"STACK_REDIS_PORT": str(port), "STACK_REDIS_DIR": data, "STACK_REDIS_MAXMEMORY": maxmemory}
    launcher = str(PROJECT_ROOT / "redis-stack" / "redis-stack.sh")
    env = {**os.environ, **env}
    subprocess.run([launcher, "start"], check=True, env=env, capture_output=True, text=True)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([launcher, "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(data, ignore_errors=True)


class LabelledUpstream:
    """An OpenAI-compatible upstream that knows the label of every question of a stream.

    Each label has one answer (its own guide number), worded by turns in one of four ways; a
    question it does not know gets an answer of its own.

    Args:
        labels: The label of each question text (normalised as Strata normalises).
    """

    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels
        self._asked: dict[str, int] = defaultdict(int)
        self.calls = 0

    def answer(self, question: str) -> str:
        label = self._labels.get(normalize_text(question), f"unknown:{question}")
        turn = self._asked[label]
        self._asked[label] += 1
        return worded(label, WORDINGS[turn % len(WORDINGS)])

    def app(self) -> Litestar:
        upstream = self

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request[Any, Any, Any]) -> bytes:
            body = msgspec.json.decode(await request.body())
            upstream.calls += 1
            question = body["messages"][-1].get("content") or ""
            content = upstream.answer(question if isinstance(question, str) else "")
            return msgspec.json.encode({
                "id": f"chatcmpl-sim{upstream.calls}", "object": "chat.completion", "created": 1700000000,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": len(content.split()), "total_tokens": 10},
            })

        @get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "simulated", "object": "model", "owned_by": "strata"}]}

        return Litestar([chat, models])


class Reviewer:
    """The console's reviewer, simulated: every ``1000 / per_thousand`` requests it settles the
    most asked item of the default tenant's queue, approving exactly when both questions carry
    the same label (what a person who knows the answers would say).

    Args:
        resources: The in-process Strata's resources.
        labels: Each question's label (normalised text).
        category: The category replayed.
        per_thousand: Items settled per 1,000 requests.
        settle: What else runs after each request (the observations settling).
    """

    def __init__(self, resources: Any, labels: dict[str, str], category: str, per_thousand: int,
                 settle: Any) -> None:
        self._resources = resources
        self._labels = labels
        self._category = category
        self._every = 1000 / per_thousand
        self._settle = settle
        self._requests = 0
        self._due = self._every
        self.settled = Counter[str]()

    async def after_each(self) -> None:
        await self._settle()
        self._requests += 1
        while self._requests >= self._due:
            self._due += self._every
            await self._settle_one()

    async def _settle_one(self) -> None:
        cache = self._resources.cache
        tag = cache.known_version
        if tag is None or not cache.each:
            return
        bucket = cache.each[cache.buckets.of("default", self._category)]
        items = await bucket.review.items(tag, self._category, "default", count=1)
        if not items or bucket.learner is None:
            self.settled["empty"] += 1
            return
        item = items[0]
        asked, cached = self._labels.get(normalize_text(item.asked)), self._labels.get(normalize_text(item.cached))
        if asked is not None and cached is not None:
            policy = self._resources.policy.categories[self._category].semantic
            await bucket.learner.settle_review(tag, item, asked == cached, policy)
            self.settled["approved" if asked == cached else "rejected"] += 1
        else:
            self.settled["unlabelled"] += 1
        # Settled or not, a reviewer moves on (and is not asked the same pair again).
        await bucket.review.remove(tag, item, "reviewed" if asked is not None and cached is not None else "unlabelled")


class InMemorySpans:
    """The simulation's traces, kept in memory and read request by request."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()

    def decision(self) -> str:
        """The last request's semantic decision (``verdict|rule|similarity|set_aside|beyond``: the
        nearest row's similarity when no rule ruled, the reasons of the rows set aside, the rows
        looked at beyond the band), and the spans forgotten."""
        from app import tracing

        found = ""
        for span in self.exporter.get_finished_spans():
            if span.name == tracing.DECIDE and span.attributes is not None:
                said = span.attributes
                found = "|".join(str(said.get(name, "")) for name in (tracing.VERDICT, tracing.RULE, tracing.SIMILARITY,
                                                                      tracing.SET_ASIDE, tracing.BEYOND))
        self.exporter.clear()
        return found


def run_simulated(stream: list[Any], *, settings: Settings, category: str, encoder: Any = None,
                  faq: list[Any] | None = None, feedback: float = 0.0, judge: str = "",
                  judge_error: float = 0.0, review: int = 0, reader: Any = None, intents: list[Any] | None = None,
                  decisions: bool = False) -> Any:
    """Replay a stream through an in-process Strata over an own, empty Redis Stack and the
    labelled upstream; observations settle after every request, so the counts are the same
    on every run of the same stream.

    Args:
        stream: The requests (``app.replay.streams.Request``).
        settings: The settings to start from (policy file, embedder); Redis, upstream and
            timing settings are the simulation's own.
        category: The category to ask in.
        encoder: An already loaded embedding model (tests share one).
        judge: ``oracle``: the grey zone's reader answers from the stream's labels (for categories
            with ``semantic.reader``); "": the configured reader, if any.
        judge_error: The oracle's share of wrong verdicts, drawn at random (seeded).
        review: Review-queue items a simulated reviewer settles per 1,000 requests, the most asked
            first, approving exactly when the stream's labels agree (the console's reviewer).
        reader: A reader to use as it is (``docs/experiments/bench/reader_record.py`` recorded one's verdicts);
            else ``judge``, else the configured one.
        decisions: Trace every request in memory and keep its semantic decision on its outcome
            (``verdict:rule``; "" for a request that made none, an exact hit).

    Returns:
        The ``app.replay.run.Report``.
    """
    import asyncio

    import httpx

    from app.asgi import create_app
    from app.replay.run import replay

    for noisy in ("httpx", "httpx2"):  # one line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    upstream = LabelledUpstream({normalize_text(r.text): r.label for r in stream})
    with own_redis_stack() as redis_url, ServerThread(upstream.app()) as model_server:
        simulated = msgspec.structs.replace(
            settings,
            log_level="warning",
            keys_file="",
            # Wall-clock bounds would make a slow moment a bypass: the simulation counts decisions.
            lookup_timeout_s=30.0,
            redis=msgspec.structs.replace(settings.redis, url=redis_url, timeout_s=5.0),
            upstream=msgspec.structs.replace(settings.upstream, url=model_server.url + "/v1", max_retries=0),
            semantic=msgspec.structs.replace(settings.semantic, enabled=True, learning_refresh_s=0.0),
        )
        if reader is not None and judge:
            raise ValueError("a reader or a simulated judge, not both")
        if judge == "oracle":
            from app.cache.readers.oracle import OracleReader

            reader = OracleReader({normalize_text(r.text): r.label for r in stream}, error=judge_error)
        elif judge:
            raise ValueError(f"unknown simulated judge {judge!r} (oracle)")
        spans = InMemorySpans() if decisions else None
        app = create_app(simulated, encoder=encoder, reader=reader,
                         span_exporter=spans.exporter if spans is not None else None)

        async def go() -> Any:
            # The app on this very event loop (ASGI, no socket), so the replay can let its
            # background observations settle between requests.
            # Litestar's ASGI signature is narrower than httpx's transport asks for; it is an ASGI app.
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://strata", timeout=60) as client:
                resources = app.state.resources
                known = {}
                if faq:
                    from app.faq import load_faq_in_buckets

                    await load_faq_in_buckets(resources.cache, faq, "replay", resources.policy)
                    # A curated answer is right for its own label's questions; one of a label
                    # the stream never asks about is wrong for all of them.
                    known = {curated_answer(r.label): r.label for r in stream}
                    for item in faq:
                        known.setdefault(item.answer, f"faq:{item.question}")
                if intents:
                    from app.intents import load_intents

                    loaded = await load_intents(resources.cache, resources.policy, intents, tenant="default",
                                                category=category, name="replay")
                    print(loaded.line())
                    assert resources.cache.intents is not None
                    await resources.cache.intents.refresh()
                    for item in intents:  # a team's answer is right for its own intent's questions
                        if item.answer is not None:
                            known.setdefault(item.answer, item.intent)
                labels = {normalize_text(r.text): r.label for r in stream}
                settle = resources.pipeline.settle
                reviewer = Reviewer(resources, labels, category, review, settle) if review else None
                report = await replay(stream, client, model="simulated", category=category,
                                      after_each=reviewer.after_each if reviewer else settle,
                                      known_answers=known, feedback=feedback,
                                      decision_of=spans.decision if spans is not None else None)
                report.model_calls = upstream.calls
                bucket = resources.cache.each[0].bucket
                tag = await resources.cache.each[0].versions.refresh()
                pooled = await bucket.redis.hgetall(bucket.keys.observations_key(tag, category, "default"))
                report.pool = {k.decode() if isinstance(k, bytes) else str(k): int(v) for k, v in pooled.items()}
                if reviewer is not None:
                    report.reviews = {"approved": reviewer.settled["approved"], "rejected": reviewer.settled["rejected"],
                                      "unlabelled": reviewer.settled["unlabelled"], "queue_empty": reviewer.settled["empty"]}
                return report

        return asyncio.run(go())
