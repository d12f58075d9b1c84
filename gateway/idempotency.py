"""``Idempotency-Key``: a retried create is stored once and answers with what it created.

A client that sends ``Idempotency-Key: <its own unique string>`` on a create may retry it after a
lost response. The id of the created resource (unless the body names one) and the id of the event
that creates it are derived from the tenant and the key, so the retry addresses the same resource;
the route finds the creating event already stored under the same event id and answers with the
resource instead of a 409. The check reads the stored event's id, so it holds after JetStream's
duplicate window has passed. It holds while the gateway lags the log too: a retry of a create that
was answered ``202 Accepted`` (stored, not yet applied here) finds the stored event all the same and
answers with the same resource, 202 until this gateway has applied it, then 201.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from starlette.requests import Request

from gateway.errors import ApiError

HEADER = "idempotency-key"
REPLAYED_HEADER = "Idempotent-Replayed"
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key``, or ``None``; 400 for one that is not 1-255 visible ASCII
    characters."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not _KEY.match(key):
        raise ApiError(
            400, "invalid_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII characters"
        )
    return key


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def resource_id(prefix: str, tenant: str, key: str | None) -> str:
    """A new resource id ``<prefix>-<16 hex>``: derived from ``key`` when there is one, else random."""
    suffix = _digest("resource", prefix, tenant, key)[:16] if key is not None else secrets.token_hex(8)
    return f"{prefix}-{suffix}"


def event_id(kind: str, tenant: str, resource: str, key: str | None) -> str | None:
    """The id of the event that creates ``resource``: derived from ``key`` when there is one (so a
    retry is recognised), else ``None`` (the log picks a fresh one)."""
    if key is None:
        return None
    return f"idem-{kind}-{_digest(tenant, resource, key)[:40]}"
