"""Run Strata under uvicorn (uvloop, httptools) with host, port and workers from settings.

    python -m app.serve
"""

from __future__ import annotations

import os
import shutil

import uvicorn

from app.settings import PROJECT_ROOT, Settings

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # as app.metrics reads it; not imported: see below


def trusted_proxies(settings: Settings) -> list[str]:
    """The proxies whose forwarding headers are believed (``STRATA_TRUSTED_PROXIES``).

    uvicorn's default believes ``X-Forwarded-For`` from 127.0.0.1, so any local client could
    name its own address; with no trusted proxy the headers are not read at all."""
    return [part.strip() for part in settings.trusted_proxies.split(",") if part.strip()]


def main() -> None:
    settings = Settings.from_env()
    if settings.workers > 1:
        # Before any worker imports prometheus_client: it picks its storage at import time.
        folder = PROJECT_ROOT / ".run" / f"metrics-{settings.port}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        os.environ[MULTIPROCESS_ENV] = str(folder)
    uvicorn.run(
        "app.asgi:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        proxy_headers=bool(trusted_proxies(settings)),
        forwarded_allow_ips=trusted_proxies(settings) or "",
    )


if __name__ == "__main__":
    main()
