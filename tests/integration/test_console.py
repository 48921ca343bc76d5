"""The operators' console (issue #35) in a real browser: Debian's Chromium driven by Playwright,
against a Strata on the test Redis Stack with the real embedder and the fake upstream.

Each page's screenshot goes to ``STRATA_CONSOLE_SHOTS`` (default ``.run/console-shots``, so that a
test run leaves the checkout clean); ``make console-shots`` writes them into docs/console/, which
docs/CONSOLE.md shows."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import add_key
from tests.integration.test_learning import forget_question, sem_doc
from tests.support import ADMIN_TOKEN, MODEL, FakeUpstream, ask, eventually, scan, serve_strata, strata_settings

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test dependency (make test-deps)")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="Debian's chromium is not installed (make test-deps installs it as root)")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / os.environ.get("STRATA_CONSOLE_SHOTS", ".run/console-shots")
CONSOLE = {"X-Cache-Category": "console"}
# As root, with the machine's network closed: no sandbox, no background connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("console") / "keys.json"
    default_key, _ = add_key(path, "default")
    acme_key, _ = add_key(path, "acme")
    acme_operator, _ = add_key(path, "acme", operator=True)
    return {"file": str(path), "default": default_key, "acme": acme_key, "acme_operator": acme_operator}


@pytest.fixture(scope="module")
def console_strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, keys: dict[str, str]) -> Iterator[str]:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, learning_refresh_s=0.0,
                               keys_file=keys["file"])
    with serve_strata(settings, use_encoder) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def strata(console_strata: str, fake_upstream: FakeUpstream) -> str:
    fake_upstream.reset()
    return console_strata


def signed_in(browser: Any, base: str, token: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(base + "/console/login")
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_url(base + "/console")
    return page


def shot(page: Any, name: str) -> None:
    """A full-page screenshot, after checking that the page fits its 1,280 px viewport's width."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"{name}: the page is {width} px wide"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def add_curated(page: Any, base: str, question: str, variants: str, answer: str) -> str:
    """Add a curated answer with the console's form (category ``console``); the message it shows."""
    page.goto(base + "/console/curated")
    form = page.locator("#add-curated")
    form.locator("select[name=category]").select_option("console")
    form.locator("input[name=question]").fill(question)
    form.locator("textarea[name=variants]").fill(variants)
    form.locator("textarea[name=answer]").fill(answer)
    form.locator("button").click()
    return str(page.locator("#message").inner_text())


def queued(base: str, upstream: FakeUpstream, key: str, cached: str, asked: str) -> None:
    """Cache ``cached``, then ask ``asked``: the decision refuses it (nothing measured yet) and,
    the fake model answering it otherwise, it goes to the review queue."""
    upstream.answers[asked] = f"Another matter altogether: {len(upstream.answers)}."
    assert ask(base, cached, key=key, headers=CONSOLE).headers["x-cache"] == "miss"
    assert ask(base, asked, key=key, headers=CONSOLE).headers["x-cache"] == "miss"


