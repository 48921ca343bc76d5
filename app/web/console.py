"""The operators' console at ``/console`` (issue #35): server-rendered pages, no build step.

Who may see what: the admin token (``STRATA_ADMIN_TOKEN``) sees every tenant; a tenant's operator
key (``strata keys add --tenant T --operator``) sees and changes tenant T only, whatever a URL
names. Sessions are signed cookies (app/web/sessions.py); every change is a POST with the
session's CSRF token and is audited with who made it (``strata:meta:audit``). Templates escape
everything they show (Jinja autoescape), so a cached answer holding markup is shown as text.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import Controller, Request, Response, get, post
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template
from litestar.template.config import TemplateConfig

from app.auth import KEY_PREFIX
from app.cache.base import CACHE_ERRORS
from app.cache.feedback import FeedbackError, FeedbackRequest
from app.cache.invalidation import Invalidated, Invalidation, InvalidationError, NothingThere
from app.cache.keys import FIELD_ANSWER, FIELD_CATEGORY, FIELD_QUESTION, FIELD_ROOT, FIELD_TENANT, as_text, layers_key
from app.cache.recent import RECENT_HITS
from app.cache.review import ReviewItem
from app.cache.usage import LAYERS
from app.cache.verify import READER_ACCEPTED
from app.errors import StrataError
from app.faq import FaqItem, curated_completion, load_faq_in_buckets
from app.lifespan import Resources, sweep_generations_after, sweep_versions_after
from app.web.overview import CURVE_SLOT_MINUTES, LayerFigures, layer_figures
from app.web.sessions import SESSION_COOKIE, SESSION_TTL_S, ConsoleSession, SessionSigner

TEMPLATES = Path(__file__).parent / "templates"
# Minutes the overview draws (what `strata:meta:layers:<minute>` keeps: two hours).
OVERVIEW_MINUTES = 120
# Audit entries the review page reads for hits marked wrong and reviews settled.
AUDIT_SCANNED = 500
ITEM_ID = re.compile(r"^[0-9a-f]{24}$")


def _utc(unix_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(unix_time)))


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """The console's templates, every one autoescaped."""
    environment = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    environment.filters["utc"] = _utc
    return TemplateConfig(instance=JinjaTemplateEngine.from_environment(environment))


class NotSignedIn(Exception):
    """No valid session: the page redirects to the sign-in form."""


def _signer(resources: Resources) -> SessionSigner:
    secret = resources.ids.signing_secret
    if secret is None:
        raise StrataError("the console needs the shared secret, which is not adopted yet: try again in a minute")
    return SessionSigner(secret)


