"""The web dashboard at ``/``: one HTML page, a few ES-module scripts and a stylesheet, served from
this package.

No build step and nothing fetched from anywhere else: the page is a client of the public API like any
other (``/v1/...`` with the key the user pastes, and the ``/v1/feed`` WebSocket), so the server side
is only these routes. The files are read once when the app is built and served from memory with an
ETag. Every response carries a Content-Security-Policy that lets the page load scripts and styles,
and open connections, on this origin only, with no inline script: the script builds the DOM with
``textContent`` and never parses API data as HTML, and the policy is the second line of defence if
that rule is ever broken. The page is ``/`` and its files are under ``/ui/``, clear of ``/v1``,
``/docs``, ``/openapi.json`` and ``/metrics``; none of them is in the OpenAPI document.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.errors import not_found

STATIC = Path(__file__).parent / "static"
MEDIA_TYPES: dict[str, str] = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
"""What ``/ui/`` serves: the folder's scripts (ES modules) and stylesheets, nothing else."""
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class Asset:
    """One file, read once, with its ETag; answers 304 to a matching ``If-None-Match``."""

    def __init__(self, path: Path, media_type: str) -> None:
        self.body = path.read_bytes()
        self.media_type = media_type
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:32] + '"'

    def respond(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "ETag": self.etag}
        if request.headers.get("if-none-match") == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def routes() -> list[BaseRoute]:
    """``GET /`` (the page) and ``GET /ui/{name}`` (its scripts and stylesheet); no API route."""
    page = Asset(STATIC / "index.html", "text/html; charset=utf-8")
    assets = {
        path.name: Asset(path, MEDIA_TYPES[path.suffix])
        for path in sorted(STATIC.iterdir())
        if path.suffix in MEDIA_TYPES
    }

    async def index(request: Request) -> Response:
        return page.respond(request)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        found = assets.get(name)
        if found is None:
            raise not_found(f"dashboard file {name!r}")
        return found.respond(request)

    return [
        Route("/", index, methods=["GET", "HEAD"], include_in_schema=False),
        Route("/ui/{name}", asset, methods=["GET", "HEAD"], include_in_schema=False),
    ]
