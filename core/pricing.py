"""Versioned price tables and the pure pricing of one usage tick. Money is always an integer.

Units: prices are micro-USD (1 USD = 1_000_000 micros) per GPU-hour or per CPU core-hour; usage is
GPU-milliseconds and CPU-milliseconds (``UsageTick.gpu_ms`` / ``cpu_ms``); percentages are integers.

A price table never changes once published: a new price is a new table with a higher ``version`` and
a later ``effective_from_ms``, appended to :data:`PRICE_TABLES`. A tick is priced by the table in
effect at its ``end_ms`` (the same instant that chooses its billing period), and every invoice line
records the version it was priced with, so re-pricing history is never silent.

Pools: the shared pool pays list price; the managed pool pays list price +25% (reserved, dedicated
capacity with priority); the private pool pays 0 per tick: it is the tenant's own hardware, whose
platform fee is an enterprise contract billed outside the per-tick ledger. Private ticks are still
metered (their GPU-milliseconds appear on invoice lines at zero charge), which is what the contract
fee and the audit trail are computed from.

Provider payouts are a share of the (rounded) tenant charge by the provider's uptime tier: platinum
80%, gold 75%, silver 70%, unverified 0% ("zero until verified"); an unknown tier is paid like
unverified.
"""

from __future__ import annotations

import msgspec

from schemas.metering import UsageTick

MS_PER_HOUR = 3_600_000
_CHARGE_DENOMINATOR = MS_PER_HOUR * 100  # milliseconds per hour x percent
CPU_GPU_TYPE = "cpu"
"""The ``gpu_type`` of CPU-only work: its GPU-milliseconds (if any) are not billed."""


class PriceTable(msgspec.Struct, frozen=True, kw_only=True):
    """One published version of the prices.

    Attributes:
        version: 1, 2, ...; recorded on every invoice line priced with this table.
        effective_from_ms: Unix milliseconds (UTC) from which this table prices ticks.
        gpu_hour_micros: list price per GPU-hour by GPU family (``H100``); ``cpu`` is 0.
        default_gpu_hour_micros: the price of a GPU family missing from ``gpu_hour_micros``.
        cpu_hour_micros: list price per CPU core-hour.
        pool_multiplier_pct: percentage of list price charged per pool (100 = list price).
        provider_share_pct_by_tier: percentage of the charge paid out to the provider, by tier.
    """

    version: int
    effective_from_ms: int
    gpu_hour_micros: dict[str, int]
    default_gpu_hour_micros: int
    cpu_hour_micros: int
    pool_multiplier_pct: dict[str, int]
    provider_share_pct_by_tier: dict[str, int]


PRICE_TABLES: tuple[PriceTable, ...] = (
    PriceTable(
        version=1,
        effective_from_ms=1_767_225_600_000,  # 2026-01-01T00:00:00Z
        gpu_hour_micros={
            "H100": 2_490_000,
            "A100": 1_490_000,
            "L40S": 990_000,
            "RTX4090": 440_000,
            "RTX3090": 220_000,
            "T4": 290_000,
            CPU_GPU_TYPE: 0,
        },
        default_gpu_hour_micros=500_000,
        cpu_hour_micros=20_000,
        pool_multiplier_pct={"shared": 100, "managed": 125, "private": 0},
        provider_share_pct_by_tier={"platinum": 80, "gold": 75, "silver": 70, "unverified": 0},
    ),
)
"""Every published table, oldest first (versions and effective times strictly increasing)."""


def table_at(ms: int, tables: tuple[PriceTable, ...] = PRICE_TABLES) -> PriceTable:
    """The table in effect at Unix milliseconds ``ms``: the latest whose ``effective_from_ms <= ms``.

    Usage from before the first table is priced by the first table (there is no "free" era).
    """
    if ms >= tables[-1].effective_from_ms:  # the common case: usage priced by the newest table
        return tables[-1]
    for table in reversed(tables):
        if table.effective_from_ms <= ms:
            return table
    return tables[0]


def round_half_up(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to the nearest integer, halves up (``denominator > 0``).

    Exact integer arithmetic: ``floor((2n + d) / 2d)``.
    """
    return (2 * numerator + denominator) // (2 * denominator)


def price(tick: UsageTick, tables: tuple[PriceTable, ...] = PRICE_TABLES) -> tuple[int, int, int]:
    """Price one usage tick.

    ``charge = round_half_up((gpu_ms * gpu_rate + cpu_ms * cpu_rate) * pool_pct / (3_600_000 * 100))``
    in micros, computed exactly from the tick's milliseconds and rounded once, half up; then
    ``payout = round_half_up(charge * share_pct / 100)``, so a payout never exceeds its charge and a
    line's total is the sum of its ticks, each auditable on its own.

    Returns:
        ``(charge_micros, payout_micros, price_version)``.
    """
    table = table_at(tick.end_ms, tables)
    gpu_rate = table.gpu_hour_micros.get(tick.gpu_type, table.default_gpu_hour_micros)
    pool_pct = table.pool_multiplier_pct.get(tick.pool, 100)
    numerator = (tick.gpu_ms * gpu_rate + tick.cpu_ms * table.cpu_hour_micros) * pool_pct
    charge = round_half_up(numerator, _CHARGE_DENOMINATOR)
    share_pct = table.provider_share_pct_by_tier.get(tick.tier, 0)
    payout = round_half_up(charge * share_pct, 100)
    return charge, payout, table.version


_FAMILIES_LONGEST_FIRST = sorted(
    {name for table in PRICE_TABLES for name in table.gpu_hour_micros if name != CPU_GPU_TYPE},
    key=lambda name: (-len(name), name),
)


def gpu_family(model: str) -> str:
    """The price-table family of an NVML model name: ``NVIDIA H100 80GB HBM3`` -> ``H100``.

    Spaces, dashes and ``GeForce`` are ignored (``NVIDIA GeForce RTX 4090`` -> ``RTX4090``). A model
    no table names comes back normalised (upper case, no spaces) and is priced at the default rate;
    an empty model is ``cpu``.
    """
    flat = model.upper().replace(" ", "").replace("-", "").replace("GEFORCE", "")
    if not flat:
        return CPU_GPU_TYPE
    for family in _FAMILIES_LONGEST_FIRST:
        if family in flat:
            return family
    return flat.removeprefix("NVIDIA")


def list_price_micros(gpu_type: str | None, pool: str, at_ms: int | None = None) -> int:
    """What a tenant pays per GPU-hour of ``gpu_type`` in ``pool``, in micro-USD (the figure a
    provider's minimum-price policy is compared with). ``None`` (any GPU) is priced at the default
    rate; ``at_ms`` picks the table in effect then (default: the newest table)."""
    table = PRICE_TABLES[-1] if at_ms is None else table_at(at_ms)
    rate = (
        table.default_gpu_hour_micros
        if gpu_type is None
        else table.gpu_hour_micros.get(gpu_family(gpu_type), table.default_gpu_hour_micros)
    )
    return rate * table.pool_multiplier_pct.get(pool, 100) // 100
