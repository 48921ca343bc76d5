"""Operator endpoints, behind the admin token (``STRATA_ADMIN_TOKEN``); off without one."""

from __future__ import annotations

import hmac
from typing import Any, TypeVar

import msgspec
from litestar import Controller, Request, delete, get, post, put

from app.api.protocol import read_body
from app.cache.storage.contract import CACHE_ERRORS
from app.cache.storage.invalidation import Invalidated, Invalidation, InvalidationError, NothingThere
from app.curated import AlreadyCurated, CuratedAnswers, CuratedEntry, CuratedError, CuratedSaved, NoSuchCurated
from app.errors import CacheUnavailable, Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from app.faq import FaqItem
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


_Body = TypeVar("_Body")


class CuratedEdit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``PUT /admin/curated``: a new answer for ``key``, and its variants when given (else kept)."""

    key: str
    answer: str
    variants: list[str] | None = None


def _decoded(body: bytes, kind: type[_Body]) -> _Body:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid curated answer: {exc}", code="invalid_curated_answer") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}", code="invalid_curated_answer") from exc


def _curated_error(exc: CuratedError) -> Exception:
    """A curated service's refusal in OpenAI's shape."""
    if isinstance(exc, NoSuchCurated):
        return NotFound(str(exc), code="no_such_curated_answer")
    if isinstance(exc, AlreadyCurated):
        return Conflict(str(exc), code="curated_already")
    return InvalidRequest(str(exc), code="invalid_curated_answer")


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

    @get("/curated", status_code=200)
    async def curated(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None) -> dict[str, Any]:
        """The curated answers with their variants (one tenant's with ``?tenant=``)."""
        require_admin(request, resources)
        try:
            entries = await CuratedAnswers(resources.cache, resources.policy).entries(tenant)
        except CACHE_ERRORS as exc:
            raise CacheUnavailable(f"the cache's Redis did not answer: {exc!r}", code="cache_unavailable") from exc
        return {"object": "list", "data": msgspec.to_builtins(entries)}

    @post("/curated", status_code=201)
    async def add_curated(self, request: Request[Any, Any, Any], resources: Resources) -> dict[str, Any]:
        """Add a curated answer: the model's answers to its question and variants are removed in
        both layers, whatever the requests that stored them carried. Audited."""
        require_admin(request, resources)
        # The body is one entry of a curated-answer file (app/faq.py): category, question, answer,
        # tenant, variants.
        added = _decoded(await read_body(request, resources.settings.limits.body_timeout_s), FaqItem)
        service = CuratedAnswers(resources.cache, resources.policy)
        try:
            saved = await service.add(tenant=added.tenant, category=added.category, question=added.question,
                                      answer=added.answer, variants=added.variants)
        except CuratedError as exc:
            raise _curated_error(exc) from exc
        return await _audited(request, resources, saved, f"add {saved.entry.file}")

    @put("/curated", status_code=200)
    async def edit_curated(self, request: Request[Any, Any, Any], resources: Resources) -> dict[str, Any]:
        """A curated answer's new text (and variants). Audited."""
        require_admin(request, resources)
        edit = _decoded(await read_body(request, resources.settings.limits.body_timeout_s), CuratedEdit)
        try:
            saved = await CuratedAnswers(resources.cache, resources.policy).edit(
                edit.key, answer=edit.answer, variants=edit.variants)
        except CuratedError as exc:
            raise _curated_error(exc) from exc
        return await _audited(request, resources, saved, f"edit {edit.key}")

    @delete("/curated", status_code=200)
    async def remove_curated(self, request: Request[Any, Any, Any], resources: Resources, key: str) -> dict[str, Any]:
        """Remove a curated answer and its variants (``?key=``). Audited."""
        require_admin(request, resources)
        try:
            entry = await CuratedAnswers(resources.cache, resources.policy).remove(key)
        except CuratedError as exc:
            raise _curated_error(exc) from exc
        await resources.cache.invalidator.audit_log.record_event(
            who=operator(request), done=Invalidated(kind="curated", target=f"remove {entry.key}"),
            request={"question": entry.question, "tenant": entry.tenant, "category": entry.category})
        return {"removed": msgspec.to_builtins(entry)}


async def _audited(request: Request[Any, Any, Any], resources: Resources, saved: CuratedSaved, target: str) -> dict[str, Any]:
    entry: CuratedEntry = saved.entry
    await resources.cache.invalidator.audit_log.record_event(
        who=operator(request), done=Invalidated(kind="curated", target=target, deleted=saved.keys_removed),
        request={"question": entry.question, "variants": list(entry.variants), "answer": entry.answer,
                 "tenant": entry.tenant, "category": entry.category, "replaced": saved.replaced})
    return {"entry": msgspec.to_builtins(entry), "replaced": saved.replaced, "keys_removed": saved.keys_removed}
