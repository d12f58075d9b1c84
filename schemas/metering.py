"""Events of the METERING stream: ``meter.<tenant>.<worker_id>.<assignment_id>.<event>``.

Only the kernel writes here. An agent claims its usage on the INTAKE stream (a :class:`UsageTick`
with its own view of the work's identity); the intake service checks the claim against the
assignment the kernel made and stores the tick with the kernel's facts: tenant, provider, pool,
GPU type and tier come from the assignment and the registry, never from the agent. Tokens are
counted by the gateways, which see the traffic (:class:`TokensServed`).
"""

from __future__ import annotations

from schemas._base import Event, Fields
from schemas.values import Pool, WorkKind


class MeteredInterval(Fields, frozen=True, kw_only=True):
    """The work that one metering record measures, and the interval it covers.

    The interval is the time the usage happened (Unix milliseconds, from its meter); billing periods
    are taken from ``end_ms``. Money is never in a metering record: the ledger prices it.

    Attributes:
        work_id: the job or endpoint id; ``work_kind`` says which.
        assignment_id / epoch: the assignment that did the work.
        provider: the provider that owns the worker (who gets paid): the kernel's record.
        gpu_type: the GPU model family billed (``cpu`` for CPU work): the kernel's record.
        pool: the pool the work ran in: the kernel's record.
    """

    work_id: str
    work_kind: WorkKind
    assignment_id: str
    epoch: int
    provider: str = ""
    gpu_type: str = ""
    pool: Pool = "shared"
    start_ms: int
    end_ms: int


class UsageTick(Event, MeteredInterval, tag="meter.tick", frozen=True, kw_only=True):
    """Usage of one running assignment over one interval (every 10 s by default).

    Attributes:
        gpu_ms: GPU-milliseconds used (GPUs x wall milliseconds); ``cpu_ms`` likewise for CPU work.
        tier: the provider's tier when the tick was accepted (``platinum``... ``unverified``).
        tokens / source: legacy: how gateways counted tokens before :class:`TokensServed` (on the
            legacy subject ``meter.<tenant>.<worker_id>.tokens`` only; ignored anywhere else).
    """

    gpu_ms: int = 0
    cpu_ms: int = 0
    tier: str = "unverified"
    tokens: int = 0
    source: str = ""


class TokensServed(Event, MeteredInterval, tag="meter.tokens", frozen=True, kw_only=True):
    """Tokens one inference replica served over one interval, as one gateway process counted them
    (prompt plus completion tokens of each response's ``usage``).

    Attributes:
        source: the gateway process that counted (``gateway-<id>``): each counts its own traffic.
        provider / gpu_type / pool / tier: of the replica's worker and endpoint, as the kernel knows
            them, so that tokens land on the same invoice line as the replica's GPU time.
    """

    work_kind: WorkKind = "endpoint"
    tokens: int
    tier: str = "unverified"
    source: str


MeteringEvent = UsageTick | TokensServed
