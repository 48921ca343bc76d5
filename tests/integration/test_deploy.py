"""The Grafana dashboard and the Prometheus alerts use only metrics a running Strata exposes,
and the alert rules pass `promtool check rules` (when promtool is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support import FakeUpstream, ask, serve_strata, strata_settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "strata.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\bstrata_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load(ALERTS.read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return exprs


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


@pytest.fixture(scope="module")
def strata(redis_url: str, fake_upstream: FakeUpstream, use_encoder: object) -> Iterator[str]:
    with serve_strata(strata_settings(redis_url, fake_upstream.url, semantic_enabled=True), use_encoder) as server:
        yield server.url


def test_every_metric_the_dashboard_and_alerts_use_is_exposed(strata: str) -> None:
    ask(strata, "deploy check")
    ask(strata, "deploy check")
    text = httpx.get(strata + "/metrics").text
    exposed = {family(line.split()[2]) for line in text.splitlines() if line.startswith("# TYPE ")}
    used = {family(name) for expr in expressions() for name in METRIC.findall(expr)}
    assert len(used) >= 10
    assert used <= exposed, f"not on /metrics: {sorted(used - exposed)}"
    # Label values the rules select on exist too.
    assert 'strata_dependency_up{dependency="redis"} 1.0' in text
    assert 'outcome="exact-hit"' in text


def test_the_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "strata" and dashboard["panels"]
    assert all(p["datasource"]["uid"] == "${datasource}" and p["targets"] for p in dashboard["panels"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian package prometheus)")
def test_promtool_accepts_the_alert_rules() -> None:
    result = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
