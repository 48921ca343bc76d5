#!/usr/bin/env bash
# `make test-image` (issue #57): the images built from this checkout and the compose stack run end
# to end on this machine, then taken down, leaving nothing running. Steps, each timed:
#   podman set up (deploy/podman-setup.sh), the three images built (make image), the stack up on
#   free host ports (Redis Stack, vLLM's CPU build, Strata), a chat request (a miss), the same
#   again (X-Cache: exact-hit), the console signed in with the token the stack wrote, the Redis
#   container restarted and the entry still served, the stack down with its volumes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
project="strata-test-$$"
say() { printf '%s test-image: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
started=$SECONDS
eval "$(bash deploy/podman-setup.sh)"

make --no-print-directory image
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export STRATA_HOST_PORT="$(free_port)" STRATA_REDIS_HOST_PORT="$(free_port)" STRATA_VLLM_HOST_PORT="$(free_port)"
compose=(podman-compose -p "$project" -f deploy/compose.yaml -f deploy/compose.vllm-cpu.yaml)
down() {
  say "taking the stack down"
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  podman volume rm -f "${project}_redis-data" "${project}_strata-state" >/dev/null 2>&1 || true
  left="$(podman ps -a --filter "label=io.podman.compose.project=$project" -q)"
  [ -z "$left" ] || { podman rm -f $left >/dev/null 2>&1 || true; }
}
trap down EXIT

say "stack up: Strata on 127.0.0.1:$STRATA_HOST_PORT, Redis $STRATA_REDIS_HOST_PORT, vLLM $STRATA_VLLM_HOST_PORT"
up_at=$SECONDS
"${compose[@]}" up -d >/tmp/"$project".up.log 2>&1 || { cat /tmp/"$project".up.log; exit 1; }
base="http://127.0.0.1:$STRATA_HOST_PORT"
wait_for() {  # what, seconds, command...
  local what="$1" limit="$2"; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { say "FAILED: $what not within $limit s"; "${compose[@]}" logs --tail 30 2>&1 | tail -60; exit 1; }
    sleep 1
  done
}
wait_for "Strata's /health" 120 curl -fsS -m 2 "$base/health"
say "Strata healthy $((SECONDS - up_at)) s after up"
upstream_ok() { curl -fsS -m 2 "$base/health" | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["upstream"]["status"] != "ok")'; }
wait_for "the model server behind Strata" 600 upstream_ok
say "vLLM answering $((SECONDS - up_at)) s after up"

ask() {
  curl -sS -m 120 -o /tmp/"$project".answer.json -D - "$base/v1/chat/completions" -H 'content-type: application/json' \
    -H 'X-Cache-Category: faq' -d '{"model": "SmolLM2-135M-Instruct", "max_tokens": 32,
    "messages": [{"role": "user", "content": "How do I return an order?"}]}' | tr -d '\r' | sed -n 's/^x-cache: //Ip'
}
first="$(ask)"; [ "$first" = miss ] || { say "FAILED: the first request was '$first', not a miss"; cat /tmp/"$project".answer.json; exit 1; }
second="$(ask)"; [ "$second" = exact-hit ] || { say "FAILED: the repeat was '$second', not an exact hit"; exit 1; }
say "a miss, then X-Cache: exact-hit"

app="$(podman ps --filter "label=io.podman.compose.project=$project" --filter "label=com.docker.compose.service=strata" -q)"
token="$(podman exec "$app" cat /var/lib/strata/admin-token)"
status="$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$base/console/login" --data-urlencode "token=$token")"
[ "$status" = 303 ] || [ "$status" = 302 ] || { say "FAILED: console sign-in answered $status"; exit 1; }
say "the console signs in with the token the stack wrote to its volume"

redis="$(podman ps --filter "label=io.podman.compose.project=$project" --filter "label=com.docker.compose.service=redis" -q)"
podman restart "$redis" >/dev/null
redis_up() { podman exec "$redis" python3 -c "import socket; s = socket.create_connection(('127.0.0.1', 6380), 2); s.sendall(b'PING\r\n'); assert s.recv(16).startswith(b'+PONG')"; }
wait_for "Redis after its restart" 60 redis_up
third=""
for _ in $(seq 1 30); do third="$(ask)"; [ "$third" = exact-hit ] && break; sleep 1; done
[ "$third" = exact-hit ] || { say "FAILED: after Redis restarted the request was '$third'"; exit 1; }
say "Redis restarted: the entry survived (exact-hit)"

podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'localhost/strata(-redis-stack|-vllm-cpu)?:latest' | sed 's/^/  image /'
down
trap - EXIT
[ -z "$(podman ps -a --filter "label=io.podman.compose.project=$project" -q)" ] || { say "FAILED: containers left"; exit 1; }
echo "test-image: 1 passed, 0 failed (in $((SECONDS - started)) s)"
