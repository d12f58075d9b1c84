"""The gateway: the API under /v1, and the Python SDK (``from gateway import Client``)."""

from gateway.client import ApiError, AsyncClient, Client

__all__ = ["ApiError", "AsyncClient", "Client"]
