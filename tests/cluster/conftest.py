"""A Redis Cluster of the test session's own: three Redis Stack masters on free ports
(redis-stack/cluster.sh), stopped and removed afterwards."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.support import free_port

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="session")
def cluster_ports() -> Iterator[list[int]]:
    ports, bus_ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    with tempfile.TemporaryDirectory(prefix="strata-cluster-") as folder:
        env = {**os.environ, "STACK_CLUSTER_PORTS": " ".join(map(str, ports)),
               "STACK_CLUSTER_BUS_PORTS": " ".join(map(str, bus_ports)), "STACK_CLUSTER_DIR": folder,
               "STACK_PYTHON": str(ROOT / ".venv" / "bin" / "python")}
        script = str(ROOT / "redis-stack" / "cluster.sh")
        started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            subprocess.run(["bash", script, "stop"], env=env, check=False, capture_output=True, timeout=60)
            raise RuntimeError(f"redis-stack/cluster.sh start failed: {started.stdout}{started.stderr}")
        try:
            yield ports
        finally:
            subprocess.run(["bash", script, "stop"], env=env, check=False, capture_output=True, timeout=60)
