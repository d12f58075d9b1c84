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
from gateway import dashboard
from gateway.api import Operation, openapi, starlette_routes
from gateway.autoscaler import Autoscaler
from gateway.errors import EXCEPTION_HANDLERS
from gateway.feed import PROTOCOL
from gateway.inference import InferenceProxy
from gateway.kernel import Kernel
from gateway.metrics import GatewayMetrics, RequestMetrics
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

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    async def docs(request: Request) -> Response:
        return HTMLResponse(DOCS_HTML)

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

    routes: list[BaseRoute] = [
        Route("/openapi.json", openapi_json, include_in_schema=False),
        Route("/docs", docs, include_in_schema=False),
        *openai.routes(),  # before the API's: OpenAI's error shape, bodies passed through
        *starlette_routes(ops),
        *websocket_routes(),
        *dashboard.routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(RequestMetrics, metrics=metrics)],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    if kernel is not None:
        app.state.kernel = kernel
    app.state.openapi = document
    app.state.metrics = metrics
    app.state.inference = metrics.inference = InferenceProxy()
    app.state.scale_history = ScaleHistory()
    app.state.tokens = TokenMeter(gateway.token_tick_s)
    return app


def app_from_env() -> Any:
    """The app configured from ``RESONTECH_*`` (and ``RESONTECH_ENV_FILE``), for granian's factory."""
    import os
    from pathlib import Path

    env_file = os.environ.get("RESONTECH_ENV_FILE")
    settings = core_settings.load(env_file=Path(env_file) if env_file else None)
    return create_app(settings, load_gateway_settings())
