"""The API's routes, one module per area. Each module has one :class:`gateway.api.Router`."""

from __future__ import annotations

from gateway.api import Router
from gateway.routes import providers, system, tenants

ROUTERS: tuple[Router, ...] = (system.router, tenants.router, providers.router)
"""Every router the app serves, in OpenAPI order."""
