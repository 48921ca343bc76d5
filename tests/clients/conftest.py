"""The client conformance suite's stack: a vLLM-shaped fake upstream, Strata over the test Redis,
and the interpreters whose client libraries are tried (this one, and `.venv-clients`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import PROJECT_ROOT
from tests.support import FakeUpstream, ServerThread, serve_strata, strata_settings

# Built by `make test` (Makefile: CLIENTS_VENV): the client libraries, pinned, apart from Strata's
# own environment (they pin an openai SDK of their own, 2.x; this one has 3.x).
CLIENTS_PYTHON = PROJECT_ROOT / ".venv-clients" / "bin" / "python"


@pytest.fixture(scope="session")
def clients_python() -> Path:
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CLIENTS_PYTHON} is missing: `make test` builds it")
        pytest.skip(f"{CLIENTS_PYTHON} is missing: run `make client-deps`")
    return CLIENTS_PYTHON


@pytest.fixture(scope="session")
def this_python() -> Path:
    return Path(sys.executable)


@pytest.fixture(scope="module")
def vllm_fake() -> Iterator[FakeUpstream]:
    """An upstream that calls tools on `auto` as a tool-using model would."""
    upstream = FakeUpstream(tool_calls=True)
    with ServerThread(upstream.app()) as server:
        upstream.url = server.url
        yield upstream


@pytest.fixture(scope="module")
def client_strata(redis_url: str, vllm_fake: FakeUpstream) -> Iterator[str]:
    settings = strata_settings(redis_url, vllm_fake.url, upstream_timeout_s=5.0)
    with serve_strata(settings) as server:
        yield server.url
