"""Serve a GGUF chat model with llama.cpp's OpenAI-compatible server (the xllamacpp wheel), on
127.0.0.1 only, until SIGTERM. Run by readers/judge.sh in its own venv; Strata never imports it.

    python readers/serve_gguf.py --model FILE.gguf --port 8002 [--threads 2] [--ctx 2048] [--alias NAME]
"""

from __future__ import annotations

import argparse
import signal
import threading

import xllamacpp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--alias", default="")
    args = parser.parse_args()
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.ctx
    params.n_parallel = 1  # two cores: one sequence at a time is the fastest per verdict
    # HTTP threads: llama.cpp's default is n_parallel + 2 (3), and each keep-alive connection holds
    # one (Strata's upstream and judge pools, a client): a fourth connection was dropped unanswered.
    params.n_threads_http = 32
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    if args.alias:
        params.model_alias = {args.alias}  # a set of names the model answers to
    server = xllamacpp.Server(params)
    print(f"serving {args.model} on {server.listening_address}/v1", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()


if __name__ == "__main__":
    main()