def _session(request: Request[Any, Any, Any], resources: Resources) -> ConsoleSession:
    session = _signer(resources).open(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise NotSignedIn
    return session


def _who(session: ConsoleSession, request: Request[Any, Any, Any]) -> str:
    client = request.client.host if request.client else "unknown"
    scope = f" ({session.tenant})" if session.tenant else ""
    return f"console:{session.who}{scope}@{client}"


def _page(name: str, session: ConsoleSession | None, resources: Resources, status: int = 200,
          **context: Any) -> Template:
    csrf = _signer(resources).csrf_token(session) if session is not None else ""
    return Template(template_name=name, status_code=status,
                    context={"session": session, "csrf": csrf, "categories": _semantic_categories(resources), **context})


def _forbidden(session: ConsoleSession, resources: Resources, message: str) -> Template:
    return _page("error.html", session, resources, status=403, message=message)


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
    session = _session(request, resources)
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


class ConsoleController(Controller):
    path = "/console"
    include_in_schema = False

    @get("/login")
    async def login_form(self, resources: Resources) -> Template:
        return _page("login.html", None, resources)

    @post("/login")
    async def login(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Sign in with the admin token or a tenant operator's key; a cookie carries the session."""
        token = (await _form(request)).get("token", "").strip()
        who, tenant = self._authenticate(token, resources)
        if who is None:
            return _page("login.html", None, resources, status=401, error="That token does not sign in to the console.")
        _, cookie = _signer(resources).new(who, tenant)
        response = Redirect(path="/console")
        response.cookies.append(Cookie(key=SESSION_COOKIE, value=cookie, max_age=SESSION_TTL_S, httponly=True,
                                       secure=True, samesite="strict", path="/console"))
        return response

    @staticmethod
    def _authenticate(token: str, resources: Resources) -> tuple[str | None, str | None]:
        admin = resources.settings.admin_token
        if admin and token and hmac.compare_digest(token.encode(), admin.encode()):
            return "admin", None
        if token.startswith(KEY_PREFIX):
            try:
                caller = resources.tenants.caller(f"Bearer {token}")
            except StrataError:
                return None, None
            if caller.operator:
                key_id = token[len(KEY_PREFIX):].partition("-")[0]
                return f"operator:{key_id}", caller.tenant
        return None, None

    @post("/logout")
    async def logout(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        await _change(request, resources)
        response = Redirect(path="/console/login")
        response.delete_cookie(SESSION_COOKIE, path="/console")
        return response

    @get("/")
    async def overview(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None) -> Template:
        """Per tenant and category: requests by answering layer per minute, model calls and time
        saved, hit latency, the learning curve; and each adaptive category's live precision
        against its bound (the tenant's own pool for an operator)."""
        session = _session(request, resources)
        shown = _tenant_of(session, tenant)
        layers = await self._layers(resources, shown)
        precision = []
        semantic = resources.cache.semantic
        tag = resources.cache.known_version
        adaptive = set()
        if semantic is not None and tag is not None:
            for name in _semantic_categories(resources):
                policy = resources.policy.categories[name].semantic
                if policy.error_bound is None:
                    continue
                adaptive.add(name)
                try:
                    figures = await semantic.adaptive.precision(tag, name, policy, shown)
                except CACHE_ERRORS:
                    continue
                precision.append({"category": name, **msgspec.to_builtins(figures),
                                  "estimate": figures.error_estimate})
        return _page("overview.html", session, resources, layers=layers, precision=precision, tenant=shown,
                     version=tag, adaptive=adaptive, minutes=OVERVIEW_MINUTES, layer_names=LAYERS,
                     curve_slot=CURVE_SLOT_MINUTES)

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
                     category: str | None = None, verdict: str | None = None) -> Template:
        """This worker's recent semantic hits: both questions, the similarity, the rule, the answer."""
        session = _session(request, resources)
        if tenant and not session.sees(tenant):
            return _forbidden(session, resources, "You cannot see another tenant's hits.")
        hits = resources.recent.latest(tenant=_tenant_of(session, tenant), category=category or None,
                                       verdict=verdict or None)
        return _page("served.html", session, resources, hits=hits, tenant=tenant or "", category=category or "",
                     verdict=verdict or "", message=request.query_params.get("message", ""))

    @post("/served/wrong")
    async def mark_wrong(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Mark a served hit wrong: the feedback path (a veto at that similarity), audited."""
        session, form = await _change(request, resources)
        response_id = form.get("response_id", "")
        hit = next((h for h in resources.recent.latest(count=10_000) if h.response_id == response_id), None)
        if hit is None or not session.sees(hit.tenant):
            return _forbidden(session, resources, "No such hit of yours.")
        feedback = resources.cache.feedback
        if feedback is None:
            return _page("error.html", session, resources, status=503, message="The cache is not reachable.")
        try:
            await feedback.give(FeedbackRequest(id=response_id, verdict="wrong"), tenant=hit.tenant, user=None,
                                who=_who(session, request))
            message = "Marked wrong: it is not served there again."
        except FeedbackError as exc:
            message = f"Not recorded: {exc}"
        return Redirect(path="/console/served", query_params={"message": message})

    @get("/review")
    async def review(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None,
                     category: str = "faq") -> Template:
        """The review queue: the refused grey-zone candidates of a tenant and category, most asked first."""
        session = _session(request, resources)
        if tenant and not session.sees(tenant):
            return _forbidden(session, resources, "You cannot see another tenant's queue.")
        shown = _tenant_of(session, tenant) or "default"
        items: list[ReviewItem] = []
        tag = resources.cache.known_version
        if tag is not None and category in resources.policy.categories:
            bucket = resources.cache.each[resources.cache.buckets.of(shown, category)] if resources.cache.each else None
            if bucket is not None:
                items = await bucket.review.items(tag, category, shown)
        settled = await self._settled(resources, shown, category)
        promoted = resources.recent.latest(tenant=shown, category=category, verdict=READER_ACCEPTED, count=20)
        return _page("review.html", session, resources, items=items, tenant=shown, category=category,
                     message=request.query_params.get("message", ""), promoted=promoted,
                     marked_wrong=settled["marked_wrong"], reviewed=settled["reviewed"])

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
            return _page("error.html", session, resources, status=400, message="Not a review verdict.")
        if not session.sees(tenant) or category not in resources.policy.categories:
            return _forbidden(session, resources, "You cannot settle another tenant's queue.")
        tag = resources.cache.known_version
        bucket = resources.cache.each[resources.cache.buckets.of(tenant, category)] if resources.cache.each else None
        item = await bucket.review.get(tag, identifier) if bucket is not None and tag is not None else None
        if bucket is None or tag is None or item is None or item.tenant != tenant or item.category != category:
            return _forbidden(session, resources, "That item is not in your queue (settled already, or expired).")
        assert bucket.learner is not None
        took = await bucket.learner.settle_review(tag, item, approved, resources.policy.categories[category].semantic)
        await bucket.review.remove(tag, item, "approve" if approved else "reject")
        who = _who(session, request)
        await resources.cache.invalidator.audit_log.record_event(
            who=who, done=Invalidated(kind="review", target=f"{'approve' if approved else 'reject'} {item.id}"),
            request={"asked": item.asked, "cached": item.cached, "similarity": item.similarity, "root": item.root,
                     "tenant": tenant, "category": category, "took_effect": took})
        message = ("Approved: the next paraphrase is served this answer." if approved and took
                   else "Rejected: this answer is not served there." if not approved
                   else "Not applied: the entry is gone or full.")
        return Redirect(path="/console/review", query_params={"message": message, "category": category,
                                                               **({"tenant": tenant} if session.tenant is None else {})})

    @get("/curated")
    async def curated(self, request: Request[Any, Any, Any], resources: Resources, tenant: str | None = None) -> Template:
        """Curated answers: every file's entries (the operator's tenant only)."""
        session = _session(request, resources)
        if tenant and not session.sees(tenant):
            return _forbidden(session, resources, "You cannot see another tenant's curated answers.")
        shown = _tenant_of(session, tenant)
        entries = await self._curated_entries(resources, shown)
        return _page("curated.html", session, resources, entries=entries, tenant=shown or "",
                     message=request.query_params.get("message", ""))

    @staticmethod
    async def _curated_entries(resources: Resources, tenant: str | None) -> list[dict[str, str]]:
        tag = resources.cache.known_version
        found: list[dict[str, str]] = []
        if tag is None:
            return found
        for bucket in resources.cache.each:
            redis, keys = bucket.bucket.redis, bucket.bucket.keys
            async for set_key in redis.scan_iter(match=keys.faq_set_key(tag, "*"), count=500):
                name = str(as_text(set_key)).rsplit(":", 1)[-1]
                for member in sorted(str(as_text(m)) for m in await redis.smembers(set_key)):
                    question, answer, root, owner, category = await redis.hmget(
                        member, [FIELD_QUESTION, FIELD_ANSWER, FIELD_ROOT, FIELD_TENANT, FIELD_CATEGORY])
                    if question is None or str(as_text(root)) != member:
                        continue  # a variant, or gone
                    owner_text = str(as_text(owner))
                    if tenant is not None and owner_text != tenant:
                        continue
                    found.append({"key": member, "file": name, "question": str(as_text(question)),
                                  "answer": _answer_text(answer), "tenant": owner_text,
                                  "category": str(as_text(category))})
        return found

    @post("/curated/save")
    async def save_curated(self, request: Request[Any, Any, Any], resources: Resources) -> Response[Any]:
        """Edit a curated answer (``key`` given) or add one; audited."""
        session, form = await _change(request, resources)
        answer = form.get("answer", "").strip()
        if not answer:
            return _page("error.html", session, resources, status=400, message="An answer must not be empty.")
        key = form.get("key", "")
        who = _who(session, request)
        if key:
            entry = next((e for e in await self._curated_entries(resources, session.tenant) if e["key"] == key), None)
            if entry is None:
                return _forbidden(session, resources, "No such curated answer of yours.")
            await self._rewrite_answer(resources, entry, answer)
            done = Invalidated(kind="curated", target=f"edit {key}")
            request_fields: dict[str, object] = {"question": entry["question"], "answer": answer}
        else:
            tenant = session.tenant or form.get("tenant", "").strip() or "default"
            category, question = form.get("category", "faq"), form.get("question", "").strip()
            if category not in _semantic_categories(resources) or not question:
                return _page("error.html", session, resources, status=400,
                             message="A curated answer needs a question and a category with a semantic layer.")
            name = "console-" + hashlib.sha256(f"{tenant}\x1f{category}\x1f{question}".encode()).hexdigest()[:16]
            item = FaqItem(category=category, question=question, answer=answer, tenant=tenant)
            await load_faq_in_buckets(resources.cache, [item], name, resources.policy)
            done = Invalidated(kind="curated", target=f"add {name}")
            request_fields = {"question": question, "answer": answer, "tenant": tenant, "category": category}
        await resources.cache.invalidator.audit_log.record_event(who=who, done=done, request=request_fields)
        return Redirect(path="/console/curated", query_params={"message": "Saved: the next request gets it."})

    @staticmethod
    async def _rewrite_answer(resources: Resources, entry: dict[str, str], answer: str) -> None:
        """The new answer on the entry and on each of its variants (documents of its file)."""
        tag = resources.cache.known_version
        completion = curated_completion(answer, int(time.time()))
        for bucket in resources.cache.each:
            redis, keys = bucket.bucket.redis, bucket.bucket.keys
            members = await redis.smembers(keys.faq_set_key(str(tag), entry["file"]))
            for member in members:
                if str(as_text(await redis.hget(member, FIELD_ROOT))) == entry["key"]:
                    await redis.hset(member, FIELD_ANSWER, completion)

    @get("/invalidate")
    async def invalidate_form(self, request: Request[Any, Any, Any], resources: Resources) -> Template:
        session = _session(request, resources)
        return _page("invalidate.html", session, resources, confirm=None, done=None)

    @post("/invalidate")
    async def invalidate(self, request: Request[Any, Any, Any], resources: Resources) -> Template:
        """Invalidate by category, tenant, user, entry or question: a confirmation first, then
        the affected count; audited. An operator invalidates within its tenant only."""
        session, form = await _change(request, resources)
        fields = {k: form[k].strip() for k in ("category", "tenant", "user", "key", "question", "model")
                  if form.get(k, "").strip()}
        if session.tenant is not None:
            if "tenant" in fields and fields["tenant"] != session.tenant:
                return _forbidden(session, resources, "You cannot invalidate another tenant's entries.")
            if "key" in fields:
                try:
                    owner = await resources.cache.invalidator.for_key(fields["key"]).redis.hget(fields["key"], FIELD_TENANT)
                except CACHE_ERRORS:
                    owner = None
                if owner is None or str(as_text(owner)) != session.tenant:
                    return _forbidden(session, resources, "That entry is not your tenant's.")
            else:
                fields["tenant"] = session.tenant
        try:
            what = msgspec.convert(fields, Invalidation)
            resources.cache.invalidator.check(what)
        except (msgspec.ValidationError, InvalidationError) as exc:
            return _page("invalidate.html", session, resources, status=400, confirm=None, done=None, error=str(exc))
        if not fields and session.tenant is not None:
            return _forbidden(session, resources, "Only the admin invalidates everything.")
        if form.get("confirmed") != "yes":
            return _page("invalidate.html", session, resources, confirm=fields, done=None)
        try:
            done = await resources.cache.invalidator.invalidate(what, who=_who(session, request))
        except NothingThere as exc:
            return _page("invalidate.html", session, resources, status=404, confirm=None, done=None, error=str(exc))
        except InvalidationError as exc:
            return _page("invalidate.html", session, resources, status=400, confirm=None, done=None, error=str(exc))
        if done.kind == "everything":
            resources.spawn(sweep_versions_after(resources), f"sweep-{done.version}")
        elif done.kind == "scope":
            resources.spawn(sweep_generations_after(resources), f"sweep-{done.target}")
        return _page("invalidate.html", session, resources, confirm=None, done=msgspec.to_builtins(done))

    @get("/audit")
    async def audit(self, request: Request[Any, Any, Any], resources: Resources) -> Template:
        """The audit log: invalidations, reviews and curated edits, newest first (an operator's own tenant's)."""
        session = _session(request, resources)
        rows = await resources.cache.invalidator.audit(200)
        if session.tenant is not None:
            rows = [r for r in rows if f"({session.tenant})@" in r.get("who", "")
                    or f'"tenant":{msgspec.json.encode(session.tenant).decode()}' in r.get("request", "")]
        return _page("audit.html", session, resources, rows=rows)


def _answer_text(stored: bytes | str | None) -> str:
    if stored is None:
        return ""
    try:
        decoded = msgspec.json.decode(stored if isinstance(stored, bytes) else stored.encode())
        return str(decoded["choices"][0]["message"]["content"])
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return ""


def console_exception_handlers() -> dict[int | type[Exception], Callable[[Request[Any, Any, Any], Any], Response[Any]]]:
    """Not signed in: to the sign-in form. A change without its CSRF token: 403, nothing done."""

    def not_signed_in(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return Redirect(path="/console/login")

    def csrf_refused(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return Response(content="refused: this change lacks the console's CSRF token; reload the page and try again",
                        status_code=403, media_type="text/plain")

    return {NotSignedIn: not_signed_in, CsrfRefused: csrf_refused}
