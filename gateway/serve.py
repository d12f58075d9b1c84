"""Serve the gateway with granian (ASGI interface, uvloop): ``resontech gateway``.

What granian bounds before a request reaches Python (the rest is :mod:`gateway.limits`):

* **Header read timeout** (``header_timeout_s``, default 5 s): a connection that has not sent a
  whole request head in that time is closed; it also closes a keep-alive connection idle that long
  after its last response (granian's default, 30 s, let 1,100 connections holding unfinished heads
  keep ``/v1/health`` waiting that long).
* **Connections served at once** per worker (granian's ``backpressure``, ``max_connections``,
  default 8,192, lowered to what the open-file limit allows): a connection over it waits in the
  **backlog** (``backlog``, default 4,096) until one ends.
"""

from __future__ import annotations

import os
import resource

from core.settings import Settings
from gateway.settings import load_gateway_settings


def serve(settings: Settings, env_file: str | None = None) -> None:
    """Run the gateway until SIGINT/SIGTERM. Settings are re-read by each worker from the environment
    (granian imports ``gateway.app:app_from_env`` in its worker processes)."""
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings

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
        backlog=gateway.backlog,
        backpressure=served_at_once(gateway.max_connections),
        http1_settings=HTTP1Settings(header_read_timeout=round(gateway.header_timeout_s * 1000)),
    ).serve()


def served_at_once(wanted: int) -> int:
    """``wanted``, or fewer: each connection is an open file, and a worker must keep some for the
    log, the object store and replicas (a quarter of the soft limit, at least 64)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - max(64, soft // 4)))
