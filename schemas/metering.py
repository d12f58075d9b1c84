"""Events of the METERING stream: ``meter.<tenant>.<worker_id>``."""

from __future__ import annotations

from schemas._base import Event
from schemas.values import Pool, WorkKind


class UsageTick(Event, tag="meter.tick", frozen=True, kw_only=True):
    """Usage of one running assignment over one interval (every 10 s by default).

    The interval is the time the usage happened (Unix milliseconds, from its meter); billing periods
    are taken from ``end_ms``. Money is never in a tick: the ledger prices it.

    Attributes:
        work_id: the job or endpoint id; ``work_kind`` says which.
        provider: the provider that owns the worker (who gets paid).
        gpu_type: the GPU model family billed (``cpu`` for CPU work).
        gpu_ms: GPU-milliseconds used (GPUs x wall milliseconds); ``cpu_ms`` likewise for CPU work.
        tier: the provider's tier when the work was assigned (``platinum``... ``unverified``).
        tokens: tokens served, for inference (prompt plus completion tokens). Counted by the
            gateways, which append them as ticks of their own with no GPU or CPU time on
            ``meter.<tenant>.<worker_id>.tokens``; the ledger ignores tokens anywhere else.
        source: the gateway process that counted a token tick (``gateway-<id>``); empty for an
            agent's tick.
    """

    work_id: str
    work_kind: WorkKind
    assignment_id: str
    epoch: int
    provider: str
    gpu_type: str
    pool: Pool
    start_ms: int
    end_ms: int
    gpu_ms: int = 0
    cpu_ms: int = 0
    tier: str = "unverified"
    tokens: int = 0
    source: str = ""


MeteringEvent = UsageTick
