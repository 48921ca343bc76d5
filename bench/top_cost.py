"""What `strata top` costs: CPU of its process over a stretch of live refreshes.

    python -m bench.top_cost [--seconds 30]

Starts its own Redis Stack, the stub upstream and Strata (in threads), runs `strata top`
in a tmux session against it (as a person would) while a client keeps asking questions, and
reads the top process's CPU time from /proc: the target is under 5% of one core at one refresh
a second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from app.asgi import create_app
from app.replay.simulate import ServerThread, own_redis_stack
from app.settings import Settings
from bench.stub_upstream import stub_app

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("top_cost: tmux is not installed", file=sys.stderr)
        return 2
    with own_redis_stack() as redis_url, ServerThread(stub_app()) as server:
        settings = Settings.from_flat({"redis_url": redis_url, "upstream_url": server.url + "/v1", "log_level": "warning"})
        with ServerThread(create_app(settings)) as strata:
            stop = threading.Event()

            def traffic() -> None:
                i = 0
                while not stop.is_set():
                    httpx.post(strata.url + "/v1/chat/completions", headers={"X-Cache-Category": "faq"}, timeout=30,
                               json={"model": "stub-model", "messages": [{"role": "user", "content": f"question {i % 50}"}]})
                    i += 1
                    time.sleep(0.02)

            client = threading.Thread(target=traffic, daemon=True)
            client.start()
            session = f"strata-top-cost-{os.getpid()}"
            pidfile = Path(f"/tmp/{session}.pid")
            command = f"cd {ROOT} && echo $$ > {pidfile} && exec {sys.executable} -m app.cli top --url {strata.url}"
            subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "130", "-y", "40", command], check=True)
            try:
                time.sleep(3)  # started, first frames drawn
                pid = int(pidfile.read_text())
                before, started = cpu_seconds(pid), time.monotonic()
                time.sleep(args.seconds)
                used, elapsed = cpu_seconds(pid) - before, time.monotonic() - started
                screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            finally:
                subprocess.run(["tmux", "kill-session", "-t", session], check=False)
                pidfile.unlink(missing_ok=True)
                stop.set()
            requests = httpx.get(strata.url + "/metrics").text.count("\n")  # touch: Strata still answers
    share = 100 * used / elapsed
    print(f"strata top, refreshing every 1 s for {elapsed:.0f} s against a live Strata: {used:.2f} s of CPU, "
          f"{share:.1f}% of one core (target under 5%: {'met' if share < 5 else 'MISSED'})")
    print("last frame:\n" + "\n".join(line for line in screen.splitlines() if line.strip())[:2000])
    return 0 if requests else 1


if __name__ == "__main__":
    sys.exit(main())
