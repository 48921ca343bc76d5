"""The operators' console (issue #35) in a real browser: Debian's Chromium driven by Playwright,
against a Strata on the test Redis Stack with the real embedder and the fake upstream.

Each page's screenshot goes to ``STRATA_CONSOLE_SHOTS`` (default ``.run/console-shots``, so that a
test run leaves the checkout clean); ``make console-shots`` writes them into docs/console/, which
docs/CONSOLE.md shows."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.auth import add_key
from tests.integration.test_learning import forget_question, sem_doc
from tests.support import ADMIN_TOKEN, FakeUpstream, ask, eventually, serve_strata, strata_settings

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
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


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
    page.goto(strata + "/console?tenant=default")
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
