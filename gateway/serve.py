"""Serve the gateway with granian (ASGI interface, uvloop): ``resontech gateway``."""

from __future__ import annotations

import os

from core.settings import Settings
from gateway.settings import load_gateway_settings


def serve(settings: Settings, env_file: str | None = None) -> None:
    """Run the gateway until SIGINT/SIGTERM. Settings are re-read by each worker from the environment
    (granian imports ``gateway.app:app_from_env`` in its worker processes)."""
    from granian import Granian
    from granian.constants import Interfaces, Loops

    gateway = load_gateway_settings()  # fail here, with one line, on a malformed setting
    if env_file:
        os.environ["RESONTECH_ENV_FILE"] = env_file
    os.environ.setdefault("RESONTECH_NATS_URL", settings.nats_url)
    Granian(
        "gateway.app:app_from_env",
        factory=True,
        address=gateway.host,
        port=gateway.port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=gateway.workers,
        log_access=False,
    ).serve()
