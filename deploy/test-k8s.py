"""`make test-k8s`: Strata's Kubernetes manifests run on this machine, no cluster needed.

The podman overlay (deploy/k8s/overlays/podman: the local overlay as `podman kube play` runs it)
is rendered with `kubectl kustomize` and played: Redis Stack with its AOF on a claim, vLLM's CPU
build, and **two Strata pods on one Redis**, on the images `make image` builds. Then, each step
timed: a miss then an exact hit through each pod; a curated answer saved through one pod served
by the other (a semantic hit); identical misses sent to both pods at once make one model call;
the console signed in with the token from the rendered Secret; a Strata container killed and
brought back by its restart policy while the other pod answers; the Redis pod restarted with the
entries kept; everything taken down with its volumes, its secrets and its network.

The rendered YAML is played as rendered, except its Secrets: podman 4.3 stores a played `kind:
Secret` in a form its own `secretKeyRef` cannot read, so each is made first with `podman secret
create NAME FILE` (FILE: a JSON map of each key to its base64 value, taken from the rendered
document) and left out of the played file.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "podman"
LOCAL_TOKEN = ROOT / "deploy" / "k8s" / "overlays" / "local" / "secrets" / "admin-token"
PODS = {"strata": 18080, "strata-b": 18081}
REDIS_POD = "redis-stack-pod-0"
SESSION_COOKIE = "strata_console"  # app/web/sessions.py
MODEL = "SmolLM2-135M-Instruct"
started = time.monotonic()


def say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} test-k8s: {what} ({time.monotonic() - started:.0f} s)", flush=True)


def run(*command: str, check: bool = True, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, env=env, **kwargs)
    if check and done.returncode != 0:
        raise SystemExit(f"test-k8s: FAILED: {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return done


def wait_for(what: str, limit: float, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"test-k8s: FAILED: {what} not within {limit:.0f} s")
        time.sleep(1)


def http(method: str, url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
         form: dict[str, str] | None = None, timeout: float = 180) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else urllib.parse.urlencode(form).encode() if form else None
    sent = {"content-type": "application/json" if body is not None else "application/x-www-form-urlencoded",
            **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=sent)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def base(pod: str) -> str:
    return f"http://127.0.0.1:{PODS[pod]}"


def healthy(pod: str) -> bool:
    try:
        return http("GET", base(pod) + "/health", timeout=3)[0] == 200
    except OSError:
        return False


def model_up(pod: str) -> bool:
    try:
        status, _, body = http("GET", base(pod) + "/health", timeout=5)
        return status == 200 and json.loads(body).get("upstream", {}).get("status") == "ok"
    except (OSError, ValueError):
        return False


def ask(pod: str, question: str) -> tuple[str, str]:
    """(X-Cache, the answer) of one chat request through a pod."""
    status, headers, body = http("POST", base(pod) + "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 128, "temperature": 0,
        "messages": [{"role": "user", "content": question}]}, headers={"X-Cache-Category": "faq"})
    if status != 200:
        raise SystemExit(f"test-k8s: FAILED: {pod} answered {status}: {body[:300]!r}")
    return headers.get("x-cache", ""), json.loads(body)["choices"][0]["message"]["content"]


def model_calls(pod: str) -> float:
    """The model calls a pod made (``strata_upstream_requests_total``, every result)."""
    _, _, body = http("GET", base(pod) + "/metrics", timeout=10)
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("strata_upstream_requests_total{"))


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"test-k8s: FAILED: {what}")


def main() -> int:
    setup = run("bash", "deploy/podman-setup.sh", cwd=ROOT)
    env = dict(os.environ)
    for line in setup.stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = value.strip("'\"")
    os.environ.update(env)
    for port in PODS.values():
        with socket.socket() as probe:
            expect(probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken: stop what listens there first")
    run("make", "--no-print-directory", "image", cwd=ROOT)
    say("images built (make image)")
    if not LOCAL_TOKEN.exists():
        run("make", "--no-print-directory", "k8s-secrets", cwd=ROOT)
    rendered = run("kubectl", "kustomize", str(OVERLAY)).stdout
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    played = [d for d in documents if d["kind"] != "Secret"]
    secrets_made = []
    network = f"strata-k8s-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="strata-k8s-"))
    play_file = work / "played.yaml"
    play_file.write_text(yaml.safe_dump_all(played, sort_keys=False), encoding="utf-8")
    token = ""

    def down() -> None:
        say("taking everything down")
        run("podman", "kube", "down", str(play_file), check=False)
        # The claims' volumes, and those kube play made for the ConfigMaps mounted as volumes.
        for volume in (d["metadata"]["name"] for d in documents if d["kind"] in ("PersistentVolumeClaim", "ConfigMap")):
            run("podman", "volume", "rm", "-f", volume, check=False)
        for name in secrets_made:
            run("podman", "secret", "rm", name, check=False)
        run("podman", "network", "rm", "-f", network, check=False)
        names = {d["metadata"]["name"] for d in documents}
        left = [n for n in run("podman", "volume", "ls", "--format", "{{.Name}}", check=False).stdout.split() if n in names]
        left += [n for n in run("podman", "pod", "ps", "--format", "{{.Name}}", check=False).stdout.split()
                 if n.rsplit("-pod-", 1)[0] in names]
        expect(not left, f"left after kube down: {left}")

    try:
        for secret in (d for d in documents if d["kind"] == "Secret"):
            name = secret["metadata"]["name"]
            data = dict(secret.get("data") or {})
            data.update({k: base64.b64encode(v.encode()).decode() for k, v in (secret.get("stringData") or {}).items()})
            if "admin-token" in data:
                token = base64.b64decode(data["admin-token"]).decode().strip()
            source = work / f"{name}.json"
            source.write_text(json.dumps(data), encoding="utf-8")
            run("podman", "secret", "rm", name, check=False)
            run("podman", "secret", "create", name, str(source))
            secrets_made.append(name)
        expect(bool(token), "the rendered Secret holds no admin-token")
        run("podman", "network", "create", network)
        up = time.monotonic()
        run("podman", "kube", "play", "--network", network, str(play_file))
        say(f"played {len(played)} documents ({', '.join(sorted({d['kind'] for d in played}))}) on network {network}")
        for pod in PODS:
            wait_for(f"{pod}'s /health", 240, lambda pod=pod: healthy(pod))
        say(f"both Strata pods healthy {time.monotonic() - up:.0f} s after play")
        wait_for("the model server behind Strata", 900, lambda: model_up("strata"))
        say(f"vLLM answering {time.monotonic() - up:.0f} s after play")

        # A miss then an exact hit through each pod, and each pod's entry a hit through the other.
        nonce = secrets.token_hex(3)
        first, second = f"How do I return an order? ({nonce})", f"Where is my parcel? ({nonce})"
        for pod, question in (("strata", first), ("strata-b", second)):
            said = [ask(pod, question)[0], ask(pod, question)[0]]
            expect(said == ["miss", "exact-hit"], f"a new question then its repeat through {pod}: {said}")
        said_b = ask("strata-b", first)[0]
        expect(said_b == "exact-hit", f"strata's entry through strata-b: {said_b}")
        say("a miss then an exact hit through each pod; one pod's entry is the other's hit")

        # A curated answer saved through one pod, served by the other (semantic: another wording).
        admin = {"Authorization": f"Bearer {token}"}
        curated = f"Returns are free within 30 days: open Orders and press Return ({nonce})."
        status, _, body = http("POST", base("strata") + "/admin/curated", {
            "category": "faq", "question": f"What is the return policy {nonce}?", "answer": curated,
            "variants": [f"How long do I have to return something {nonce}?"]}, headers=admin)
        expect(status == 201, f"saving a curated answer through strata answered {status}: {body[:300]!r}")
        cache, answer = ask("strata-b", f"what is the RETURN policy {nonce}")
        expect(cache == "semantic-hit" and answer == curated,
               f"strata-b served {cache!r} {answer[:80]!r}, not the curated answer saved through strata")
        say("a curated answer saved through strata is served by strata-b (semantic hit)")

        # Identical misses through both pods at once: one model call between them.
        before = model_calls("strata") + model_calls("strata-b")
        question = f"What are your opening hours? ({nonce})"
        results: dict[str, str] = {}
        threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, ask(p, question)[0])) for p in PODS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        calls = model_calls("strata") + model_calls("strata-b") - before
        expect(calls == 1, f"identical concurrent misses through both pods made {calls:.0f} model calls, not 1 ({results})")
        say(f"identical misses through both pods at once: one model call ({results})")

        # The console signs in with the token from the rendered Secret.
        status, headers, _ = http("POST", base("strata-b") + "/console/login", form={"token": token})
        expect(status in (302, 303) and SESSION_COOKIE in headers.get("set-cookie", ""),
               f"console sign-in answered {status}, cookie {headers.get('set-cookie', '')[:40]!r}")
        status, _, _ = http("POST", base("strata-b") + "/console/login", form={"token": "not-the-token"})
        expect(status not in (302, 303), "the console signed in with a wrong token")
        say("the console signs in with the Secret's token, not with another")

        # A Strata container killed: its restart policy brings it back; the other pod answers meanwhile.
        container = run("podman", "ps", "-q", "--filter", "pod=strata-pod-0", "--filter", "name=strata-pod-0-strata").stdout.split()
        expect(len(container) == 1, f"strata's container not found: {container}")
        pid = run("podman", "inspect", "--format", "{{.State.Pid}}", container[0]).stdout.strip()
        restarts = run("podman", "inspect", "--format", "{{.RestartCount}}", container[0]).stdout.strip()
        run("kill", "-9", pid)
        wait_for("strata's container to go down", 30, lambda: not healthy("strata"))
        expect(ask("strata-b", first)[0] == "exact-hit", "strata-b did not answer while strata was down")
        wait_for("strata's container brought back by its restart policy", 240, lambda: healthy("strata"))
        again = run("podman", "inspect", "--format", "{{.RestartCount}}", container[0]).stdout.strip()
        expect(int(again) > int(restarts), f"restart count {restarts} -> {again}")
        expect(ask("strata", first)[0] == "exact-hit", "strata came back without the cache")
        say(f"strata killed (kill -9), strata-b answered meanwhile, restarted by its policy ({restarts} -> {again})")

        # The Redis pod restarted: the entries are kept (AOF on the claim).
        # Stopped (SIGTERM: the AOF is fsynced) and started again; podman 4.3's `pod restart` left
        # the pod exited now and then.
        run("podman", "pod", "stop", REDIS_POD)
        run("podman", "pod", "start", REDIS_POD)
        wait_for("the Redis pod running again", 60, lambda: run(
            "podman", "pod", "inspect", "--format", "{{.State}}", REDIS_POD, check=False).stdout.strip() == "Running")
        wait_for("Redis back behind both pods", 120, lambda: all(_hit(p, first) for p in PODS))
        expect(ask("strata-b", second)[0] == "exact-hit", "strata-b's entry lost with the Redis restart")
        say("Redis Stack's pod restarted: the entries are still served")
    finally:
        down()
    say("passed")
    return 0


def _hit(pod: str, question: str) -> bool:
    try:
        return ask(pod, question)[0] == "exact-hit"
    except (OSError, SystemExit):
        return False


if __name__ == "__main__":
    sys.exit(main())
