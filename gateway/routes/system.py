"""Liveness of the gateway itself and the caller's identity."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.api import Call, Router
from schemas.api.common import Me

router = Router("system")


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    projections: dict[str, int]


@router.get("/v1/health", access="public", response=Health)
async def health(call: Call[None, None]) -> Health:
    """Whether the gateway is up, and the last sequence each projection has applied."""
    return Health(status="ok", projections={name: r.seq for name, r in call.kernel.runners.items()})


@router.get("/v1/me", access="any", response=Me)
async def me(call: Call[None, None]) -> Any:
    """The caller as the gateway sees the presented key: kind, account, role."""
    p = call.principal
    return Me(principal=p.label, kind=p.kind, account=p.account, role=p.role, key_id=p.key_id)
