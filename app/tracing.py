"""OpenTelemetry traces of the request path (issue #57), off unless an endpoint is configured.

One server span per request (the HTTP semantic conventions), with a child span for each step:
the exact lookup, the semantic lookup with its embedding, KNN query and deciding rule (the rule,
the candidate's similarity, the verdict; the questions' text only with
``STRATA_OTEL_CAPTURE_TEXT``), the model call (the GenAI conventions; the W3C ``traceparent`` is
passed on to vLLM) and the write-back. A client's ``traceparent`` is continued.

Each app has its own :class:`Tracing`; the request's middleware makes it the active one for that
request's context (a context variable, as OpenTelemetry parents spans), so the steps below find
it without being handed it, and background work started by the request (the write-back) is
parented too. With tracing off no middleware is installed and :func:`span` returns one shared
no-op context manager: nothing is created, nothing is read beyond one context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the SDK is imported only when tracing is configured
    from litestar.types import ASGIApp, Receive, Scope, Send
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from app.settings import Settings

# Attribute names (OpenTelemetry semantic conventions where one fits, ``strata.*`` otherwise).
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
URL_PATH = "url.path"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_RESULT = "strata.cache.result"  # exact-hit, semantic-hit, miss, bypass (the X-Cache header)
CACHE_LAYER = "strata.cache.layer"
CACHE_HIT = "strata.cache.hit"
CATEGORY = "strata.category"
RULE = "strata.decision.rule"
VERDICT = "strata.decision.verdict"
SIMILARITY = "strata.decision.similarity"
# The rows the decision set aside (their reasons, in order) and the rows it looked at beyond the band.
SET_ASIDE = "strata.decision.set_aside"
BEYOND = "strata.decision.beyond_band"
CANDIDATES = "strata.knn.candidates"
QUESTION = "strata.question"  # only with STRATA_OTEL_CAPTURE_TEXT
CACHED_QUESTION = "strata.cached_question"  # likewise

# Span names of the steps (a layer's lookup is "strata.lookup <layer>").
EMBED = "strata.embed"
KNN = "strata.knn"
DECIDE = "strata.decide"
WRITE_BACK = "strata.write_back"

# The paths whose name is the span's (others are one name per method: no unbounded span names).
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings",
           "/v1/feedback", "/v1/models", "/health", "/metrics")
if TYPE_CHECKING:
    from opentelemetry.trace import Span as Span
else:
    Span = Any  # for the annotations of other modules, without importing OpenTelemetry when off

_ACTIVE: contextvars.ContextVar[Tracing | None] = contextvars.ContextVar("strata_tracing", default=None)
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class Tracing:
    """One app's tracer, its exporter and what it may record.

    Args:
        exporter: Where finished spans go (OTLP/HTTP in production, an in-memory one in tests).
        service_name: ``service.name`` of the resource.
        capture_text: Whether questions' text may be span attributes (off: never).
        batch: Export in batches off the request path (production); ``False`` exports each span
            as it ends (tests).
    """

    def __init__(self, exporter: SpanExporter, *, service_name: str = "strata", capture_text: bool = False,
                 batch: bool = True) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        # A provider of Strata's own, not the process-wide one: each app (and each test's) traces apart.
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        self.tracer: Tracer = self.provider.get_tracer("strata")
        self.capture_text = capture_text

    @classmethod
    def from_settings(cls, settings: Settings, exporter: SpanExporter | None = None) -> Tracing | None:
        """Tracing as configured: an OTLP/HTTP exporter to ``STRATA_OTEL_ENDPOINT`` (or the
        standard ``OTEL_EXPORTER_OTLP_ENDPOINT``), or ``exporter`` when given; ``None`` when off."""
        if exporter is not None:
            return cls(exporter, service_name=settings.otel_service_name, capture_text=settings.otel_capture_text,
                       batch=False)
        if not settings.otel_endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otel_endpoint.rstrip("/")
        traces = endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
        return cls(OTLPSpanExporter(endpoint=traces), service_name=settings.otel_service_name,
                   capture_text=settings.otel_capture_text)

    def shutdown(self) -> None:
        """Export what is pending and stop (the app's shutdown)."""
        self.provider.shutdown()

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """The ASGI middleware that opens each HTTP request's server span."""
        return _TraceRequests(app, self)


class _TraceRequests:
    """The server span of each request, continuing the client's ``traceparent``; the status and
    the cache's answer (``X-Cache``) are set on it as the response starts."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self._app = app
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if str(scope["type"]) != "http":
            await self._app(scope, receive, send)
            return
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind, StatusCode

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method, path = str(scope.get("method", "GET")), str(scope.get("path", ""))
        route = path if path in _ROUTES else None
        attributes: dict[str, Any] = {HTTP_METHOD: method, URL_PATH: path}
        if route is not None:
            attributes[HTTP_ROUTE] = route
        token = _ACTIVE.set(self._tracing)
        try:
            with self._tracing.tracer.start_as_current_span(
                    f"{method} {route}" if route else method, context=extract(headers), kind=SpanKind.SERVER,
                    attributes=attributes) as span:

                async def traced_send(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        status = int(message["status"])
                        span.set_attribute(HTTP_STATUS, status)
                        if status >= 500:
                            span.set_status(StatusCode.ERROR)
                        for name, value in message.get("headers") or []:
                            if name.lower() == b"x-cache":
                                span.set_attribute(CACHE_RESULT, value.decode("latin-1"))
                    await send(message)

                await self._app(scope, receive, traced_send)
        finally:
            _ACTIVE.reset(token)


def active() -> Tracing | None:
    """The tracing of the request being served (``None``: off)."""
    return _ACTIVE.get()


def span(name: str, attributes: Mapping[str, Any] | None = None, *,
         client: bool = False) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current one for one step, or a shared no-op when tracing is off.

    Use as ``with span(...) as step:``; ``step`` is ``None`` when off, so set attributes through
    :func:`note`."""
    tracing = _ACTIVE.get()
    if tracing is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    return tracing.tracer.start_as_current_span(name, attributes=dict(attributes or {}),
                                                kind=SpanKind.CLIENT if client else SpanKind.INTERNAL)


def note(step: Span | None, attributes: Mapping[str, Any], *, text: Mapping[str, str] | None = None) -> None:
    """Set attributes on a step's span (nothing when off; callers on the request path check
    ``step`` first, so that nothing is built for a span that is not there); ``text`` (questions)
    only where the operator opted in."""
    if step is None:
        return
    step.set_attributes({k: v for k, v in attributes.items() if v is not None})
    tracing = _ACTIVE.get()
    if text and tracing is not None and tracing.capture_text:
        step.set_attributes(dict(text))


def propagation_headers(step: Span | None = None) -> dict[str, str]:
    """The W3C trace context of ``step`` (else of the current span), for the model server;
    empty when off."""
    if _ACTIVE.get() is None:
        return {}
    from opentelemetry.propagate import inject
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    inject(carrier, context=set_span_in_context(step) if step is not None else None)
    return carrier


@contextlib.contextmanager
def detached_span(name: str, attributes: Mapping[str, Any] | None = None, *,
                  client: bool = False) -> Iterator[Span | None]:
    """A child span that is not made current: for a step that spans yields of an async generator
    (a streamed model call), where entering and leaving the context would cross other code."""
    tracing = _ACTIVE.get()
    if tracing is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    opened = tracing.tracer.start_span(name, attributes=dict(attributes or {}),
                                       kind=SpanKind.CLIENT if client else SpanKind.INTERNAL)
    try:
        yield opened
    finally:
        opened.end()
