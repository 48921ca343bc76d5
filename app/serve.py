"""Run Strata under uvicorn (uvloop, httptools) with host, port and workers from settings.

    python -m app.serve
"""

from __future__ import annotations

import os
import shutil

import uvicorn

from app.settings import PROJECT_ROOT, Settings

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # as app.metrics reads it; not imported: see below


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
    )


if __name__ == "__main__":
    main()