def test_sign_in_review_approve_serves_the_next_paraphrase_and_reject_vetoes(
        strata: str, fake_upstream: FakeUpstream, browser: Any, keys: dict[str, str], redis_sync: redis.Redis) -> None:
    queued(strata, fake_upstream, keys["default"], "怎么申请退款", "退款怎么申请")
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/review?category=console")
    assert eventually(lambda: (page.reload(), page.locator(".review-item").count())[1])
    item = page.locator(".review-item", has=page.locator(".asked", has_text="退款怎么申请"))
    assert item.count() == 1 and "怎么申请退款" in item.locator(".cached").inner_text()
    shot(page, "review")
    item.locator("button.approve").click()
    assert "Approved" in page.locator("#message").inner_text()
    # The next paraphrase of the approved question is served the cached answer.
    served = ask(strata, "退款怎么申请呢", key=keys["default"], headers=CONSOLE)
    assert served.headers["x-cache"] == "semantic-hit", served.headers
    # Rejected: never served at that similarity, though its record would vouch.
    queued(strata, fake_upstream, keys["default"], "怎么修改收货地址", "怎么删除收货地址")
    entry, _ = sem_doc(redis_sync, "怎么修改收货地址")
    # The miss's own differing answer vetoed it already; leave only the record, which would
    # vouch, so that the reviewer's no is what refuses it.
    redis_sync.hdel(entry, "wrong_above")
    redis_sync.hset(entry, mapping={f"confirmed:{b:03d}": 10 for b in range(50, 101)})
    page.goto(strata + "/console/review?category=console")
    pending = page.locator(".review-item .asked", has_text="怎么删除收货地址")
    assert eventually(lambda: (page.reload(), pending.count())[1]) == 1
    rejected = page.locator(".review-item", has=page.locator(".asked", has_text="怎么删除收货地址"))
    rejected.locator("button.reject").click()
    assert "Rejected" in page.locator("#message").inner_text()
    forget_question(redis_sync, "怎么删除收货地址")
    again = ask(strata, "怎么删除收货地址", key=keys["default"], headers=CONSOLE)
    assert again.headers["x-cache"] == "miss"
    page.goto(strata + "/console/audit")
    assert page.locator("#audit").get_by_text("approve").count() >= 1
    assert page.locator("#audit").get_by_text("reject").count() >= 1
    shot(page, "audit")
    page.goto(strata + "/console/served")
    assert page.locator("#hits").get_by_text("退款怎么申请呢").count() == 1
    shot(page, "served")
    # Marked wrong there, the hit shows on the review page beside the settled reviews.
    page.locator("#hits tr", has=page.get_by_text("退款怎么申请呢")).locator("button").click()
    assert "Marked wrong" in page.locator("#message").inner_text()
    page.goto(strata + "/console/review?category=console")
    marked = page.locator("#marked-wrong tr.marked", has=page.get_by_text("退款怎么申请呢"))
    assert marked.count() == 1 and "怎么申请退款" in marked.inner_text()
    verdicts = page.locator("#reviewed tr.settled").all_inner_texts()
    assert any("approve" in row and "退款怎么申请" in row for row in verdicts), verdicts
    assert any("reject" in row and "怎么删除收货地址" in row for row in verdicts), verdicts
    shot(page, "review-history")


