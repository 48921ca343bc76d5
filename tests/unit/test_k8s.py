"""The Kubernetes manifests (deploy/k8s): every overlay renders with `kubectl kustomize`, every
object passes kubernetes-validate --strict for the versions docs/KUBERNETES.md names, and what a
platform team relies on without reading the code holds in the rendered YAML. (Played with podman:
`make test-k8s`, deploy/test-k8s.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.settings import PROJECT_ROOT, Settings

K8S = PROJECT_ROOT / "deploy" / "k8s"
OVERLAYS = ("local", "small", "production", "podman")
# The Kubernetes versions the docs promise (docs/KUBERNETES.md).
VERSIONS = ("1.30.0", "1.33.0", "1.37.0")
# Kinds no bundled schema covers (custom resources): checked by shape below.
CUSTOM = {"ServiceMonitor"}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")


def render(tree: Path, target: str) -> list[dict[str, Any]]:
    done = subprocess.run(["kubectl", "kustomize", str(tree / target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with the local overlay's token made (`make k8s-secrets` writes it in
    the checkout; a fresh clone has none)."""
    copy = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("secrets"))
    (copy / "overlays" / "local" / "secrets").mkdir()
    (copy / "overlays" / "local" / "secrets" / "admin-token").write_text("a-test-token-of-enough-length-0123\n")
    return copy


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(tree, f"overlays/{overlay}") for overlay in OVERLAYS}


def of(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(d["kind"], d["metadata"]["name"]) for d in documents])
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_of_every_overlay_passes_strict_validation(rendered: dict[str, list[dict[str, Any]]],
                                                               version: str) -> None:
    for documents in rendered.values():
        for document in documents:
            if document["kind"] in CUSTOM:
                continue
            kubernetes_validate.validate(document, version, strict=True)  # raises on any unknown or bad field


def test_an_unknown_field_is_refused_by_the_validation() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": 1}], "portz": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_the_components_render_and_the_service_monitor_scrapes_stratas_service(tree: Path) -> None:
    for component in ("redis-stack", "vllm-gpu", "vllm-cpu", "network-policy"):
        for document in render(tree, f"components/{component}"):
            kubernetes_validate.validate(document, VERSIONS[-1], strict=True)
    monitor = render(tree, "components/service-monitor")[0]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and set(monitor["spec"]) == {"selector", "endpoints"}
    service = of(render(tree, "base"), "Service", "strata")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]


def test_strata_runs_as_a_platform_expects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay in ("local", "small", "production"):
        documents = rendered[overlay]
        pod = of(documents, "Deployment", "strata")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/health", (overlay, probe)
        assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # Writable only where Strata writes: the workers' metrics folder and /tmp.
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        assert writable == {"/srv/strata/.run", "/tmp"}, writable
        # uvicorn finishes in-flight streams for 30 s after SIGTERM (app/serve.py): the pod gets longer.
        assert pod["terminationGracePeriodSeconds"] > 30 + 5
        token = next(e for e in container["env"] if e["name"] == "STRATA_ADMIN_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["key"] == "admin-token"
        assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
        # The settings ConfigMap holds STRATA_* settings Strata reads, and the policy is schemas/policy.yaml.
        settings_name = container["envFrom"][0]["configMapRef"]["name"]
        settings = of(documents, "ConfigMap", settings_name)["data"]
        assert all(name.startswith("STRATA_") for name in settings)
        # Every name is a setting Strata knows (the environment ignores an unknown one), every value parses.
        assert {name[len("STRATA_"):].lower() for name in settings} <= set(Settings.flat_names())
        read = Settings.from_env(settings)
        assert read.workers == int(settings["STRATA_WORKERS"])
        policy = next(v for v in pod["volumes"] if v["name"] == "policy")["configMap"]["name"]
        shipped = (PROJECT_ROOT / "schemas" / "policy.yaml").read_text(encoding="utf-8")
        assert of(documents, "ConfigMap", policy)["data"]["policy.yaml"] == shipped
        assert settings["STRATA_POLICY_FILE"] == "/etc/strata/policy/policy.yaml"
        assert of(documents, "PodDisruptionBudget", "strata") and of(documents, "HorizontalPodAutoscaler", "strata")
    production = of(rendered["production"], "Deployment", "strata")
    assert production["spec"]["replicas"] == 3
    settings = next(d for d in rendered["production"] if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"].startswith("strata-settings"))["data"]
    assert settings["STRATA_REDIS_URL"].startswith("redis+cluster://")


def test_the_model_server_and_redis_come_as_a_platform_expects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    small = rendered["small"]
    redis = of(small, "StatefulSet", "redis-stack")
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert "--dir" in redis["spec"]["template"]["spec"]["containers"][0]["args"]
    gpu = of(small, "Deployment", "vllm")["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in gpu["volumes"])  # /dev/shm
    assert "--enable-prefix-caching" in gpu["containers"][0]["args"]
    policies = {d["metadata"]["name"] for d in small if d["kind"] == "NetworkPolicy"}
    assert policies == {"redis-stack-from-strata-only", "vllm-from-strata-only"}
    local = rendered["local"]
    assert of(local, "PersistentVolumeClaim", "redis-stack-data")
    assert of(local, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "localhost/strata-vllm-cpu:latest"
    # The overlay podman plays: two Strata pods, URLs naming pods (kube play has no Services).
    podman = rendered["podman"]
    for name in ("strata", "strata-b"):
        container = of(podman, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        env = of(podman, "ConfigMap", container["envFrom"][0]["configMapRef"]["name"])["data"]
        assert env["STRATA_REDIS_URL"] == "redis://redis-stack-pod-0:6380/0"
        assert env["STRATA_UPSTREAM_URL"] == "http://vllm-pod-0:8000/v1"
        assert container["ports"][0]["hostIP"] == "127.0.0.1"


def test_the_bases_policy_is_the_shipped_one() -> None:
    assert (K8S / "base" / "policy.yaml").read_bytes() == (PROJECT_ROOT / "schemas" / "policy.yaml").read_bytes()
