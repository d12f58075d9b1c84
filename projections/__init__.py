"""Pure reducers that fold the streams into the state services read, and the table of them all."""

from __future__ import annotations

from typing import Any

from projections.base import Projection
from projections.endpoints import ENDPOINTS
from projections.ledger import LEDGER
from projections.liveness import LIVENESS
from projections.providers import PROVIDERS
from projections.registry import REGISTRY
from projections.schedule import SCHEDULE
from projections.tenants import TENANTS

ALL: tuple[Projection[Any], ...] = (TENANTS, PROVIDERS, REGISTRY, LIVENESS, SCHEDULE, ENDPOINTS, LEDGER)
"""Every projection, in a stable order."""

BY_NAME: dict[str, Projection[Any]] = {p.name: p for p in ALL}
"""Projection by its name (``registry``)."""

__all__ = [
    "ALL",
    "BY_NAME",
    "ENDPOINTS",
    "LEDGER",
    "LIVENESS",
    "PROVIDERS",
    "REGISTRY",
    "SCHEDULE",
    "TENANTS",
    "Projection",
]