def test_curated_answers_are_edited_in_the_browser_and_markup_shows_as_text(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/curated")
    form = page.locator("#add-curated")
    form.locator("select[name=category]").select_option("console")
    form.locator("input[name=question]").fill("营业时间是几点")
    form.locator("textarea[name=answer]").fill("每天九点到五点。")
    form.locator("button").click()
    assert "Saved" in page.locator("#message").inner_text()
    first = ask(strata, "营业时间是几点", key=keys["default"], headers=CONSOLE)
    assert first.json()["choices"][0]["message"]["content"] == "每天九点到五点。"
    # Edited: the next request, in other words, gets the new answer, markup and all, as text.
    entry = page.locator(".curated-entry", has=page.locator(".question", has_text="营业时间是几点"))
    entry.locator("textarea[name=answer]").fill("<script>alert('x')</script> 每天八点到六点。")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    entry.locator("button.save").click()
    assert "Saved" in page.locator("#message").inner_text()
    edited = ask(strata, "营业时间是几点?", key=keys["default"], headers=CONSOLE)
    assert "每天八点到六点" in edited.json()["choices"][0]["message"]["content"]
    page.goto(strata + "/console/curated")
    assert "<script>alert" in page.locator(".curated-entry textarea").first.input_value()
    assert page.evaluate("document.querySelectorAll('main script').length") == 0 and not dialogs
    shot(page, "curated")
    page.goto(strata + "/console/served")
    assert page.evaluate("document.querySelectorAll('main script').length") == 0 and not dialogs
    assert "&lt;script&gt;" in page.content()


def test_invalidate_asks_first_then_says_what_it_did_and_the_next_request_misses(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    assert ask(strata, "如何修改密码", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    assert ask(strata, "如何修改密码", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "exact-hit"
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/invalidate")
    page.locator("#invalidate input[name=category]").fill("console")
    page.locator("#invalidate input[name=tenant]").fill("default")
    page.click("#invalidate-submit")
    assert "console" in page.locator("#confirm").inner_text()
    shot(page, "invalidate")
    page.click("#confirm-invalidate")
    assert "Done: scope" in page.locator("#done").inner_text()
    assert ask(strata, "如何修改密码", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    # The overview draws what the workers' layer counts say, flushed every few seconds: this
    # tenant's card has the hit counted, its latency, the time saved and the learning curve.
    page.goto(strata + "/console")
    card = page.locator('.layer-card[data-tenant="default"][data-category="console"]')
    assert eventually(lambda: (page.reload(), card.count())[1], timeout=30)
    assert eventually(lambda: (page.reload(), re.search(r"exact [1-9]", card.inner_text()))[1], timeout=30)
    figures = card.locator(".figures").inner_text()
    assert re.search(r"hit p50 ≤ [\d.]+ m?s, p99 ≤ [\d.]+ m?s", figures), figures
    assert re.search(r"time saved: [\d.]+ s", figures) and re.search(r"miss p50 ≤ [\d.]+ m?s", figures), figures
    assert card.locator(".curve circle").count() >= 1
    shot(page, "overview")


def test_a_tenants_operator_sees_its_tenant_only_and_changes_need_the_csrf_token(
        strata: str, fake_upstream: FakeUpstream, browser: Any, keys: dict[str, str]) -> None:
    queued(strata, fake_upstream, keys["default"], "怎么挂失银行卡", "银行卡怎么挂失")
    page = signed_in(browser, strata, keys["acme_operator"])
    assert "tenant acme" in page.locator("header").inner_text()
    for url in ("/console/review?tenant=default&category=console", "/console/curated?tenant=default",
                "/console/served?tenant=default"):
        response = page.goto(strata + url)
        assert response.status == 403 and page.locator("#refused").count() == 1
    page.goto(strata + "/console/review?category=console")
    assert page.locator(".review-item").count() == 0  # default's item is not in acme's queue
    # Its overview counts acme's requests only, whatever the URL asks for.
    assert ask(strata, "如何查询余额", key=keys["acme"], headers=CONSOLE).headers["x-cache"] == "miss"
    assert page.goto(strata + "/console?tenant=default").status == 403
    page.goto(strata + "/console")
    acme_card = page.locator('.layer-card[data-tenant="acme"]')
    assert eventually(lambda: (page.reload(), acme_card.count())[1], timeout=30)
    assert page.locator('.layer-card:not([data-tenant="acme"])').count() == 0
    # Settling default's item by hand-made form: refused, nothing done.
    admin = signed_in(browser, strata, ADMIN_TOKEN)
    admin.goto(strata + "/console/review?category=console")
    target = admin.locator(".review-item", has=admin.locator(".asked", has_text="银行卡怎么挂失"))
    assert eventually(lambda: (admin.reload(), target.count())[1]) == 1
    identifier = target.get_attribute("data-id")
    csrf = page.locator("input[name=csrf]").first.input_value()
    refused = page.request.post(strata + "/console/review/settle", form={
        "csrf": csrf, "id": identifier, "tenant": "default", "category": "console", "verdict": "approve"})
    assert refused.status == 403
    # A change without the CSRF token: refused, nothing done.
    forged = admin.request.post(strata + "/console/review/settle", form={
        "id": identifier, "tenant": "default", "category": "console", "verdict": "approve"})
    assert forged.status == 403
    admin.goto(strata + "/console/review?category=console")
    assert admin.locator(".review-item", has=admin.locator(".asked", has_text="银行卡怎么挂失")).count() == 1
    # Not signed in: to the sign-in form; an API key that is no operator's does not sign in.
    assert httpx.get(strata + "/console/review", follow_redirects=False).status_code in (302, 303, 307)
    fresh = browser.new_context().new_page()
    fresh.goto(strata + "/console/login")
    fresh.fill("#token", keys["acme"])
    fresh.click("#sign-in")
    assert "does not sign in" in fresh.locator("#error").inner_text()


# --- Issue #44: a console a support lead can open after `make up` and trust.

def session_cookie(page: Any) -> dict[str, Any]:
    return next(c for c in page.context.cookies() if c["name"] == "strata_console")


def replayed(browser: Any, base: str, cookie: dict[str, Any], path: str = "/console/served") -> Any:
    """A fresh browser that presents only ``cookie``; returns the page after loading ``path``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_cookies([cookie])
    page = context.new_page()
    page.goto(base + path)
    return page


def test_make_ups_first_run_writes_an_admin_token_the_console_signs_in_with_and_rotating_it_ends_the_session(
        redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, browser: Any,
        tmp_path: Path) -> None:
    # What `make up` runs before it starts Strata with STRATA_ADMIN_TOKEN_FILE.
    up = subprocess.run(["make", "-n", "up"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "admin-token ensure" in up and "STRATA_ADMIN_TOKEN_FILE=" in up
    token_file = tmp_path / "strata" / "admin-token"
    made = subprocess.run([sys.executable, "-m", "app.cli", "admin-token", "ensure", "--file", str(token_file)],
                          cwd=ROOT, capture_output=True, text=True, env=_without_admin_token())
    assert made.returncode == 0 and str(token_file) in made.stdout, made
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, admin_token=None,
                               admin_token_file=str(token_file))
    with serve_strata(settings, use_encoder) as server:
        # The sign-in page, which anyone reaches, does not show where on the server the token is.
        anyone = browser.new_context().new_page()
        anyone.goto(server.url + "/console/login")
        assert str(token_file) not in anyone.content() and str(tmp_path) not in anyone.content()
        page = signed_in(browser, server.url, token)
        assert "every tenant" in page.locator("header").inner_text()
        # Rotated (a new file): the session signed in with the old token is over at its next request.
        rotated = subprocess.run([sys.executable, "-m", "app.cli", "admin-token", "rotate", "--file", str(token_file)],
                                 cwd=ROOT, capture_output=True, text=True, env=_without_admin_token())
        assert rotated.returncode == 0 and token_file.read_text().strip() != token
        assert eventually(lambda: page.goto(server.url + "/console/served") and page.url.endswith("/console/login"))
        signed_in(browser, server.url, token_file.read_text().strip())


def _without_admin_token() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("STRATA_ADMIN_TOKEN", "STRATA_ADMIN_TOKEN_FILE")}


def test_with_no_token_configured_the_sign_in_page_says_the_console_is_off_and_how_to_turn_it_on(
        redis_url: str, fake_upstream: FakeUpstream, use_encoder: Any, browser: Any) -> None:
    settings = strata_settings(redis_url, fake_upstream.url, semantic_enabled=True, admin_token=None)
    with serve_strata(settings, use_encoder) as server:
        page = browser.new_context().new_page()
        page.goto(server.url + "/console/login")
        off = page.locator("#console-off").inner_text()
        assert "console is off" in off and "make up" in off and "STRATA_ADMIN_TOKEN_FILE" in off


def test_signing_out_ends_the_session_so_its_cookie_replayed_is_refused(
        strata: str, browser: Any) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    cookie = session_cookie(page)
    assert replayed(browser, strata, cookie).url.endswith("/console/served")  # the cookie alone signs in
    page.click("#sign-out")
    page.wait_for_url(strata + "/console/login")
    again = replayed(browser, strata, cookie)
    assert again.url.endswith("/console/login"), again.url
    # A change with the old session and its CSRF token is refused too.
    csrf = page.context.request  # the signed-out browser has no session: its change goes to sign-in
    refused = csrf.post(strata + "/console/invalidate", form={"category": "console"}, max_redirects=0)
    assert refused.status in (302, 303, 307)


def test_a_removed_operator_keys_session_is_refused_at_its_next_request(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    key, record = add_key(Path(keys["file"]), "acme", operator=True)
    page = signed_in(browser, strata, key)
    page.goto(strata + "/console/invalidate")
    csrf = page.locator("input[name=csrf]").first.input_value()
    removed = subprocess.run([sys.executable, "-m", "app.cli", "keys", "--file", keys["file"], "revoke", record.id],
                             cwd=ROOT, capture_output=True, text=True)
    assert removed.returncode == 0, removed
    assert eventually(lambda: page.goto(strata + "/console/served") and page.url.endswith("/console/login"))
    # Its open session saves nothing: the change goes to the sign-in form.
    change = page.context.request.post(strata + "/console/invalidate", max_redirects=0,
                                       form={"csrf": csrf, "category": "console", "confirmed": "yes"})
    assert change.status in (302, 303, 307) and change.headers["location"].endswith("/console/login")


class _Framer(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        body = f'<!doctype html><title>framer</title><iframe id="f" src="{self.target}"></iframe>'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_page_of_another_origin_cannot_frame_the_signed_in_console(strata: str, browser: Any) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    handler = type("Framer", (_Framer,), {"target": strata + "/console/invalidate"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        refusals: list[str] = []
        page.on("console", lambda message: refusals.append(message.text))
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/", wait_until="load")
        frame = page.frame_locator("#f")
        # Same site (another port of the host), so the Strict cookie goes with the frame's request:
        # only the browser's refusal to render it keeps the console out of the frame.
        assert eventually(lambda: any("frame" in text.lower() for text in refusals)), refusals
        assert frame.locator("#invalidate").count() == 0 and frame.locator("header").count() == 0
    finally:
        server.shutdown()
    response = page.goto(strata + "/console/login")
    headers = response.headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "script-src 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer" and headers["cache-control"] == "no-store"


def test_a_message_in_the_url_is_never_shown_as_the_consoles_word(strata: str, browser: Any) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/served?message=Session+expired%2C+sign+in+at+http%3A%2F%2Fevil.example")
    assert page.locator("#message").count() == 0 and "evil.example" not in page.content()
    page.goto(strata + "/console/curated?message=curated-saved&detail=sign+in+at+evil.example&sig=forged")
    assert page.locator("#message").inner_text() == "Saved: the next request gets it."
    assert "evil.example" not in page.locator("main").inner_text()


def test_sign_in_attempts_are_limited_with_retry_after_and_audited(
        strata: str, browser: Any, redis_sync: redis.Redis) -> None:
    page = browser.new_context().new_page()
    try:
        statuses = []
        for attempt in range(11):
            page.goto(strata + "/console/login")
            page.fill("#token", f"guess-{attempt}")
            with page.expect_navigation() as navigation:
                page.click("#sign-in")
            statuses.append(navigation.value.status)
        assert statuses == [401] * 10 + [429], statuses
        assert int(navigation.value.headers["retry-after"]) > 0
        assert "Too many failed sign-ins" in page.locator("#error").inner_text()
        # Even the right token waits out the window from this address.
        page.fill("#token", ADMIN_TOKEN)
        with page.expect_navigation() as navigation:
            page.click("#sign-in")
        assert navigation.value.status == 429
        audited = [fields for _, fields in redis_sync.xrevrange("strata:meta:audit", count=50)
                   if fields.get(b"kind") == b"sign-in"]
        assert sum(f[b"target"] == b"refused" for f in audited) >= 9 and any(f[b"target"] == b"locked" for f in audited)
        assert all(b"guess" not in value for f in audited for value in f.values())  # no token in the audit
    finally:
        for key in redis_sync.scan_iter(match="strata:console:signin:*"):
            redis_sync.delete(key)


def test_a_curated_answer_wins_over_the_models_cached_answers_in_both_layers(
        strata: str, fake_upstream: FakeUpstream, browser: Any, keys: dict[str, str], redis_sync: redis.Redis) -> None:
    # The model's answers to the question and to a later variant, cached in both layers.
    assert ask(strata, "怎么开发票", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    assert ask(strata, "发票怎么开", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    model = ask(strata, "怎么开发票", key=keys["default"], headers=CONSOLE)
    assert model.headers["x-cache"] == "exact-hit" and model.headers["x-cache-source"] == "model"
    sem_doc(redis_sync, "怎么开发票")  # and its semantic copy
    page = signed_in(browser, strata, ADMIN_TOKEN)
    message = add_curated(page, strata, "怎么开发票", "发票怎么开\n开发票的流程", "在订单页点“申请发票”。")
    form = page.locator("#add-curated")
    removed = re.search(r"(\d+) cached model answers? to the same words removed", message)
    assert "Saved" in message and "怎么开发票" in message and removed and int(removed[1]) >= 1, message
    for question in ("怎么开发票", "发票怎么开", "开发票的流程"):
        served = ask(strata, question, key=keys["default"], headers=CONSOLE)
        assert served.headers["x-cache-source"] == "faq", (question, served.headers)
        assert served.json()["choices"][0]["message"]["content"] == "在订单页点“申请发票”。"
    entry = page.locator(".curated-entry", has=page.locator(".question", has_text="怎么开发票"))
    assert sorted(entry.locator(".variant").all_inner_texts()) == ["发票怎么开", "开发票的流程"]
    # No model copy is left in either layer.
    for key in scan(redis_sync, "strata:v1:*"):
        if redis_sync.type(key) == b"hash" and redis_sync.hget(key, "question") in ("怎么开发票".encode(), "发票怎么开".encode()):
            assert redis_sync.hget(key, "source") == b"faq", key
    # The same question again is refused with a word, not added twice.
    page.goto(strata + "/console/curated")
    form.locator("select[name=category]").select_option("console")
    form.locator("input[name=question]").fill("发票怎么开？")
    form.locator("textarea[name=answer]").fill("another")
    with page.expect_navigation() as navigation:
        form.locator("button").click()
    assert navigation.value.status == 409 and "curated already" in page.locator("#refused").inner_text()
    shot(page, "curated-duplicate")


def test_faq_load_removes_the_models_answer_to_the_same_words(
        strata: str, fake_upstream: FakeUpstream, redis_url: str, tmp_path: Path, keys: dict[str, str]) -> None:
    assert ask(strata, "how do i return an order?", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    faq = tmp_path / "returns.yaml"
    faq.write_text("- {category: console, question: 'How do I return an order?', answer: 'Use the Returns page.'}\n")
    env = {**os.environ, "STRATA_REDIS_URL": redis_url, "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml"}
    loaded = subprocess.run([sys.executable, "-m", "app.cli", "faq", "load", str(faq)], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert loaded.returncode == 0 and "1 model answers to the same questions removed" in loaded.stdout, loaded
    served = ask(strata, "how do i return an order?", key=keys["default"], headers=CONSOLE)
    assert served.headers["x-cache-source"] == "faq", served.headers
    assert served.json()["choices"][0]["message"]["content"] == "Use the Returns page."


def test_invalidating_a_question_removes_its_exact_and_semantic_copies(
        strata: str, browser: Any, keys: dict[str, str], redis_sync: redis.Redis) -> None:
    assert ask(strata, "如何注销账户", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"
    sem_doc(redis_sync, "如何注销账户")
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/invalidate")
    page.locator("#invalidate input[name=category]").fill("console")
    page.locator("#invalidate input[name=tenant]").fill("default")
    page.locator("#invalidate input[name=question]").fill("如何注销账户")
    page.locator("#invalidate input[name=model]").fill(MODEL)
    page.click("#invalidate-submit")
    page.click("#confirm-invalidate")
    done = page.locator("#done").inner_text()
    assert "如何注销账户" in done and "2 entries deleted" in done, done
    with pytest.raises(AssertionError):
        sem_doc(redis_sync, "如何注销账户")


def test_an_operator_naming_another_tenant_is_refused_and_its_empty_invalidate_form_does_nothing(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    page = signed_in(browser, strata, keys["acme_operator"])
    for url in ("/console?tenant=globex", "/console/served?tenant=globex", "/console/review?tenant=globex",
                "/console/curated?tenant=globex"):
        assert page.goto(strata + url).status == 403, url
    page.goto(strata + "/console/invalidate")
    with page.expect_navigation() as navigation:
        page.click("#invalidate-submit")
    assert navigation.value.status == 400 and "all of tenant acme" in page.locator("#error").inner_text()
    csrf = page.locator("input[name=csrf]").first.input_value()
    other = page.context.request.post(strata + "/console/curated/save", form={
        "csrf": csrf, "tenant": "globex", "category": "console", "question": "q", "answer": "a"})
    assert other.status == 403
    refit = page.context.request.post(strata + "/console/intents/refit", form={
        "csrf": csrf, "tenant": "globex", "category": "console"})
    assert refit.status == 403


def test_the_intents_page_shows_a_teams_head_its_rule_and_its_twins(
        strata: str, browser: Any, redis_url: str, tmp_path: Path) -> None:
    from tests.integration.test_intents import team_file

    loaded = subprocess.run([sys.executable, "-m", "app.cli", "intents", "load", str(team_file(tmp_path)), "--category",
                             "console"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "STRATA_REDIS_URL": redis_url, "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml"})
    assert loaded.returncode == 0, loaded.stderr
    page = signed_in(browser, strata, ADMIN_TOKEN)
    card = page.locator('.intents-card[data-category="console"]')
    assert eventually(lambda: (page.goto(strata + "/console/intents"), card.count())[1], timeout=15)
    text = card.inner_text()
    # Forty phrasings cannot show a 1% bound: the page says it certified nothing, and serves on probation.
    assert "4" in card.locator("td").first.inner_text() and "certified nothing before traffic" in text, text
    assert card.locator(".twins tr").count() >= 2
    # What the head reads: the index's embedder here (no STRATA_INTENT_EMBEDDER).
    assert card.locator("code.reads").inner_text().startswith("use-multilingual"), card.locator("code.reads").inner_text()
    # Refit from the page: it runs in the background, one at a time, and the page says what it did.
    with page.expect_navigation():
        card.locator("button.refit").click()
    assert "Refit started" in page.locator("#message").inner_text()
    assert eventually(lambda: (page.goto(strata + "/console/intents"),
                               "done" in card.locator(".refit-state").inner_text())[1], timeout=120)
    assert "0 approved pairs folded in: loaded 40 phrasings" in card.locator(".refit-state").inner_text()
    page.goto(strata + "/console/audit")
    assert "refit console" in page.locator("body").inner_text()
    page.goto(strata + "/console/intents")
    shot(page, "intents")
    subprocess.run([sys.executable, "-m", "app.cli", "intents", "remove", "--category", "console"], cwd=ROOT,
                   capture_output=True, env={**os.environ, "STRATA_REDIS_URL": redis_url,
                                             "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml"})


# A support lead's file: 8 intents x 6 phrasings (issue #56 item 4).
LEAD_FILE = {
    "change_address": ["how do i change my delivery address", "change the shipping address of my order",
                       "i moved, update my address", "can i edit where my parcel goes", "new delivery address please",
                       "update shipping address"],
    "cancel_order": ["cancel my order", "how do i cancel an order", "i want to cancel what i bought",
                     "stop my order please", "can i still cancel", "cancel the purchase"],
    "refund_status": ["where is my refund", "has my refund been sent", "refund not received yet",
                      "when do i get my money back", "status of my refund", "refund still pending"],
    "track_parcel": ["where is my parcel", "track my package", "has my order shipped", "tracking number please",
                     "when will my parcel arrive", "parcel location"],
    "return_item": ["how do i return an item", "send something back", "return policy for shoes",
                    "i want to return my order", "start a return", "can i return this"],
    "payment_methods": ["which payment methods do you accept", "can i pay with paypal", "do you take credit cards",
                        "pay by bank transfer", "is cash on delivery possible", "payment options"],
    "opening_hours": ["when are you open", "opening hours of the store", "are you open on sunday",
                      "what time do you close", "store hours", "holiday opening times"],
    "reset_password": ["i forgot my password", "reset my password", "cannot log in, password lost",
                       "change my login password", "password reset link", "how to recover my account password"],
}


def test_a_small_teams_intents_say_what_is_promised_before_traffic_and_over_it(
        strata: str, browser: Any, redis_url: str, redis_sync: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "lead.csv"
    path.write_text("text,intent\n" + "".join(f'"{t}",{i}\n' for i, texts in LEAD_FILE.items() for t in texts))
    env = {**os.environ, "STRATA_REDIS_URL": redis_url, "STRATA_POLICY_FILE": "tests/fixtures/policy.yaml"}
    loaded = subprocess.run([sys.executable, "-m", "app.cli", "intents", "load", str(path), "--category", "console"],
                            cwd=ROOT, capture_output=True, text=True, env=env)
    assert loaded.returncode == 0, loaded.stderr
    assert "Warning" not in loaded.stderr, loaded.stderr  # nothing before the command's own words
    # The last line says in plain words what the file can promise (nothing before traffic), and
    # what the rule does meanwhile (serves on probation, its record the promise).
    last = loaded.stdout.strip().splitlines()[-1]
    assert "rule: certifies nothing before traffic" in last and "48 (6.0 per intent)" in last, last
    assert last.index("loaded 48 phrasings") < last.index("rule: certifies nothing before traffic"), last
    assert "on probation from the first request" in last and "checked by the model after the response" in last, last
    try:
        page = signed_in(browser, strata, ADMIN_TOKEN)
        card = page.locator('.intents-card[data-category="console"]')
        assert eventually(lambda: (page.goto(strata + "/console/intents"), card.count())[1], timeout=15)
        promise = card.locator(".promise").inner_text()
        assert "Before traffic, from the file: nothing certified" in promise and "Over traffic, from the record" in promise, \
            promise
        # On probation, and how far (nothing asked in this category yet).
        assert "certified nothing before traffic; on probation from" in card.inner_text(), card.inner_text()
        assert "0 checked hits, 0 wrong" in card.inner_text(), card.inner_text()
        # The load's rule in full, below the table (a column too narrow for it read as a wall of words).
        rule = card.locator("p.rule").inner_text()
        assert rule.startswith("The rule, as the load said it:") and "on probation from the first request" in rule, rule
        rows = card.locator(".intent-list tr.intent-row")
        assert rows.count() == 8 and all(r.split("\t")[1] == "6" for r in rows.all_inner_texts()), rows.all_inner_texts()
        shot(page, "intents-small-file")
    finally:
        removed = subprocess.run([sys.executable, "-m", "app.cli", "intents", "remove", "--category", "console"],
                                 cwd=ROOT, capture_output=True, text=True, env=env)
    assert removed.returncode == 0, removed.stderr
    audited = [(f[b"who"].decode(), f[b"target"].decode()) for _, f in redis_sync.xrevrange("strata:meta:audit", count=20)
               if f.get(b"kind") == b"intents"]
    assert any(who.startswith("cli:") and target.startswith("load lead console") for who, target in audited), audited
    assert any(who.startswith("cli:") and target.startswith("remove console") for who, target in audited), audited


def test_the_add_form_keeps_what_was_typed_when_it_refuses_and_counts_agree(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    message = add_curated(page, strata, "Do you gift wrap?", "gift wrapping", "Yes, for 2 euros.")
    form = page.locator("#add-curated")
    assert "and 1 variant:" in message and "0 cached model answers" in message, message
    # Refused (the same question again): the page says why, and what was typed is still there.
    form.locator("select[name=category]").select_option("console")
    form.locator("input[name=question]").fill("do you gift-wrap")
    form.locator("textarea[name=variants]").fill("wrap it as a present")
    form.locator("textarea[name=answer]").fill("A long answer nobody wants to type twice.")
    with page.expect_navigation() as navigation:
        form.locator("button").click()
    assert navigation.value.status == 409 and "curated already" in page.locator("#refused").inner_text()
    assert form.locator("input[name=question]").input_value() == "do you gift-wrap"
    assert form.locator("textarea[name=variants]").input_value() == "wrap it as a present"
    assert form.locator("textarea[name=answer]").input_value() == "A long answer nobody wants to type twice."
    assert form.locator("select[name=category]").input_value() == "console"
    shot(page, "curated-refused-keeps-typing")
    # Removed from the page: its words are the model's again.
    entry = page.locator(".curated-entry", has=page.locator(".question", has_text="Do you gift wrap?"))
    with page.expect_navigation():
        entry.locator(".remove-curated button").click()
    assert "Removed" in page.locator("#message").inner_text()
    assert ask(strata, "Do you gift wrap?", key=keys["default"], headers=CONSOLE).headers["x-cache"] == "miss"


def test_invalidate_offers_the_categories_and_says_how_many_entries_would_go(
        strata: str, browser: Any, keys: dict[str, str]) -> None:
    for question in ("是否支持货到付款", "可以开增值税发票吗"):
        assert ask(strata, question, key=keys["acme"], headers=CONSOLE).headers["x-cache"] == "miss"
    page = signed_in(browser, strata, ADMIN_TOKEN)
    page.goto(strata + "/console/invalidate")
    offered = page.locator("#known-categories option").evaluate_all("options => options.map(o => o.value)")
    assert "console" in offered and "faq" in offered, offered
    assert "acme" in page.locator("#known-tenants option").evaluate_all("options => options.map(o => o.value)")
    page.locator("#invalidate input[name=category]").fill("console")
    page.locator("#invalidate input[name=tenant]").fill("acme")
    page.click("#invalidate-submit")
    # Two answers, each in both layers.
    assert "4 cached entries would go" in page.locator("#would-go").inner_text()
    shot(page, "invalidate-confirm")


def test_the_overview_explains_its_words(strata: str, browser: Any) -> None:
    page = signed_in(browser, strata, ADMIN_TOKEN)
    legend = page.locator("#precision-legend").inner_text()
    for words in ("explored hits", "entry record", "reader"):
        assert words in legend, legend
