"""The tenant a tenant-scoped request acts on, checked to exist.

A tenant key acts on its own tenant (naming another is a 404, as if it did not exist); the operator
names one with ``?tenant=``. Every lookup below it is keyed by that tenant, so another tenant's job,
endpoint or invoice is simply not found.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, TypeVar

from gateway.api import Call
from gateway.auth import tenant_of
from gateway.errors import not_found
from projections import TENANTS

T = TypeVar("T")


def scoped_tenant(call: Call[Any, Any], requested: str | None) -> str:
    """The tenant the call acts on (see the module docstring); 404 for an unknown one."""
    tenant = tenant_of(call.principal, requested)
    if tenant not in call.kernel.state(TENANTS).tenants:
        raise not_found(f"tenant {tenant}")
    return tenant


def iso(ns: int, timespec: str = "milliseconds") -> str:
    """Unix nanoseconds as ISO 8601 UTC to the millisecond (``2026-04-01T00:00:00.000Z``; ``timespec``
    as :meth:`datetime.datetime.isoformat` takes it)."""
    stamp = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).isoformat(timespec=timespec)
    return stamp.replace("+00:00", "Z")


def named_in_path(call: Call[Any, Any], items: Mapping[str, T], param: str, noun: str) -> T:
    """The one of ``items`` that the path parameter ``param`` names, now the request's resource;
    404 (naming the ``noun``) when there is none."""
    item_id = call.params[param]
    item = items.get(item_id)
    if item is None:
        raise not_found(f"{noun} {item_id}")
    call.resource = item_id
    return item
