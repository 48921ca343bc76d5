"""The operators' console at ``/console`` (issues #35, #44): server-rendered pages, no script.

Who may see what: the admin token (``STRATA_ADMIN_TOKEN``, or the file ``make up`` writes) sees
every tenant; a tenant's operator key (``strata keys add --tenant T --operator``) sees and changes
tenant T only: a URL or form naming another tenant is refused with 403. Sessions are signed
cookies (app/web/sessions.py) that app/web/guard.py checks at every request (signed out, key
revoked, token rotated); sign-in attempts are limited. Every change is a POST with the session's
CSRF token and is audited with who made it (``strata:meta:audit``). Templates escape everything
they show (Jinja autoescape), so a cached answer holding markup is shown as text; every response
carries a strict CSP and no-framing headers (app/web/headers.py); messages after a change are
chosen by code, never taken from the URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import msgspec
from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Controller, Request, Response, get, post
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template
from litestar.template.config import TemplateConfig
from redis.asyncio import Redis

from app.auth import DEFAULT_TENANT, KEY_PREFIX
from app.cache.decision.rules import (
    TRIAL_CONFIDENCE,
    far_watch,
    far_words,
    has_far_pairs,
    intents_refuted,
    probation_watch,
    trial_threshold,
)
from app.cache.decision.stats import PooledCounts, clean_checks_to_certify, risk_level
from app.cache.decision.verify import INTENT_MATCH, READER_ACCEPTED
from app.cache.learning.feedback import FeedbackError, FeedbackRequest
from app.cache.learning.review import REVIEW_MAX_ITEMS, ReviewItem
from app.cache.storage.contract import CACHE_ERRORS
from app.cache.storage.intents import HeadMeta, IntentRefits, RefitState, out_of_scope_name
from app.cache.storage.invalidation import Invalidated, Invalidation, InvalidationError, NothingThere
from app.cache.storage.keys import (
    FIELD_QUESTION,
    FIELD_TENANT,
    Keyspace,
    as_text,
    layers_key,
)
from app.cache.storage.recent import RECENT_HITS
from app.cache.storage.usage import LAYERS
from app.curated import AlreadyCurated, CuratedAnswers, CuratedError, NoSuchCurated
from app.errors import StrataError
from app.intents import IntentsFileError, refit_intents
from app.lifespan import Resources, sweep_generations_after, sweep_versions_after
from app.policy import AdaptiveSemantic
from app.web.guard import ConsoleGuard, token_prefix
from app.web.headers import security_headers
from app.web.overview import CURVE_SLOT_MINUTES, LayerFigures, layer_figures
from app.web.sessions import SESSION_COOKIE, SESSION_TTL_S, ConsoleSession, SessionSigner
from app.web.words import MESSAGES, VERDICT_WORDS, counted, verdict_words

logger = logging.getLogger("strata.console")

TEMPLATES = Path(__file__).parent / "templates"
# Minutes the overview draws (what `strata:meta:layers:<minute>` keeps: two hours).
OVERVIEW_MINUTES = 120
# Audit entries the review page reads for hits marked wrong and reviews settled.
AUDIT_SCANNED = 500
ITEM_ID = re.compile(r"^[0-9a-f]{24}$")
# The layers the served page tells apart.
SERVED_LAYERS = ("exact", "semantic")
# Rows per page of the served, review and audit lists.
PAGE_SIZE = 25
# Audit entries the audit page searches and pages through.
AUDIT_SHOWN = 1000
STATIC = Path(__file__).parent / "static"


def _utc(unix_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(unix_time)))


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The console's templates, every one autoescaped."""
    environment = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    environment.filters["utc"] = _utc
    environment.filters["verdict_words"] = verdict_words
    environment.filters["counted"] = counted
    environment.globals["zip"] = zip
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(environment))


class NotSignedIn(Exception):
    """No valid session: the page redirects to the sign-in form."""


def _signer(resources: Resources) -> SessionSigner:
    secret = resources.ids.signing_secret
    if secret is None:
        raise StrataError("the console needs the shared secret, which is not adopted yet: try again in a minute")
    return SessionSigner(secret)


def _guard(resources: Resources) -> ConsoleGuard:
    settings = resources.settings
    return ConsoleGuard(resources.cache.shared, _signer(resources), resources.admin, resources.tenants,
                        settings.console_signin_attempts, settings.console_signin_window_s)


async def _session(request: Request[Any, Any, Any], resources: Resources) -> ConsoleSession:
    """The request's session, if it is signed, unexpired, not signed out, and its key or token holds."""
    session = _signer(resources).open(request.cookies.get(SESSION_COOKIE))
    if session is None or not await _guard(resources).valid(session):
        raise NotSignedIn
    return session


def _address(request: Request[Any, Any, Any]) -> str:
    return request.client.host if request.client else "unknown"


def _who(session: ConsoleSession, request: Request[Any, Any, Any]) -> str:
    client = request.client.host if request.client else "unknown"
    scope = f" ({session.tenant})" if session.tenant else ""
    return f"console:{session.who}{scope}@{client}"


def _page(name: str, session: ConsoleSession | None, resources: Resources, status: int = 200,
          headers: dict[str, str] | None = None, **context: Any) -> Template:
    csrf = _signer(resources).csrf_token(session) if session is not None else ""
    return Template(template_name=name, status_code=status, headers=headers,
                    context={"session": session, "csrf": csrf, "categories": _semantic_categories(resources),
                             "verdicts": VERDICT_WORDS, **context})


