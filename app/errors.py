"""Every error Strata answers with, mapped in one place to OpenAI's ``{"error": {...}}`` shape."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import ExceptionHandlersMap

from app.wire import ErrorDetail, ErrorResponse, json_encoder

logger = logging.getLogger("strata.errors")


class StrataError(Exception):
    """An error with an OpenAI-shaped body and an HTTP status."""

    status_code: int = 400
    error_type: str = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type


class InvalidRequest(StrataError):
    status_code = 400


class RequestTimeout(StrataError):
    """The client declared a body and did not send it in time."""

    status_code = 408


class Unauthorized(StrataError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(StrataError):
    status_code = 403
    error_type = "permission_error"


class NotFound(StrataError):
    status_code = 404
    error_type = "not_found_error"


class Conflict(StrataError):
    """The request contradicts what is already there (feedback given twice)."""

    status_code = 409


class RateLimited(StrataError):
    """The tenant spent its request budget; ``Retry-After`` says when to come back."""

    status_code = 429
    error_type = "rate_limit_error"


class Overloaded(StrataError):
    """Too many upstream calls in flight for longer than the queue allows."""

    status_code = 503
    error_type = "overloaded_error"


class CacheUnavailable(StrataError):
    """Redis (or a cluster's master) does not answer an operation that needs it (an operator's)."""

    status_code = 503
    error_type = "cache_unavailable"


class UpstreamUnavailable(StrataError):
    """The model server could not be reached or answered with a server error."""

    status_code = 502
    error_type = "upstream_error"


class UpstreamTimeout(StrataError):
    status_code = 504
    error_type = "upstream_timeout"


class UpstreamRejected(StrataError):
    """The model server answered with an error status: its status, type, code, param, message and
    ``Retry-After`` are passed on as they came, so a client sees what the model server said."""

    error_type = "invalid_request_error"


def error_body(message: str, error_type: str, param: str | None, code: str | int | None) -> bytes:
    return json_encoder.encode(
        ErrorResponse(error=ErrorDetail(message=message, type=error_type, param=param, code=code))
    )


# Anthropic's error types by HTTP status (its errors page); anything else is ``api_error``.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# The path whose clients (the anthropic SDK) read Anthropic's error shape.
ANTHROPIC_PATH = "/v1/messages"


def anthropic_error_body(status: int, message: str) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}``, as Anthropic's API answers errors."""
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")
    return json_encoder.encode({"type": "error", "error": {"type": kind, "message": message}})


def _response(status_code: int, body: bytes, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=body, status_code=status_code, media_type="application/json", headers=headers)


def _shaped(request: Request[Any, Any, Any], status: int, message: str, error_type: str, param: str | None,
            code: str | int | None, headers: dict[str, str] | None = None) -> Response[bytes]:
    """An error in the shape the endpoint's clients read: Anthropic's on ``/v1/messages``, OpenAI's elsewhere."""
    if request.url.path.rstrip("/") == ANTHROPIC_PATH:
        return _response(status, anthropic_error_body(status, message), headers)
    return _response(status, error_body(message, error_type, param, code), headers)


def strata_error_handler(request: Request[Any, Any, Any], exc: StrataError) -> Response[bytes]:
    return _shaped(request, exc.status_code, exc.message, exc.error_type, exc.param, exc.code, exc.headers)


_HTTP_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def http_error_handler(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own errors (404, 405, 413, ...) in OpenAI's shape."""
    status = exc.status_code
    if status >= 500:
        logger.error("server error: %s", exc.detail)
    error_type = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    message = exc.detail if isinstance(exc.detail, str) and exc.detail else "request failed"
    return _shaped(request, status, message, error_type, None, None, exc.headers)


def unexpected_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """A bug: log it with the traceback, answer 500 without leaking internals."""
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _shaped(request, HTTP_500_INTERNAL_SERVER_ERROR, "internal error", "server_error", None, None)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    StrataError: strata_error_handler,
    HTTPException: http_error_handler,
    Exception: unexpected_error_handler,
}
