#!/usr/bin/env bash
# What podman needs on this kind of machine before any image is built (issue #57), idempotent:
#   1. podman, runc, podman-compose and debootstrap from Debian's packages (as root);
#   2. a containers.conf of the project's own (.run/containers/containers.conf, used through
#      CONTAINERS_CONF; /etc is not touched): runc, and ulimits no higher than what this kernel
#      lets a container set, found by trying the host's hard limits downwards (crun is refused
#      setrlimit here, and no hard limit can be raised, even by root);
#   3. the base image the Containerfiles' FROM names: pulled where a registry answers, else a
#      Debian bookworm root file system made with debootstrap from this machine's apt mirror,
#      imported and tagged with that name, so the same Containerfiles build unchanged elsewhere.
# Prints `export CONTAINERS_CONF=...` for the caller to eval.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base_image="${PYTHON_IMAGE:-docker.io/library/python:3.11-slim-bookworm}"
conf_dir="$root/.run/containers"
conf="$conf_dir/containers.conf"
say() { echo "podman-setup: $*" >&2; }

missing=()
for tool in podman runc podman-compose debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { say "needs ${missing[*]} (Debian packages); run as root or install them"; exit 1; }
  say "installing ${missing[*]}"
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi

mkdir -p "$conf_dir"
write_conf() {  # nofile nproc
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' "$1" "$1" "$2" "$2" >"$conf"
}
export CONTAINERS_CONF="$conf"
# The host's hard limits to begin with (tried below, once an image is there).
hard_nofile="$(ulimit -Hn)"; hard_nproc="$(ulimit -Hu)"
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
[ "$hard_nproc" = unlimited ] && hard_nproc=1048576
[ -s "$conf" ] || write_conf "$hard_nofile" "$hard_nproc"

if ! podman image exists "$base_image"; then
  if timeout 60 podman pull -q "$base_image" >/dev/null 2>&1; then
    say "pulled $base_image"
  else
    mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)"
    [ -n "$mirror" ] || mirror="$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)"
    [ -n "$mirror" ] || { say "no registry and no apt mirror configured: cannot make $base_image"; exit 1; }
    tree="$(mktemp -d /var/tmp/strata-base.XXXXXX)"
    say "no registry answers: making $base_image with debootstrap from $mirror (about a minute)"
    # Debian's python3 is 3.11, as in the python:3.11-slim-bookworm image this stands for.
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$tree" "$mirror" >/dev/null
    tar -C "$tree" -c . | podman import -q - localhost/strata-base:bookworm >/dev/null
    podman tag localhost/strata-base:bookworm "$base_image"
    rm -rf "$tree"
  fi
fi

# The ulimits: the host's hard limits, or the highest below them that a container may set.
if ! podman run --rm "$base_image" true >/dev/null 2>&1; then
  set_up=""
  for nproc in "$hard_nproc" 65536 32768 16384 8192 4096; do
    [ "$nproc" -le "$hard_nproc" ] || continue
    write_conf "$hard_nofile" "$nproc"
    if podman run --rm "$base_image" true >/dev/null 2>&1; then set_up=yes; break; fi
  done
  [ -n "$set_up" ] || { say "no container runs here with runc and limits at or below the host's; see $conf"; exit 1; }
  say "containers run with runc, nofile=$hard_nofile nproc=$nproc ($conf)"
fi
echo "export CONTAINERS_CONF=$conf"
