"""A chat request as the pipeline takes it, and what it gives back to the transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

import msgspec

from app.cache.layered import CacheMode
from app.policy import CategoryPolicy
from app.wire import ChatCompletionRequest


class Outcome(StrEnum):
    """How a request was answered: the ``X-Cache`` header and the metrics label."""

    EXACT_HIT = "exact-hit"
    SEMANTIC_HIT = "semantic-hit"
    MISS = "miss"
    BYPASS = "bypass"
    ERROR = "error"


class ChatCall(msgspec.Struct, frozen=True, kw_only=True):
    """A validated chat request and how the client wants it cached.

    Attributes:
        request: The validated request.
        raw: The request body as received; its unknown fields pass through to the upstream.
        tenant: The tenant the request is served for.
        user: The user its answer belongs to, in a per-user category (``None`` elsewhere).
        category: The content category's policy.
        mode: What the cache may do (``Cache-Control``: ``no-cache`` refreshes, ``no-store`` skips).
        cache_salt: The model server's prefix-cache salt for this request (``app/hygiene.py``);
            ``None`` sends the client's own, if any.
    """

    request: ChatCompletionRequest
    raw: dict[str, Any]
    tenant: str
    category: CategoryPolicy
    mode: CacheMode = CacheMode.USE
    user: str | None = None
    cache_salt: str | None = None


class ChatResult(msgspec.Struct, kw_only=True):
    """What the transport sends back: a JSON body or an SSE stream, and the cache headers."""

    outcome: Outcome
    headers: dict[str, str]
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
