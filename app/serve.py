"""Run Strata under uvicorn (uvloop, httptools) with host, port and workers from settings.

    python -m app.serve
"""

from __future__ import annotations

import uvicorn

from app.settings import Settings


def main() -> None:
    settings = Settings.from_env()
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
