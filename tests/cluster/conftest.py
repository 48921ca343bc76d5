"""Redis Clusters of the test session's own (redis-stack/cluster.sh), on free ports, stopped and
removed afterwards: three Redis Stack masters, and for the failover test three masters each with
a replica."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import FakeUpstream, fake_upstream_served, free_port

pytestmark = pytest.mark.cluster


@dataclass(frozen=True)
class LocalCluster:
    """A running local cluster: its masters' and replicas' ports, and where each node keeps its pid."""

    ports: list[int]
    replica_ports: list[int]
    folder: Path

    def pid(self, port: int) -> int:
        return int((self.folder / str(port) / "redis.pid").read_text())


# Free ports are picked before the nodes bind them, so another process (an outgoing connection
# takes ports from the same range) can take one in between: a start that fails is tried again on
# other ports, unless the caller named its ports.
START_ATTEMPTS = 3


@contextmanager
def local_cluster(replicas: bool = False, ports: list[int] | None = None, password: str = "") -> Iterator[LocalCluster]:
    script = str(ROOT / "redis-stack" / "cluster.sh")
    failures = []
    for _ in range(START_ATTEMPTS if ports is None else 1):
        masters, bus_ports = ports or [free_port() for _ in range(3)], [free_port() for _ in range(3)]
        replica_ports = [free_port() for _ in range(3)] if replicas else []
        replica_bus = [free_port() for _ in replica_ports]
        with tempfile.TemporaryDirectory(prefix="strata-cluster-") as folder:
            env = {**os.environ, "STACK_CLUSTER_PORTS": " ".join(map(str, masters)),
                   "STACK_CLUSTER_BUS_PORTS": " ".join(map(str, bus_ports)), "STACK_CLUSTER_DIR": folder,
                   "STACK_CLUSTER_REPLICA_PORTS": " ".join(map(str, replica_ports)),
                   "STACK_CLUSTER_REPLICA_BUS_PORTS": " ".join(map(str, replica_bus)),
                   "STACK_CLUSTER_PASSWORD": password, "STACK_PYTHON": str(ROOT / ".venv" / "bin" / "python")}
            started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=150)
            if started.returncode != 0:
                subprocess.run(["bash", script, "stop"], env=env, check=False, capture_output=True, timeout=60)
                failures.append(f"{started.stdout}{started.stderr}".strip())
                continue
            try:
                yield LocalCluster(masters, replica_ports, Path(folder))
            finally:
                subprocess.run(["bash", script, "stop"], env=env, check=False, capture_output=True, timeout=60)
            return
    raise RuntimeError("redis-stack/cluster.sh start failed: " + " / ".join(failures))


@pytest.fixture(scope="session")
def cluster_ports() -> Iterator[list[int]]:
    with local_cluster() as cluster:
        yield cluster.ports


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    """A fake upstream of the module's own (its counts are the module's)."""
    with fake_upstream_served() as fake:
        yield fake
