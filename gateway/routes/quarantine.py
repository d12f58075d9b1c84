"""What the kernel refused: the operator's view of QUARANTINE (``resontech quarantine`` prints the same)."""

from __future__ import annotations

from gateway.api import Call, Router
from gateway.bodies import carried
from gateway.routes.tenants import iso
from schemas.api.quarantine import QuarantinedMessage, QuarantinePage, QuarantineQuery

router = Router("quarantine")
DATA_CHARS = 4096


@router.get("/v1/quarantine", access="operator", query=QuarantineQuery, response=QuarantinePage)
async def list_quarantine(call: Call[None, QuarantineQuery]) -> QuarantinePage:
    """Refused claims (with the worker that sent them and why) and stored events that failed their
    checks, oldest first, from after sequence ``after``."""
    q = call.query
    found = await call.kernel.event_log.quarantined(after_seq=q.after, limit=q.limit + 1)
    items = [
        carried(
            QuarantinedMessage,
            m,
            time=iso(m.time_ns),
            data=(text := m.data.decode(errors="replace"))[:DATA_CHARS],
            truncated=len(text) > DATA_CHARS,
        )
        for m in found[: q.limit]
    ]
    return QuarantinePage(items=items, next_after=items[-1].seq if len(found) > q.limit else None)