def _done(path: str, session: ConsoleSession, resources: Resources, code: str, detail: str = "",
          **params: str) -> Redirect:
    """Back to a page after a change, with a message by code; a detail the console wrote (the
    question it names, what it counted) is signed for this session, so no URL can put words there."""
    query = {**params, "message": code}
    if detail:
        query["detail"] = detail
        query["sig"] = _signer(resources).sign(f"{session.sid}|{code}|{detail}")
    return Redirect(path=path, query_params=query)


def _message(request: Request[Any, Any, Any], session: ConsoleSession, resources: Resources) -> str:
    """The words of the message a redirect names: a known code's, with its detail if signed for this session."""
    code = request.query_params.get("message", "")
    words = MESSAGES.get(code)
    if words is None:
        return ""
    detail, signature = request.query_params.get("detail", ""), request.query_params.get("sig", "")
    if detail and hmac.compare_digest(signature.encode(), _signer(resources).sign(f"{session.sid}|{code}|{detail}").encode()):
        return f"{words} {detail}"
    return words


async def _refit(resources: Resources, refits: IntentRefits, started: RefitState, *, tenant: str,
                 category: str) -> None:
    """A console refit, off the request: what it said (or why it failed) is kept for the page."""
    try:
        refit = await refit_intents(resources.cache, resources.policy, tenant=tenant, category=category)
    except (IntentsFileError, *CACHE_ERRORS) as exc:
        logger.warning("intents refit of %s/%s failed: %s", category, tenant, exc)
        await refits.finish(category, tenant, started, failed=True, said=str(exc))
        return
    except Exception as exc:
        await refits.finish(category, tenant, started, failed=True, said=f"failed: {exc!r}")
        raise  # logged by the background task's owner
    await refits.finish(category, tenant, started, failed=False,
                        said=f"{refit.approvals} approved pairs folded in: {refit.loaded.line()}")


def _elsewhere(session: ConsoleSession, *tenants: str | None) -> bool:
    """Whether an operator named a tenant not its own (in a URL or a form)."""
    return any(t and not session.sees(t) for t in tenants)


def _paged(rows: Sequence[Any], page: int, query: str, text: Callable[[Any], Iterable[str]],
           path: str, params: dict[str, str]) -> dict[str, Any]:
    """One page of ``rows`` matching a search, with the links to the other pages.

    Args:
        rows: Every row, in the order shown.
        page: The page asked for (1-based; out of range: the nearest page).
        query: Text every row shown contains somewhere (case-folded); empty: every row.
        text: A row's searchable texts.
        path: The page's path, for the links.
        params: The page's other query parameters, kept in the links.
    """
    needle = query.strip().casefold()
    found = [row for row in rows if not needle or any(needle in (t or "").casefold() for t in text(row))]
    pages = max(1, math.ceil(len(found) / PAGE_SIZE))
    page = min(max(1, page), pages)

    def link(number: int) -> str:
        kept = {k: v for k, v in params.items() if v}
        return f"{path}?{urlencode({**kept, **({'q': query} if query else {}), 'page': number})}"

    return {"rows": found[(page - 1) * PAGE_SIZE: page * PAGE_SIZE], "page": page, "pages": pages,
            "total": len(found), "q": query, "previous": link(page - 1) if page > 1 else None,
            "next": link(page + 1) if page < pages else None}


def _forbidden(session: ConsoleSession, resources: Resources, message: str) -> Template:
    return _page("error.html", session, resources, status=403, refusal=message)


def _semantic_categories(resources: Resources) -> list[str]:
    return sorted(name for name, c in resources.policy.categories.items() if c.semantic.enabled)


async def _form(request: Request[Any, Any, Any]) -> dict[str, str]:
    form = await request.form()
    return {str(k): str(v) for k, v in form.items()}


async def _change(request: Request[Any, Any, Any], resources: Resources) -> tuple[ConsoleSession, dict[str, str]]:
    """The session and form of a change, after its CSRF token is checked.

    Raises:
        NotSignedIn: No session.
        CsrfRefused: The token is missing or wrong.
    """
    session = await _session(request, resources)
    form = await _form(request)
    if not _signer(resources).csrf_ok(session, form.get("csrf")):
        raise CsrfRefused
    return session, form


class CsrfRefused(Exception):
    """A change without the session's CSRF token."""


def _tenant_of(session: ConsoleSession, asked: str | None) -> str | None:
    """The tenant a page shows: the operator's own, or what the admin asked for (``None``: all)."""
    if session.tenant is not None:
        return session.tenant
    return asked or None



def probation_status(meta: HeadMeta, counts: PooledCounts, policy: AdaptiveSemantic) -> str:
    """The intents page's line for a head serving on probation: its checked record in words."""
    watch = probation_watch(counts, policy)
    certified = "serving" if meta.serving else "certified nothing before traffic"
    stopped = f"; stopped (their checks showed more than the bound): {', '.join(watch.stopped)}" if watch.stopped else ""
    if watch.suspended:
        return (f"{certified}; on probation from {meta.probation:.3f}: its {counted(watch.total, 'checked hit')} show more "
                f"than {policy.error_bound:.0%} wrong ({watch.wrong} wrong): it serves only pairs more confident than "
                f"its record's wrong ones{stopped}")
    if watch.certified:
        record = (f"its record certifies {policy.error_bound:.0%} ({counted(watch.total, 'checked hit')}, {watch.wrong} wrong): "
                  f"{policy.intent_check_sample:.0%} of its hits checked")
    else:
        record = (f"{counted(watch.total, 'checked hit')}, {watch.wrong} wrong; every hit of a model's answer checked "
                  f"until {clean_checks_to_certify(policy.error_bound, risk_level(policy.confidence, policy.intent_confidence))} "
                  f"clean ones certify the bound")
    return f"{certified}; on probation from {meta.probation:.3f}: {record}{stopped}{far_status(counts, policy)}"


