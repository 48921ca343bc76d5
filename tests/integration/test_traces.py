"""OpenTelemetry traces (issue #57 item 4): a trace's spans and attributes for an exact hit, a
semantic hit, a miss and a bypass, with the SDK's in-memory exporter; the client's traceparent
continued and passed on to the model server; the questions' text only when opted in; and once
through a real OTLP/HTTP receiver of the test's own."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.asgi import create_app
from app.replay.simulate import ServerThread
from tests.support import FakeUpstream, ask, eventually, strata_settings

GENERAL = {"X-Cache-Category": "general"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def traced(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, exporter: InMemorySpanExporter) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True)
    with ServerThread(create_app(settings, encoder=use_encoder, span_exporter=exporter)) as server:
        yield server.url


def _trace(exporter: InMemorySpanExporter, send: Any) -> tuple[httpx.Response, list[ReadableSpan]]:
    """The response to ``send()`` and the spans of its trace (the request's server span's), once
    the server span has ended."""
    exporter.clear()
    response = send()
    roots = eventually(lambda: [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"], timeout=10)
    trace_id = roots[0].context.trace_id
    # The write-back ends after the response: wait for it when the request stored an answer.
    if response.headers.get("x-cache") == "miss":
        eventually(lambda: any(s.name == "strata.write_back" for s in exporter.get_finished_spans()), timeout=10)
    return response, [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


def _named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert found, (name, [s.name for s in spans])
    return found[0]


def test_a_miss_an_exact_hit_a_semantic_hit_and_a_bypass_each_leave_their_trace(
        traced: str, fake_upstream: FakeUpstream, exporter: InMemorySpanExporter) -> None:
    fake_upstream.reset()
    question = "How do I reset my router to factory settings?"
    miss, spans = _trace(exporter, lambda: ask(traced, question, headers={**GENERAL, "traceparent": PARENT}))
    assert miss.headers["x-cache"] == "miss"
    root = _named(spans, "POST /v1/chat/completions")
    assert format(root.context.trace_id, "032x") == TRACE_ID  # the client's trace, continued
    assert root.attributes is not None and root.attributes["http.request.method"] == "POST"
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["strata.cache.result"] == "miss"
    for name in ("strata.lookup exact", "strata.lookup semantic", "strata.embed", "strata.knn", "strata.decide",
                 "strata.write_back"):
        assert _named(spans, name).parent is not None, name
    model = next(s for s in spans if s.kind.name == "CLIENT")  # "chat <model>"
    assert model.name.startswith("chat ")
    assert model.attributes is not None and model.attributes["gen_ai.operation.name"] == "chat"
    assert model.attributes["gen_ai.provider.name"] == "vllm" and model.attributes["gen_ai.usage.output_tokens"] > 0
    # The model server got the trace: the same trace id, the model call's span as parent.
    sent = fake_upstream.traceparents[-1]
    assert sent.split("-")[1] == TRACE_ID and sent.split("-")[2] == format(model.context.span_id, "016x"), sent
    # No question's text in any attribute unless the operator opted in.
    assert all(question not in str(v) for s in spans for v in (s.attributes or {}).values())

    exact, spans = _trace(exporter, lambda: ask(traced, question, headers=GENERAL))
    assert exact.headers["x-cache"] == "exact-hit"
    assert _named(spans, "POST /v1/chat/completions").attributes["strata.cache.result"] == "exact-hit"  # type: ignore[index]
    assert _named(spans, "strata.lookup exact").attributes["strata.cache.hit"] is True  # type: ignore[index]
    assert not any(s.kind.name == "CLIENT" for s in spans) and not any(s.name == "strata.embed" for s in spans)

    semantic, spans = _trace(exporter, lambda: ask(traced, "how do i reset my router to factory settings", headers=GENERAL))
    assert semantic.headers["x-cache"] == "semantic-hit", semantic.headers
    decided = _named(spans, "strata.decide").attributes
    assert decided is not None and decided["strata.decision.verdict"] == "served"
    assert decided["strata.decision.rule"] == semantic.headers["x-cache-verdict"] and decided["strata.decision.similarity"] > 0.9

    bypass, spans = _trace(exporter, lambda: ask(traced, question, headers={**GENERAL, "Cache-Control": "no-store"}))
    assert bypass.headers["x-cache"] == "bypass"
    assert _named(spans, "POST /v1/chat/completions").attributes["strata.cache.result"] == "bypass"  # type: ignore[index]
    assert any(s.kind.name == "CLIENT" for s in spans) and not any(s.name.startswith("strata.lookup") for s in spans)


def test_the_questions_text_is_on_the_decision_only_when_opted_in(
        redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> None:
    exporter = InMemorySpanExporter()
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, otel_capture_text=True)
    with ServerThread(create_app(settings, encoder=use_encoder, span_exporter=exporter)) as server:
        ask(server.url, "Which plans include roaming in Canada?", headers=GENERAL)
        decide = eventually(lambda: [s for s in exporter.get_finished_spans() if s.name == "strata.decide"], timeout=10)
        assert decide[0].attributes is not None
        assert decide[0].attributes["strata.question"] == "Which plans include roaming in Canada?"


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each export's decoded spans (protobuf, as the SDK sends)."""

    received: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            export = ExportTraceServiceRequest()
            export.ParseFromString(body)
            self.received.append(export)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_spans_reach_a_real_otlp_receiver(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any) -> None:
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    try:
        settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, otel_endpoint=endpoint,
                                   otel_service_name="strata-test")
        with ServerThread(create_app(settings, encoder=use_encoder)) as server:
            assert ask(server.url, "Can I pause my subscription for a month?", headers=GENERAL).status_code == 200
        # Leaving the server shut the tracer down, which exports what was pending.
        names = eventually(lambda: {span.name for export in _Receiver.received for resource in export.resource_spans
                                    for scope in resource.scope_spans for span in scope.spans}, timeout=20)
        assert {"POST /v1/chat/completions", "strata.lookup exact", "strata.decide"} <= names, names
        services = {attribute.value.string_value for export in _Receiver.received for resource in export.resource_spans
                    for attribute in resource.resource.attributes if attribute.key == "service.name"}
        assert services == {"strata-test"}
    finally:
        receiver.shutdown()
