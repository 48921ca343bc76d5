#!/bin/sh
# Strata's container entry point: the admin token made once where STRATA_ADMIN_TOKEN_FILE points
# (a volume: kept across restarts, never in a layer), Redis waited for (bounded: past it Strata
# starts anyway and serves without the cache until Redis answers), then the service as PID 1.
set -eu
if [ -z "${STRATA_ADMIN_TOKEN:-}" ] && [ -n "${STRATA_ADMIN_TOKEN_FILE:-}" ]; then
  python3 -m app.cli admin-token ensure --file "$STRATA_ADMIN_TOKEN_FILE"
fi
python3 - <<'PY'
import os, socket, time
from urllib.parse import urlsplit
url = urlsplit(os.environ.get("STRATA_REDIS_URL", "redis://127.0.0.1:6380/0").replace("redis+cluster", "redis"))
deadline = time.monotonic() + float(os.environ.get("STRATA_WAIT_FOR_REDIS_S", "60"))
while time.monotonic() < deadline:
    try:
        socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379), timeout=2).close()
        break
    except OSError:
        time.sleep(1)
else:
    print(f"strata: Redis at {url.hostname}:{url.port} did not answer; starting without the cache until it does", flush=True)
PY
exec python3 -m app.serve "$@"
