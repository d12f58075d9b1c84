"""The gateway's ASGI app: every route under ``/v1``, the feed's WebSocket, ``/metrics``, the OpenAPI
document (whose description carries the feed's protocol), the docs page, the dashboard at ``/``.

``create_app`` builds it; ``app_from_env`` is the factory granian serves
(``granian --interface asgi --factory gateway.app:app_from_env``, which ``resontech gateway`` runs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from core import settings as core_settings
from core.addresses import kernel_services, parse_networks
from gateway import dashboard
from gateway.api import Operation, openapi, starlette_routes
from gateway.autoscaler import Autoscaler
from gateway.errors import EXCEPTION_HANDLERS
from gateway.feed import PROTOCOL
from gateway.inference import InferenceProxy
from gateway.kernel import Kernel
from gateway.limits import Caps, ConnectionLimits, Holdings
from gateway.metrics import GatewayMetrics, RequestMetrics
from gateway.replica_guard import ReplicaGuard
from gateway.routes import ROUTERS, openai
from gateway.routes.feed import websocket_routes
from gateway.scale_history import ScaleHistory
from gateway.settings import GatewaySettings, load_gateway_settings
from gateway.token_meter import TokenMeter

VERSION = "0.1.0"
DOCS_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>resontech API</title>
<style>body{font:14px system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
code{background:#f3f3f3;padding:0 .2rem}h2{margin-top:2rem}td{padding:.2rem .6rem;vertical-align:top}</style>
</head><body><h1>resontech API</h1>
<p>Machine-readable: <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1). Authenticate with
<code>Authorization: Bearer rt_...</code>. Errors are <code>{"error": {"code", "message"}}</code>.</p>
<div id="ops">loading...</div>
<pre id="about" style="white-space:pre-wrap;font:inherit"></pre>
<script>
fetch('/openapi.json').then(r => r.json()).then(doc => {
  const rows = [];
  for (const [path, methods] of Object.entries(doc.paths))
    for (const [method, op] of Object.entries(methods))
      rows.push(`<tr><td><code>${method.toUpperCase()}</code></td><td><code>${path}</code></td>` +
                `<td>${op.summary || ''}</td><td>${(op.tags || []).join(', ')}</td></tr>`);
  document.getElementById('ops').innerHTML = '<table>' + rows.join('') + '</table>';
  document.getElementById('about').textContent = doc.info.description || '';
});
</script></body></html>
"""


def operations() -> list[Operation]:
    return [op for router in ROUTERS for op in router.operations]


def create_app(
    settings: core_settings.Settings, gateway: GatewaySettings, kernel: Kernel | None = None
) -> Starlette:
    """The ASGI app. Its lifespan starts the kernel (unless one is given, already started)."""
    ops = operations()
    document = openapi(ops, title="resontech", version=VERSION, server_url=gateway.url)
    document["info"]["description"] = PROTOCOL  # OpenAPI has no WebSockets: the feed is described here
    metrics = GatewayMetrics()
    holdings = holdings_for(gateway)

    own_kernel = kernel is None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.kernel = kernel or Kernel(settings, gateway)
        if own_kernel:
            await app.state.kernel.start()
        stop_loops = asyncio.Event()
        loops = [
            asyncio.create_task(Autoscaler(app.state.kernel, app.state.inference).run(stop_loops)),
            asyncio.create_task(app.state.tokens.run(app.state.kernel, stop_loops)),  # flushes at the end
        ]
        try:
            yield
        finally:
            stop_loops.set()
            await asyncio.gather(*loops)
            await app.state.inference.close()
            if own_kernel:
                await app.state.kernel.stop()

    app = Starlette(
        routes=all_routes(ops, document),
        lifespan=lifespan,
        middleware=[
            Middleware(ConnectionLimits, holdings=holdings),  # outermost: refused before any work
            Middleware(RequestMetrics, metrics=metrics),
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    if kernel is not None:
        app.state.kernel = kernel
    app.state.openapi = document
    app.state.metrics = metrics
    app.state.holdings = holdings
    app.state.inference = metrics.inference = InferenceProxy(replica_guard(settings, gateway))
    app.state.scale_history = ScaleHistory()
    app.state.tokens = TokenMeter(gateway.token_tick_s)
    return app


def all_routes(ops: list[Operation], document: dict[str, Any]) -> list[BaseRoute]:
    """The gateway's routes: its OpenAPI document and docs page, the OpenAI-compatible routes, the
    API, the feed and the dashboard."""

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    async def docs(request: Request) -> Response:
        return HTMLResponse(DOCS_HTML)

    return [
        Route("/openapi.json", openapi_json, include_in_schema=False),
        Route("/docs", docs, include_in_schema=False),
        *openai.routes(),  # before the API's: OpenAI's error shape, bodies passed through
        *starlette_routes(ops),
        *websocket_routes(),
        *dashboard.routes(),
    ]


def holdings_for(gateway: GatewaySettings) -> Holdings:
    """What each client and key may hold at once, as this gateway's settings say."""
    caps = Caps(
        requests_per_client=gateway.max_requests_per_client,
        requests_per_key=gateway.max_requests_per_key,
        feeds_per_client=gateway.max_feeds_per_client,
        feeds_per_key=gateway.max_feeds_per_key,
        body_timeout_s=gateway.body_timeout_s,
    )
    return Holdings(caps)


def replica_guard(settings: core_settings.Settings, gateway: GatewaySettings) -> ReplicaGuard:
    """Where this gateway may send requests to replicas: the deployment's replica networks, never
    NATS, the object store or a gateway (resolved now)."""
    urls = [*settings.nats_url.split(","), settings.s3_endpoint, f"http://{gateway.host}:{gateway.port}"]
    return ReplicaGuard(parse_networks(settings.replica_networks), kernel_services(urls))


def app_from_env() -> Any:
    """The app configured from ``RESONTECH_*`` (and ``RESONTECH_ENV_FILE``), for granian's factory."""
    import os
    from pathlib import Path

    env_file = os.environ.get("RESONTECH_ENV_FILE")
    settings = core_settings.load(env_file=Path(env_file) if env_file else None)
    return create_app(settings, load_gateway_settings())
