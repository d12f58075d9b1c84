"""The tenants projection: TENANTS (``tenant.<tenant>.<event>``) folded into tenants, their API keys
(hashes only) and their GPU quotas per pool."""

from __future__ import annotations

from typing import Any

import msgspec

from projections.base import Projection
from schemas.envelope import Recorded
from schemas.tenants import ApiKeyIssued, ApiKeyRevoked, QuotaSet, Role, TenantCreated


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """One API key: its SHA-256 (the key itself is never stored), role and whether it was revoked."""

    key_id: str
    key_sha256: str
    role: Role
    label: str = ""
    issued_ns: int = 0
    revoked: bool = False


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant.

    Attributes:
        quotas: pool -> maximum concurrent GPUs (a pool absent from the map is unlimited).
        keys: key id -> :class:`ApiKey`.
        last_seq: TENANTS sequence of the tenant's latest event (the expected sequence of its subjects).
    """

    tenant: str
    display_name: str = ""
    bucket: str = ""
    plan: str = "payg"
    created_ns: int = 0
    quotas: dict[str, int] = {}
    keys: dict[str, ApiKey] = {}
    last_seq: int = 0


class TenantsState(msgspec.Struct, kw_only=True):
    """Tenants by id; ``seq`` is the last TENANTS sequence applied."""

    seq: int = 0
    tenants: dict[str, TenantRecord] = {}


def _changed(record: TenantRecord, event: Any, t: int) -> TenantRecord:
    replace = msgspec.structs.replace
    match event:
        case ApiKeyIssued(key_id=key_id, key_sha256=digest, role=role, label=label):
            key = ApiKey(key_id=key_id, key_sha256=digest, role=role, label=label, issued_ns=t)
            return replace(record, keys={**record.keys, key_id: key})
        case ApiKeyRevoked(key_id=key_id) if key_id in record.keys:
            key = replace(record.keys[key_id], revoked=True)
            return replace(record, keys={**record.keys, key_id: key})
        case QuotaSet(pool=pool, gpus=gpus):
            quotas = {p: q for p, q in record.quotas.items() if p != pool}
            return replace(record, quotas=quotas if gpus is None else {**quotas, pool: gpus})
    return record


def evolve(state: TenantsState, recorded: Recorded[Any]) -> TenantsState:
    """Apply one TENANTS event; records at or below ``state.seq`` are ignored, as are events of a
    tenant that was never created."""
    seq = recorded.seq
    if seq <= state.seq:
        return state
    state.seq = seq
    tenant = recorded.token(1)
    event = recorded.event
    old = state.tenants.get(tenant)
    if isinstance(event, TenantCreated):
        new = old or TenantRecord(tenant=tenant, created_ns=recorded.time_ns)
        new = msgspec.structs.replace(
            new, display_name=event.display_name, bucket=event.bucket, plan=event.plan
        )
    elif old is not None:
        new = _changed(old, event, recorded.time_ns)
    else:
        return state
    state.tenants[tenant] = msgspec.structs.replace(new, last_seq=seq)
    return state


def quotas(state: TenantsState) -> dict[str, dict[str, int]]:
    """tenant -> pool -> maximum GPUs, for :func:`projections.admission.next_jobs`."""
    return {tenant: dict(record.quotas) for tenant, record in state.tenants.items() if record.quotas}


TENANTS: Projection[TenantsState] = Projection(
    name="tenants", stream="TENANTS", version=1, state_type=TenantsState, evolve=evolve
)
