"""The ASGI application: the one place where things are wired together."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.di import Provide

from app.api.admin import AdminController
from app.api.chat import ChatController
from app.api.feedback import FeedbackController
from app.api.health import HealthController
from app.api.openai_surface import OpenAISurfaceController
from app.api.openapi import OpenAPIController
from app.api.protocols import MessagesController, ResponsesController
from app.cache.readers.base import Reader
from app.embed import Encoder
from app.errors import EXCEPTION_HANDLERS
from app.lifespan import Resources, build_resources, lifespan
from app.settings import Settings
from app.tracing import Tracing
from app.web.console import ConsoleController, console_exception_handlers, template_config

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


def _resources(request: Request[Any, Any, Any]) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


def create_app(settings: Settings | None = None, encoder: Encoder | None = None, reader: Reader | None = None,
               span_exporter: SpanExporter | None = None) -> Litestar:
    """Build the Strata app.

    Args:
        settings: The settings; read from the environment when omitted.
        encoder: A loaded embedding model to share (tests); the configured one is loaded when omitted.
        reader: The grey zone's reader (simulated replays' oracle); the configured one when omitted.
        span_exporter: Where traces go instead of the configured OTLP endpoint (tests' in-memory
            exporter); tracing is on with it.

    Returns:
        The Litestar application; its resources are built when it starts.
    """
    settings = settings or Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing = Tracing.from_settings(settings, span_exporter)
    return Litestar(
        middleware=[tracing.middleware] if tracing is not None else [],
        on_shutdown=[tracing.shutdown] if tracing is not None else [],
        route_handlers=[ChatController, ResponsesController, MessagesController, FeedbackController, OpenAISurfaceController,
                        AdminController, HealthController, OpenAPIController, ConsoleController],
        # Strata serves its own document at /openapi.json (app/api/openapi.py).
        openapi_config=None,
        dependencies={"resources": Provide(_resources, sync_to_thread=False)},
        exception_handlers={**EXCEPTION_HANDLERS, **console_exception_handlers()},
        template_config=template_config(),
        lifespan=[lifespan],
        state=State({"resources_factory": lambda: build_resources(settings, encoder, reader)}),
        request_max_body_size=settings.limits.max_body_bytes,
    )
