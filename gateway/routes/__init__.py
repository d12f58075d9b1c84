"""The API's routes, one module per area. Each module has one :class:`gateway.api.Router`."""

from __future__ import annotations

from gateway import metrics
from gateway.api import Router
from gateway.routes import (
    billing,
    endpoints,
    enrollment,
    feed,
    jobs,
    providers,
    quarantine,
    series,
    system,
    tenants,
    workers,
    workspace,
)

ROUTERS: tuple[Router, ...] = (
    system.router,
    tenants.router,
    providers.router,
    enrollment.router,
    workspace.router,
    jobs.router,
    endpoints.router,
    workers.router,
    billing.router,
    series.router,
    feed.router,
    quarantine.router,
    metrics.router,
)
"""Every router the app serves, in OpenAPI order."""
