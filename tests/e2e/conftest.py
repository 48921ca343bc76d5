"""A real vLLM for the end-to-end suite: the one on STRATA_TEST_VLLM_URL (or a `make up` one on
8000) when it answers, otherwise one this session starts on a free port and stops afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.conftest import ROOT
from tests.support import free_port, serve_strata

pytestmark = pytest.mark.e2e


def _answers(url: str) -> str | None:
    """The first served model's id, when a server answers at url."""
    try:
        response = httpx.get(url + "/v1/models", timeout=2)
        return response.json()["data"][0]["id"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


@pytest.fixture(scope="session")
def vllm() -> Iterator[tuple[str, str]]:
    """(base url, model id) of a running vLLM."""
    for url in filter(None, [os.environ.get("STRATA_TEST_VLLM_URL"), "http://127.0.0.1:8000"]):
        model = _answers(url)
        if model:
            yield url, model
            return
    port = free_port()
    run_dir = tempfile.mkdtemp(prefix="strata-test-vllm-")
    env = {**os.environ, "STACK_VLLM_PORT": str(port), "STACK_VLLM_DIR": run_dir}
    launcher = str(ROOT / "vllm" / "vllm.sh")
    started = subprocess.run([launcher, "start"], env=env, capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"could not start vLLM:\n{started.stdout}\n{started.stderr}")
    try:
        url = f"http://127.0.0.1:{port}"
        model = _answers(url)
        assert model, "vLLM started but does not list a model"
        yield url, model
    finally:
        subprocess.run([launcher, "stop"], env=env, capture_output=True)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def strata_e2e(redis_url: str, vllm: tuple[str, str]) -> Iterator[str]:
    url, _ = vllm
    settings = Settings.from_flat({"redis_url": redis_url, "upstream_url": url + "/v1", "upstream_timeout_s": 120.0,
                                   "default_max_tokens": 48, "semantic_enabled": False})
    with serve_strata(settings) as server:
        yield server.url
