"""Operator endpoints, behind the admin token (``STRATA_ADMIN_TOKEN``); off without one."""

from __future__ import annotations

import hmac

from litestar import Controller, Request, post

from app.errors import Forbidden, Unauthorized
from app.lifespan import Resources, sweep_after


def require_admin(request: Request, resources: Resources) -> None:
    token = resources.settings.admin_token
    if not token:
        raise Forbidden("admin endpoints are disabled: set STRATA_ADMIN_TOKEN to enable them", code="admin_disabled")
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    # Constant-time comparison: the token must not leak through response timing.
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), token.encode()):
        raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)", code="invalid_admin_token")


class AdminController(Controller):
    path = "/admin"

    @post("/cache/invalidate", status_code=200)
    async def invalidate(self, request: Request, resources: Resources) -> dict[str, str]:
        """Bump the cache version: no entry stored before is served again.

        Old entries and indexes are deleted in the background; they also expire by TTL.
        """
        require_admin(request, resources)
        previous, current = await resources.versions.bump()
        resources.spawn(sweep_after(resources, current), f"sweep-{previous}")
        return {"previous_version": previous, "version": current}