def far_status(counts: PooledCounts, policy: AdaptiveSemantic) -> str:
    """The far record in words ("" while it holds no check)."""
    right, wrong = counts.far
    if right + wrong == 0 or not has_far_pairs(policy):
        return ""
    state = "serving" if far_watch(counts, policy).serves else "stopped (its checks showed more than the bound)"
    return (f"; pairs further apart than similarity {policy.intent_beyond_floor:.2f}: "
            f"{counted(right + wrong, 'checked hit')}, {wrong} wrong, {state}")


def promise_words(meta: HeadMeta, policy: AdaptiveSemantic | None) -> str:
    """What is promised when, in words: before traffic from the file, over traffic from the record."""
    before = (f"Before traffic, from the file: at most {meta.error_bound:.2%} wrong hits ({1 - meta.delta:.0%} sure) from "
              f"confidence {meta.threshold:.3f}." if meta.serving else
              "Before traffic, from the file: nothing certified (too few phrasings to show the bound).")
    if meta.probation > 1 or policy is None or not policy.intent_probation:
        return before
    return (f"{before} Over traffic, from the record: from confidence {meta.probation:.3f} each hit of a model's answer is "
            f"checked by the model after the response, and an intent stops as soon as its checks show more than "
            f"{policy.error_bound:.0%} wrong ({1 - meta.delta:.0%} sure, valid however often read); a team's own answer "
            f"is judged by its askers' feedback, not by the model{far_words(policy)}.")


