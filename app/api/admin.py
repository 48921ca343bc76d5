"""Operator endpoints, behind the admin token (``STRATA_ADMIN_TOKEN``); off without one."""

from __future__ import annotations

import hmac
from typing import Any

import msgspec
from litestar import Controller, Request, get, post

from app.api.protocol import read_body
from app.cache.storage.contract import CACHE_ERRORS
from app.cache.storage.invalidation import Invalidation, InvalidationError, NothingThere
from app.errors import CacheUnavailable, Forbidden, InvalidRequest, NotFound, Unauthorized
from app.lifespan import Resources, sweep_generations_after, sweep_versions_after


def require_admin(request: Request[Any, Any, Any], resources: Resources) -> None:
    token = resources.admin.current()
    if not token:
        raise Forbidden("admin endpoints are disabled: set STRATA_ADMIN_TOKEN or STRATA_ADMIN_TOKEN_FILE to enable them",
                        code="admin_disabled")
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    # Constant-time comparison: the token must not leak through response timing.
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), token.encode()):
        raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)", code="invalid_admin_token")


# Who an audit entry names: the operator's own word (the admin token is shared), and where from.
OPERATOR_HEADER = "x-strata-operator"
_invalidation_decoder = msgspec.json.Decoder(Invalidation)


def operator(request: Request[Any, Any, Any]) -> str:
    name = request.headers.get(OPERATOR_HEADER, "").strip()[:64] or "admin"
    client = request.client.host if request.client else "unknown"
    return f"{name}@{client}"


class AdminController(Controller):
    path = "/admin"

    @post("/cache/invalidate", status_code=200)
    async def invalidate(self, request: Request[Any, Any, Any], resources: Resources) -> dict[str, Any]:
        """Invalidate cached answers; the JSON body names what (empty: everything).

        ``{}``: bump the version (every entry). ``{"category": ..., "tenant": ...}`` (either or
        both): that scope's generation. ``{"key": ...}``: one entry and its aliases.
        ``{"question": ..., "model": ..., "category"?, "tenant"?, "system"?}``: the entry that
        request would be served. ``{"faq": NAME}``: one curated-answer file's entries.
        Unreachable entries are deleted in the background; each call is audited.
        """
        require_admin(request, resources)
        body = await read_body(request, resources.settings.limits.body_timeout_s)
        try:
            what = _invalidation_decoder.decode(body) if body.strip() else Invalidation()
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"invalid invalidation: {exc}", code="invalid_invalidation") from exc
        try:
            done = await resources.cache.invalidator.invalidate(what, who=operator(request))
        except InvalidationError as exc:
            raise InvalidRequest(str(exc), code="invalid_invalidation") from exc
        except NothingThere as exc:
            raise NotFound(str(exc), code="nothing_to_invalidate") from exc
        except CACHE_ERRORS as exc:
            raise CacheUnavailable(f"the cache's Redis did not answer: {exc!r}; the invalidation may not have "
                                   "taken effect everywhere: repeat it", code="cache_unavailable") from exc
        if done.kind == "everything":
            assert done.version is not None
            resources.spawn(sweep_versions_after(resources), f"sweep-{done.version}")
            previous = done.target.split(" ")[1]
            return {"previous_version": previous, "version": done.version}
        if done.kind == "scope":
            resources.spawn(sweep_generations_after(resources), f"sweep-{done.target}")
        described: dict[str, Any] = msgspec.to_builtins(done)
        return described

    @get("/cache/audit", status_code=200)
    async def audit(self, request: Request[Any, Any, Any], resources: Resources, count: int = 50) -> dict[str, Any]:
        """The latest invalidations, newest first (at most ``count``, 1 to 1000)."""
        require_admin(request, resources)
        if not 1 <= count <= 1000:
            raise InvalidRequest("count must be between 1 and 1000", param="count")
        try:
            return {"object": "list", "data": await resources.cache.invalidator.audit(count)}
        except CACHE_ERRORS as exc:
            raise CacheUnavailable(f"the cache's Redis did not answer: {exc!r}", code="cache_unavailable") from exc
