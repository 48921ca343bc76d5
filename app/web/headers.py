"""The console's response headers: no framing, no inline script, nothing cached or leaked.

Applied as the console controller's middleware, so every console response carries them,
redirects and error pages included. The pages use no script at all and one stylesheet of their
own (``/console/static/console.css``), so the policy can be strict.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; "
                           "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)
_REPLACED = {name for name, _ in SECURITY_HEADERS}


def security_headers(app: ASGIApp) -> ASGIApp:
    """Wrap ``app`` so that each response starts with :data:`SECURITY_HEADERS` (replacing any
    same-named header the handler set)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _REPLACED]
                message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware
