"""The replica's key, checked in front of every engine route but ``/health``.

The agent gives each replica a random key in ``VLLM_API_KEY`` (:mod:`agent.runtimes.vllm`); only the
gateway gets it from the kernel. vLLM checks it itself on ``/v1`` (and a few other prefixes) but
leaves the rest of its routes open (``/tokenize``, ``/pooling``, ``/classify``, ``/metrics``...),
which another workload on the host could call. :class:`RequireKey` closes all of them: vLLM takes it
as ``--middleware agent.engines.keys.RequireKey`` (it reads the key from the environment), the CPU
engine adds it to its app. ``/health`` stays open for the agent's and the gateway's probes, and
``OPTIONS`` as in vLLM. The answer to a request without the key is a 401 in OpenAI's error shape;
the key is compared in constant time.
"""

from __future__ import annotations

import hmac
import os

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

KEY_ENV = "VLLM_API_KEY"
"""The variable vLLM reads its key from; :class:`RequireKey` and the CPU engine read the same one."""
OPEN_PATHS = frozenset({"/health"})


class RequireKey:
    """ASGI middleware: every HTTP request but ``OPTIONS`` and :data:`OPEN_PATHS` needs
    ``Authorization: Bearer <key>``. ``key`` defaults to ``$VLLM_API_KEY``; empty: no check."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        self.app = app
        self.key = (os.environ.get(KEY_ENV, "") if key is None else key).encode()

    def _allowed(self, scope: Scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = scope["type"] == "http" and scope.get("method") != "OPTIONS"
        if self.key and guarded and scope["path"] not in OPEN_PATHS and not self._allowed(scope):
            body = {
                "error": {
                    "message": "a valid API key is required (Authorization: Bearer)",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