class ConsoleController(Controller):
    path = "/console"
    include_in_schema = False
    middleware = (security_headers,)

    @get("/static/console.css")
    async def stylesheet(self) -> Response[bytes]:
        """The pages' one stylesheet: the CSP allows no inline style."""
        return Response(content=(STATIC / "console.css").read_bytes(), media_type="text/css")

    @get("/login")
    async def login_form(self, resources: Resources) -> Template:
        return self._login_page(resources)

    @staticmethod
    def _login_page(resources: Resources, status: int = 200, error: str = "",
                    headers: dict[str, str] | None = None) -> Template:
        """The sign-in form; it says so when the console is off, and how to turn it on."""
        admin_on = resources.admin.current() is not None
        return _page("login.html", None, resources, status=status, headers=headers, error=error, admin_on=admin_on,
                     operators_on=resources.tenants.configured)

    @post("/login")
    async def login(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Sign in with the admin token or a tenant operator's key; a cookie carries the session.
        Failed attempts are counted per client address and token prefix; past the limit, 429."""
        token = (await _form(request)).get("token", "").strip()
        guard, address = _guard(resources), _address(request)
        audit = resources.cache.invalidator.audit_log
        try:
            wait = await guard.wait_s(address, token)
        except CACHE_ERRORS:
            return self._login_page(resources, 503, "The console cannot check sign-ins just now (Redis): try again.")
        if wait:
            return self._login_page(resources, 429, f"Too many failed sign-ins: try again in {wait} s.",
                                    headers={"Retry-After": str(wait)})
        who, tenant, key_id = self._authenticate(token, resources)
        prefix = hashlib.sha256(token_prefix(token).encode()).hexdigest()[:16]
        if who is None:
            try:
                count = await guard.failed(address, token)
                await audit.record_event(who=f"console:?@{address}", done=Invalidated(
                    kind="sign-in", target="locked" if count == guard.attempts else "refused"),
                    request={"address": address, "token_prefix_sha256": prefix, "failures": count})
            except CACHE_ERRORS:
                pass  # the refusal stands; only its count and record are missing
            if not resources.admin.current() and not resources.tenants.configured:
                return self._login_page(resources, 401, "The console is off: nothing signs in (see below).")
            return self._login_page(resources, 401, "That token does not sign in to the console.")
        signer = _signer(resources)
        session, cookie = signer.new(who, tenant, key_id=key_id,
                                     token_mark=signer.token_mark(token) if tenant is None else "")
        try:
            await audit.record_event(who=_who(session, request), done=Invalidated(kind="sign-in", target=who),
                                     request={"address": address, **({"tenant": tenant} if tenant else {})})
        except CACHE_ERRORS:
            return self._login_page(resources, 503, "The console cannot record sign-ins just now (Redis): try again.")
        response = Redirect(path="/console")
        response.cookies.append(Cookie(key=SESSION_COOKIE, value=cookie, max_age=SESSION_TTL_S, httponly=True,
                                       secure=True, samesite="strict", path="/console"))
        return response

    @staticmethod
    def _authenticate(token: str, resources: Resources) -> tuple[str | None, str | None, str | None]:
        """(who, tenant, operator key id) a token signs in as; who is ``None``: it does not."""
        admin = resources.admin.current()
        if admin and token and hmac.compare_digest(token.encode(), admin.encode()):
            return "admin", None, None
        if token.startswith(KEY_PREFIX):
            try:
                caller = resources.tenants.caller(f"Bearer {token}")
            except StrataError:
                return None, None, None
            if caller.operator:
                key_id = token[len(KEY_PREFIX):].partition("-")[0]
                return f"operator:{key_id}", caller.tenant, key_id
        return None, None, None

    @post("/logout")
    async def logout(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Sign out: the session is ended server-side, so its cookie replayed is refused everywhere."""
        session, _ = await _change(request, resources)
        await _guard(resources).end(session)
        await resources.cache.invalidator.audit_log.record_event(
            who=_who(session, request), done=Invalidated(kind="sign-out", target=session.who),
            request={"address": _address(request)})
        response = Redirect(path="/console/login")
        response.delete_cookie(SESSION_COOKIE, path="/console")
        return response

    @get("/")
    async def overview(self, request: Request[Any, Any, Any], resources: Resources,
                       tenant: str | None = None) -> Template:
        """Per tenant and category: requests by answering layer per minute, model calls and time
        saved, hit latency, the learning curve; and each adaptive category's live precision
        against its bound (the tenant's own pool for an operator)."""
        session = await _session(request, resources)
        if _elsewhere(session, tenant):
            return _forbidden(session, resources, "You cannot see another tenant's overview.")
        shown = _tenant_of(session, tenant)
        layers = await self._layers(resources, shown)
        precision = []
        semantic = resources.cache.semantic
        tag = resources.cache.known_version
        adaptive = set()
        if semantic is not None and tag is not None:
            for name in _semantic_categories(resources):
                policy = resources.policy.categories[name].semantic
                if not isinstance(policy, AdaptiveSemantic):
                    continue
                adaptive.add(name)
                try:
                    figures = await semantic.adaptive.precision(tag, name, policy, shown)
                except CACHE_ERRORS:
                    continue
                precision.append({"category": name, **msgspec.to_builtins(figures),
                                  "estimate": figures.error_estimate})
        now_minute = int(time.time() // 60)
        return _page("overview.html", session, resources, layers=layers, precision=precision, tenant=shown,
                     version=tag, adaptive=adaptive, minutes=OVERVIEW_MINUTES, layer_names=LAYERS,
                     curve_slot=CURVE_SLOT_MINUTES, charts=[chart(f, now_minute) for f in layers or []])

    @staticmethod
    async def _layers(resources: Resources, tenant: str | None) -> list[LayerFigures] | None:
        """The last ``OVERVIEW_MINUTES`` of layer counts (``None``: Redis did not answer)."""
        shared = resources.cache.shared
        if shared is None:
            return None
        now = int(time.time() // 60)
        try:
            async with shared.pipeline(transaction=False) as pipe:
                for minute in range(now - OVERVIEW_MINUTES + 1, now + 1):
                    pipe.hgetall(layers_key(minute))
                raw = await pipe.execute()
        except CACHE_ERRORS:
            return None
        rows = [{str(as_text(k)): int(v) for k, v in (row or {}).items()} for row in raw]
        return layer_figures(rows, tenant)

    @get("/served")
    async def served(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None,
                     category: str | None = None, verdict: str | None = None, layer: str | None = None, q: str = "",
                     page: int = 1) -> Template:
        """This worker's recent hits, exact and semantic: both questions, the similarity, the rule,
        the answer actually returned; searchable."""
        session = await _session(request, resources)
        if _elsewhere(session, tenant):
            return _forbidden(session, resources, "You cannot see another tenant's hits.")
        shown = _tenant_of(session, tenant)
        hits = resources.recent.latest(tenant=shown, category=category or None, verdict=verdict or None,
                                       layer=layer if layer in SERVED_LAYERS else None, count=RECENT_HITS)
        listing = _paged(hits, page, q, lambda h: (h.asked, h.cached, h.answer), "/console/served",
                         {"tenant": tenant or "", "category": category or "", "verdict": verdict or "",
                          "layer": layer or ""})
        every = resources.recent.latest(tenant=session.tenant, count=RECENT_HITS)
        tenants = sorted({h.tenant for h in every})
        return _page("served.html", session, resources, hits=listing, tenant=tenant or "", category=category or "",
                     verdict=verdict or "", layer=layer or "", layers=SERVED_LAYERS,
                     message=_message(request, session, resources),
                     tenant_counts=[(t, sum(h.tenant == t for h in every)) for t in tenants])

    @post("/served/wrong")
    async def mark_wrong(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Mark a served hit wrong: the feedback path (a veto at that similarity), audited."""
        session, form = await _change(request, resources)
        response_id = form.get("response_id", "")
        hit = next((h for h in resources.recent.latest(count=RECENT_HITS) if h.response_id == response_id), None)
        if hit is None or not session.sees(hit.tenant):
            return _forbidden(session, resources, "No such hit of yours.")
        feedback = resources.cache.feedback
        if feedback is None:
            return _page("error.html", session, resources, status=503, refusal="The cache is not reachable.")
        try:
            await feedback.give(FeedbackRequest(id=response_id, verdict="wrong"), tenant=hit.tenant, user=None,
                                who=_who(session, request))
            code, detail = "marked-wrong", f"(“{_short(hit.asked)}” served the answer to “{_short(hit.cached)}”)"
        except FeedbackError as exc:
            code, detail = "not-recorded", str(exc)
        return _done("/console/served", session, resources, code, detail)

    @get("/review")
    async def review(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None,
                     category: str = "", q: str = "", page: int = 1) -> Template:
        """The review queue: the refused grey-zone candidates of a tenant and category, most asked
        first. The admin, naming no tenant, lands on the queue with the most items."""
        session = await _session(request, resources)
        if _elsewhere(session, tenant):
            return _forbidden(session, resources, "You cannot see another tenant's queue.")
        queues = await self._queues(resources, session.tenant)
        if session.tenant is None and not tenant and queues:
            tenant, category = (tenant or queues[0]["tenant"]), (category or queues[0]["category"])
        shown = _tenant_of(session, tenant) or "default"
        category = category or ("faq" if "faq" in resources.policy.categories else _semantic_categories(resources)[0])
        items: list[ReviewItem] = []
        tag = resources.cache.known_version
        if tag is not None and category in resources.policy.categories:
            bucket = resources.cache.each[resources.cache.buckets.of(shown, category)] if resources.cache.each else None
            if bucket is not None:
                items = await bucket.review.items(tag, category, shown, count=REVIEW_MAX_ITEMS)
        listing = _paged(items, page, q, lambda i: (i.asked, i.cached, i.asked_answer, i.cached_answer),
                         "/console/review", {"tenant": tenant or "", "category": category})
        settled = await self._settled(resources, shown, category)
        promoted = resources.recent.latest(tenant=shown, category=category, verdict=READER_ACCEPTED, count=20)
        return _page("review.html", session, resources, items=listing, tenant=shown, category=category,
                     message=_message(request, session, resources), promoted=promoted, queues=queues,
                     marked_wrong=settled["marked_wrong"], reviewed=settled["reviewed"])

    @staticmethod
    async def _queues(resources: Resources, tenant: str | None) -> list[dict[str, Any]]:
        """Every review queue with items (of one tenant, or all), the fullest first."""
        found: list[dict[str, Any]] = []
        for redis, keys, tag in _keyspaces(resources):
            prefix = keys.review_key(tag, "", "")[:-1]  # ...:review:
            try:
                async for raw in redis.scan_iter(match=prefix + "*", count=500):
                    name = str(as_text(raw))
                    category, _, owner = name[len(prefix):].partition(":")
                    if tenant is not None and owner != tenant:
                        continue
                    count = int(await redis.zcard(name))
                    if count:
                        found.append({"tenant": owner, "category": category, "count": count})
            except CACHE_ERRORS:
                return found
        return sorted(found, key=lambda q: (-q["count"], q["tenant"], q["category"]))

    @staticmethod
    async def _settled(resources: Resources, tenant: str, category: str) -> dict[str, list[dict[str, Any]]]:
        """From the audit stream: the hits marked wrong and the reviews settled, of this tenant and
        category, newest first (a marked hit shows its questions while this worker remembers it)."""
        try:
            events = await resources.cache.invalidator.audit(count=AUDIT_SCANNED)
        except CACHE_ERRORS:
            return {"marked_wrong": [], "reviewed": []}
        recent = {hit.response_id: hit for hit in resources.recent.latest(tenant=tenant, category=category,
                                                                             count=RECENT_HITS)}
        marked_wrong: list[dict[str, Any]] = []
        reviewed: list[dict[str, Any]] = []
        for event in events:
            try:
                asked = msgspec.json.decode(event.get("request", "{}"))
            except msgspec.DecodeError:
                continue
            if not isinstance(asked, dict) or asked.get("tenant") != tenant or asked.get("category") != category:
                continue
            if event.get("kind") == "feedback" and asked.get("verdict") == "wrong":
                marked_wrong.append({"at": event.get("at", "0"), "who": event.get("who", ""),
                                     "similarity": asked.get("similarity"), "comment": asked.get("comment", ""),
                                     "hit": recent.get(str(asked.get("id")))})
            elif event.get("kind") == "review":
                reviewed.append({"at": event.get("at", "0"), "who": event.get("who", ""),
                                 "verdict": event.get("target", "").partition(" ")[0], "asked": asked.get("asked", ""),
                                 "cached": asked.get("cached", ""), "similarity": asked.get("similarity")})
        return {"marked_wrong": marked_wrong[:20], "reviewed": reviewed[:20]}

    @post("/review/settle")
    async def settle(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Approve (an alias that serves the next asker) or reject (a veto at that similarity)."""
        session, form = await _change(request, resources)
        tenant, category, identifier = form.get("tenant", ""), form.get("category", ""), form.get("id", "")
        approved = form.get("verdict") == "approve"
        if not ITEM_ID.match(identifier) or form.get("verdict") not in ("approve", "reject"):
            return _page("error.html", session, resources, status=400, refusal="Not a review verdict.")
        if not session.sees(tenant) or category not in resources.policy.categories:
            return _forbidden(session, resources, "You cannot settle another tenant's queue.")
        tag = resources.cache.known_version
        bucket = resources.cache.each[resources.cache.buckets.of(tenant, category)] if resources.cache.each else None
        item = await bucket.review.get(tag, identifier) if bucket is not None and tag is not None else None
        if bucket is None or tag is None or item is None or item.tenant != tenant or item.category != category:
            return _forbidden(session, resources, "That item is not in your queue (settled already, or expired).")
        policy = resources.policy.categories[category].semantic
        assert bucket.learner is not None and isinstance(policy, AdaptiveSemantic)  # queued only in adaptive ones
        took = await bucket.learner.settle_review(tag, item, approved, policy)
        await bucket.review.remove(tag, item, "approve" if approved else "reject")
        who = _who(session, request)
        await resources.cache.invalidator.audit_log.record_event(
            who=who, done=Invalidated(kind="review", target=f"{'approve' if approved else 'reject'} {item.id}"),
            request={"asked": item.asked, "cached": item.cached, "similarity": item.similarity, "root": item.root,
                     "tenant": tenant, "category": category, "took_effect": took})
        code = "approved" if approved and took else "rejected" if not approved else "not-applied"
        detail = f"(“{_short(item.asked)}” and “{_short(item.cached)}”)"
        return _done("/console/review", session, resources, code, detail, category=category,
                     **({"tenant": tenant} if session.tenant is None else {}))

    @get("/curated")
    async def curated(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None) -> Template:
        """Curated answers with their variants (the operator's tenant only)."""
        session = await _session(request, resources)
        if _elsewhere(session, tenant):
            return _forbidden(session, resources, "You cannot see another tenant's curated answers.")
        return await self._curated_page(request, resources, session, _tenant_of(session, tenant))

    @staticmethod
    async def _curated_page(request: Request[Any, Any, Any], resources: Resources, session: ConsoleSession,
                            shown: str | None, *, status: int = 200, refusal: str = "",
                            typed: dict[str, str] | None = None) -> Template:
        """The curated page; after a refused add, with the refusal and what was typed kept."""
        service = CuratedAnswers(resources.cache, resources.policy)
        entries = await service.entries(shown)
        every = entries if shown is None else await service.entries(session.tenant)
        tenants = sorted({e.tenant for e in every})
        default = "faq" if "faq" in _semantic_categories(resources) else ""
        return _page("curated.html", session, resources, status=status, entries=entries, tenant=shown or "",
                     message=_message(request, session, resources), default_category=default, refusal=refusal,
                     typed=typed or {}, tenant_counts=[(t, sum(e.tenant == t for e in every)) for t in tenants])

    @post("/curated/save")
    async def save_curated(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Edit a curated answer (``key`` given) or add one with its variants (the curated
        service, app/curated.py: the model's answers to its words go, in both layers). Audited."""
        session, form = await _change(request, resources)
        if _elsewhere(session, form.get("tenant", "").strip()):
            return _forbidden(session, resources, "You cannot add curated answers for another tenant.")
        service = CuratedAnswers(resources.cache, resources.policy)
        key, answer = form.get("key", ""), form.get("answer", "")
        variants = [line for line in form.get("variants", "").splitlines() if line.strip()]
        try:
            if key:
                saved = await service.edit(key, answer=answer, variants=variants if "variants" in form else None,
                                           tenant=session.tenant)
                target = f"edit {key}"
            else:
                tenant = session.tenant or form.get("tenant", "").strip() or "default"
                saved = await service.add(tenant=tenant, category=form.get("category", ""),
                                          question=form.get("question", ""), answer=answer, variants=variants)
                target = f"add {saved.entry.file}"
        except NoSuchCurated:
            return _forbidden(session, resources, "No such curated answer of yours.")
        except CuratedError as exc:
            # The add form keeps what was typed: the operator fixes it, not types it again.
            return await self._curated_page(
                request, resources, session, session.tenant, status=409 if isinstance(exc, AlreadyCurated) else 400,
                refusal=str(exc), typed={} if key else {k: form.get(k, "") for k in ("tenant", "category", "question",
                                                                                      "variants", "answer")})
        entry = saved.entry
        await resources.cache.invalidator.audit_log.record_event(
            who=_who(session, request), done=Invalidated(kind="curated", target=target, deleted=saved.keys_removed),
            request={"question": entry.question, "variants": list(entry.variants), "answer": entry.answer,
                     "tenant": entry.tenant, "category": entry.category, "replaced": saved.replaced})
        and_variants = f" and {counted(len(entry.variants), 'variant')}" if entry.variants else ""
        detail = (f"“{_short(entry.question)}”{and_variants}: "
                  f"{counted(saved.replaced, 'cached model answer')} to the same words removed.")
        return _done("/console/curated", session, resources, "curated-saved", detail)

    @post("/curated/remove")
    async def remove_curated(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Remove a curated answer and its variants: its words are the model's to answer again. Audited."""
        session, form = await _change(request, resources)
        try:
            entry = await CuratedAnswers(resources.cache, resources.policy).remove(form.get("key", ""),
                                                                                   tenant=session.tenant)
        except NoSuchCurated:
            return _forbidden(session, resources, "No such curated answer of yours.")
        await resources.cache.invalidator.audit_log.record_event(
            who=_who(session, request), done=Invalidated(kind="curated", target=f"remove {entry.key}"),
            request={"question": entry.question, "tenant": entry.tenant, "category": entry.category})
        return _done("/console/curated", session, resources, "curated-removed", f"“{_short(entry.question)}”")

    @get("/intents")
    async def intents(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None) -> Template:
        """The teams' intents per tenant and category: what is loaded, the calibrated rule, what it
        serves, whether it is suspended, and the twins the held-out folds mixed up most."""
        session = await _session(request, resources)
        if _elsewhere(session, tenant):
            return _forbidden(session, resources, "You cannot see another tenant's intents.")
        shown = _tenant_of(session, tenant)
        heads = resources.cache.intents
        loaded = [h for h in (heads.loaded() if heads is not None else []) if shown is None or h.meta.tenant == shown]
        rows = []
        tag, semantic = resources.cache.known_version, resources.cache.semantic
        for head in sorted(loaded, key=lambda h: (h.meta.tenant, h.meta.category)):
            m = head.meta
            status, measured = ("serving" if m.serving else "serves nothing"), (0, 0)
            of_intent: dict[str, tuple[int, int]] = {}
            on_probation: dict[str, tuple[int, int]] = {}
            counts = None
            policy = resources.policy.categories.get(m.category)
            if semantic is not None and tag is not None and policy is not None and isinstance(policy.semantic, AdaptiveSemantic):
                try:
                    counts = await semantic.adaptive.pooled.counts(tag, m.category, m.tenant)
                    watch = intents_refuted(counts, policy.semantic)
                    measured = (watch.wrong, watch.total)
                    of_intent = dict(counts.of_intent)
                    on_probation = dict(counts.on_probation)
                    if m.probation <= 1 and policy.semantic.intent_probation:
                        status = probation_status(m, counts, policy.semantic)
                    elif m.threshold > 1:
                        wrong, total = counts.on_trial_at_or_above(round(TRIAL_CONFIDENCE * 100))
                        level = trial_threshold(counts, policy.semantic)
                        status = (f"on trial: {counted(total, 'pair')} the model answered, {wrong} wrong; "
                                  + (f"serving from {level:.2f}" if level is not None else "serves nothing yet"))
                    elif m.threshold <= 1 and watch.suspended:
                        status = "suspended: its measured hits refute the calibration"
                    elif m.threshold <= 1 and watch.set_aside:
                        status = f"serving; set aside (their measured hits were wrong): {', '.join(watch.set_aside)}"
                except CACHE_ERRORS:
                    pass
            refit = None
            if resources.cache.shared is not None:
                try:
                    refit = await IntentRefits(resources.cache.shared).get(m.category, m.tenant)
                except CACHE_ERRORS:
                    pass
            counts_of = m.phrasings_of if len(m.phrasings_of) == len(m.intents) else [0] * len(m.intents)
            stopped = set(probation_watch(counts, policy.semantic).stopped) \
                if counts is not None and policy is not None and isinstance(policy.semantic, AdaptiveSemantic) else set()
            per_intent = [{"intent": intent, "phrasings": n, "shared": shared,
                           "measured": sum(of_intent.get(intent, (0, 0))) + sum(on_probation.get(intent, (0, 0))),
                           "wrong": of_intent.get(intent, (0, 0))[1] + on_probation.get(intent, (0, 0))[1],
                           "out_of_scope": out_of_scope_name(intent), "stopped": intent in stopped}
                          for intent, n, shared in zip(m.intents, counts_of, m.shared, strict=True)]
            rows.append({"meta": m, "status": status, "explored": measured[1], "explored_wrong": measured[0],
                         "promise": promise_words(m, policy.semantic if policy is not None
                                                  and isinstance(policy.semantic, AdaptiveSemantic) else None),
                         "per_intent": per_intent,
                         "hits": resources.recent.latest(tenant=m.tenant, category=m.category, verdict=INTENT_MATCH,
                                                         count=RECENT_HITS), "refit": refit})
        return _page("intents.html", session, resources, heads=rows, tenant=shown or "",
                     message=_message(request, session, resources))

    @post("/intents/refit")
    async def intents_refit(self, request: Request[Any, Any, Any], resources: Resources) -> Template | Redirect:
        """Fit and calibrate a head again with the review queue's approvals folded in (what
        ``strata intents refit`` does), in the background: one at a time per tenant and category,
        audited; the page shows it running, then what the load said."""
        session, form = await _change(request, resources)
        tenant, category = (session.tenant or form.get("tenant", "").strip()), form.get("category", "").strip()
        if _elsewhere(session, form.get("tenant", "").strip()):
            return _forbidden(session, resources, "You cannot refit another tenant's intents.")
        heads, shared = resources.cache.intents, resources.cache.shared
        if heads is None or shared is None or heads.get(tenant, category) is None:
            return _page("error.html", session, resources, status=404,
                         refusal=f"No intents are loaded for tenant {tenant} in {category}: load a file first.")
        who = _who(session, request)
        refits = IntentRefits(shared)
        started = await refits.start(category, tenant, who)
        if started is None:
            return _done("/console/intents", session, resources, "refit-running", f"{category} · tenant {tenant}")
        await resources.cache.invalidator.audit_log.record_event(
            who=who, done=Invalidated(kind="intents", target=f"refit {category} {tenant}"),
            request={"tenant": tenant, "category": category})
        resources.spawn(_refit(resources, refits, started, tenant=tenant, category=category),
                        f"intents-refit-{category}-{tenant}")
        return _done("/console/intents", session, resources, "refit-started", f"{category} · tenant {tenant}")

    @get("/invalidate")
    async def invalidate_form(self, request: Request[Any, Any, Any], resources: Resources) -> Template:
        session = await _session(request, resources)
        return _page("invalidate.html", session, resources, confirm=None, done=None,
                     **await self._pickers(resources, session))

    @staticmethod
    async def _pickers(resources: Resources, session: ConsoleSession) -> dict[str, Any]:
        """What the invalidate form offers to pick: every category, and the tenants an admin knows."""
        tenants = {DEFAULT_TENANT, *resources.tenants.known_tenants()} if session.tenant is None else {session.tenant}
        return {"all_categories": sorted(resources.policy.categories), "known_tenants": sorted(tenants)}

    @post("/invalidate")
    async def invalidate(self, request: Request[Any, Any, Any], resources: Resources) -> Template:
        """Invalidate by category, tenant, user, entry or question: a confirmation that names what
        goes first, then the affected count; audited. An operator invalidates within its tenant
        only, and its whole tenant only when it says so."""
        session, form = await _change(request, resources)
        fields = {k: form[k].strip() for k in ("category", "tenant", "user", "key", "question", "model")
                  if form.get(k, "").strip()}
        if session.tenant is not None:
            if _elsewhere(session, fields.get("tenant")):
                return _forbidden(session, resources, "You cannot invalidate another tenant's entries.")
            if "key" in fields:
                try:
                    owner = await resources.cache.invalidator.for_key(fields["key"]).redis.hget(fields["key"], FIELD_TENANT)
                except CACHE_ERRORS:
                    owner = None
                if owner is None or str(as_text(owner)) != session.tenant:
                    return _forbidden(session, resources, "That entry is not your tenant's.")
            else:
                if not fields and form.get("whole_tenant") != "yes":
                    return _page("invalidate.html", session, resources, status=400, confirm=None, done=None,
                             **await self._pickers(resources, session), error=(
                        "Name what to invalidate, or tick “all of tenant "
                        f"{session.tenant}” to invalidate every entry of your tenant."))
                fields["tenant"] = session.tenant
        try:
            what = msgspec.convert(fields, Invalidation)
            resources.cache.invalidator.check(what)
        except (msgspec.ValidationError, InvalidationError) as exc:
            return _page("invalidate.html", session, resources, status=400, confirm=None, done=None, error=str(exc),
                         **await self._pickers(resources, session))
        if form.get("confirmed") != "yes":
            named = await self._question_of(resources, fields.get("key"))
            try:
                would_go: int | None = await resources.cache.invalidator.affected(what)
            except CACHE_ERRORS:
                would_go = None
            return _page("invalidate.html", session, resources, confirm=fields, done=None, named=named,
                         would_go=would_go, **await self._pickers(resources, session))
        try:
            done = await resources.cache.invalidator.invalidate(what, who=_who(session, request))
        except NothingThere as exc:
            return _page("invalidate.html", session, resources, status=404, confirm=None, done=None, error=str(exc),
                         **await self._pickers(resources, session))
        except InvalidationError as exc:
            return _page("invalidate.html", session, resources, status=400, confirm=None, done=None, error=str(exc),
                         **await self._pickers(resources, session))
        if done.kind == "everything":
            resources.spawn(sweep_versions_after(resources), f"sweep-{done.version}")
        elif done.kind == "scope":
            resources.spawn(sweep_generations_after(resources), f"sweep-{done.target}")
        return _page("invalidate.html", session, resources, confirm=None, done=msgspec.to_builtins(done),
                     named=fields.get("question") or form.get("named", ""), **await self._pickers(resources, session))

    @staticmethod
    async def _question_of(resources: Resources, key: str | None) -> str:
        """The question an entry key answers, to name it in a confirmation (empty: unknown)."""
        if not key:
            return ""
        try:
            question = await resources.cache.invalidator.for_key(key).redis.hget(key, FIELD_QUESTION)
        except CACHE_ERRORS:
            return ""
        return str(as_text(question) or "")

    @get("/audit")
    async def audit(self, request: Request[Any, Any, Any], resources: Resources, q: str = "", page: int = 1) -> Template:
        """The audit log: invalidations, reviews, curated edits and sign-ins, newest first (an
        operator's own tenant's), searchable, a page at a time."""
        session = await _session(request, resources)
        rows = await resources.cache.invalidator.audit(AUDIT_SHOWN)
        if session.tenant is not None:
            rows = [r for r in rows if f"({session.tenant})@" in r.get("who", "")
                    or f'"tenant":{msgspec.json.encode(session.tenant).decode()}' in r.get("request", "")]
        readable = [{**r, "details": _pretty(r.get("request", ""))} for r in rows]
        listing = _paged(readable, page, q, lambda r: (r.get("who"), r.get("kind"), r.get("target"), r.get("details")),
                         "/console/audit", {})
        return _page("audit.html", session, resources, rows=listing)


def _keyspaces(resources: Resources) -> list[tuple[Redis, Keyspace, str]]:
    """Each bucket's Redis and keyspace with the version known now (none before one is known)."""
    tag = resources.cache.known_version
    if tag is None:
        return []
    return [(bucket.bucket.redis, bucket.bucket.keys, tag) for bucket in resources.cache.each]


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pretty(raw: str) -> str:
    """An audit entry's request, indented (what it was when it is not JSON)."""
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False, indent=2)
    except ValueError:
        return raw


def chart(figures: LayerFigures, now_minute: int) -> dict[str, Any]:
    """The overview's stacked bars of one card: the window from the first minute with requests
    (at least the last 30) to now, bars as wide as the window allows, a y scale and time ticks."""
    minutes = len(next(iter(figures.series.values()), []))
    first = next((i for i in range(minutes) if any(s[i] for s in figures.series.values())), minutes - 1)
    shown = max(30, minutes - first)
    shown = min(minutes, int(math.ceil(shown / 10) * 10))
    start = minutes - shown
    width, height, left, bottom = 720, 120, 40, 20
    step = width / shown
    peak = max((sum(s[i] for s in figures.series.values()) for i in range(start, minutes)), default=0) or 1
    bars = []
    for offset, i in enumerate(range(start, minutes)):
        y = float(height - bottom)
        for layer in LAYERS:
            count = figures.series.get(layer, [0] * minutes)[i]
            if count:
                h = count * (height - bottom - 10) / peak
                y -= h
                bars.append({"x": round(left + offset * step, 1), "y": round(y, 1), "w": round(max(step - 1, 1), 1),
                             "h": round(h, 1), "layer": layer, "count": count,
                             "minute": _utc((now_minute - (minutes - 1 - i)) * 60)[11:16]})
    tick_every = next(t for t in (5, 10, 15, 30, 60) if shown / t <= 8)
    ticks = [{"x": round(left + (offset + 0.5) * step, 1),
              "label": _utc((now_minute - (minutes - 1 - (start + offset))) * 60)[11:16]}
             for offset in range(shown) if (shown - 1 - offset) % tick_every == 0 and offset != shown - 1]
    return {"width": left + width + 10, "height": height, "bars": bars, "ticks": ticks, "peak": peak,
            "base": height - bottom, "top": 10, "left": left, "now_x": round(left + (shown - 0.5) * step, 1),
            "minutes": shown}


def console_exception_handlers() -> dict[int | type[Exception], Callable[[Request[Any, Any, Any], Any], Response[Any]]]:
    """Not signed in: to the sign-in form. A change without its CSRF token: 403, nothing done."""

    def not_signed_in(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return Redirect(path="/console/login")

    def csrf_refused(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return Response(content="refused: this change lacks the console's CSRF token; reload the page and try again",
                        status_code=403, media_type="text/plain")

    return {NotSignedIn: not_signed_in, CsrfRefused: csrf_refused}
