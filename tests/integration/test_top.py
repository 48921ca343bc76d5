"""`strata top` as a person uses it: in tmux, against a running Strata, quit with q."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, FakeUpstream, ask, run_cli, serve_strata, strata_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def strata(redis_url: str, fake_upstream: FakeUpstream) -> Iterator[str]:
    with serve_strata(strata_settings(redis_url, fake_upstream.url)) as server:
        yield server.url


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_shows_traffic_live_and_quits_with_q(strata: str, fake_upstream: FakeUpstream) -> None:
    fake_upstream.reset()
    session = f"strata-top-{uuid.uuid4().hex[:8]}"
    command = f"cd {ROOT} && {sys.executable} -m app.cli top --url {strata} --interval 0.5"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "130", "-y", "40", command], check=True)
    try:
        deadline = time.monotonic() + 20
        screen = ""
        while time.monotonic() < deadline:
            for i in range(5):
                ask(strata, f"top question {i}")  # a miss, then exact hits
            screen = tmux("capture-pane", "-p", "-t", session)
            if "faq" in screen and "exact-hit" in screen and "requests/s" in screen:
                break
            time.sleep(0.3)
        assert "requests/s" in screen and "upstream calls saved" in screen, screen
        assert any(line.startswith("faq") for line in screen.splitlines()), screen  # the category row
        tmux("send-keys", "-t", session, "q")
        deadline = time.monotonic() + 5
        while session in tmux("list-sessions", "-F", "#{session_name}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session not in tmux("list-sessions", "-F", "#{session_name}")  # q ended it
    finally:
        tmux("kill-session", "-t", session)


def test_top_once_prints_a_frame_and_an_unreachable_url_is_a_clear_error(strata: str) -> None:
    ask(strata, "top once")
    for _ in range(2):  # a miss, then a hit, in the Responses API
        assert httpx.post(strata + "/v1/responses", json={"model": MODEL, "input": "top once?"}, timeout=10).status_code == 200
    frame = run_cli("top", "--url", strata, "--once", "--interval", "0.2")
    assert frame.returncode == 0 and "requests/s" in frame.stdout and "hits" in frame.stdout
    rows = {line.split()[0]: line for line in frame.stdout.splitlines() if line.strip()}
    assert "chat" in rows and "responses" in rows, frame.stdout  # the endpoint rows
    assert rows["responses"].rstrip().endswith("50.0%"), rows["responses"]  # one hit of two, since start
    down = run_cli("top", "--url", "http://127.0.0.1:9", "--once")
    assert down.returncode == 2 and "cannot read" in down.stdout
