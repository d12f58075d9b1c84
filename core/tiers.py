"""Provider availability tiers: a pure function of a worker's record and an instant.

| tier | uptime over 30 days | hardware |
|---|---|---|
| platinum | >= 99% | every GPU H100 / A100 class (:data:`PLATINUM_FAMILIES`) |
| gold | >= 95% | any |
| silver | >= 90% | any |
| unverified | below 90%, or observed for less than :data:`MIN_OBSERVATION_S` (24 h) | any |

Uptime comes from the registry's bookkeeping (:mod:`projections.registry`): the first registration,
the closed lost intervals (summed in ``downtime_ns``), the open one (``lost_since_ns``) and the
deregistered time (``excluded_ns``, not counted either way). The registry keeps sums, not the
intervals, so a 30-day figure is exact only while the worker is younger than the window. For an
older worker the open lost interval is clipped to the window exactly, the closed downtime is
prorated over the span it lies in (first registration to the open interval, or to the end), and
the excluded time over the worker's life: an estimate that assumes old outages were spread evenly.
An exact window needs the recent intervals themselves (a bounded list of ``(start_ns, end_ns)``
of lost intervals on the worker's record).

The tier feeds ranking (:data:`TIER_FACTORS`) and, through :mod:`core.pricing`, payouts.
"""

from __future__ import annotations

import functools
from typing import Literal

from core.pricing import gpu_family

Tier = Literal["platinum", "gold", "silver", "unverified"]

WINDOW_S = 30 * 86_400
"""The uptime window: 30 days, in seconds."""
MIN_OBSERVATION_S = 86_400
"""A worker first registered less than this many seconds ago (24 h) is ``unverified``."""
PLATINUM_UPTIME = 0.99
GOLD_UPTIME = 0.95
SILVER_UPTIME = 0.90
PLATINUM_FAMILIES: tuple[str, ...] = ("H100", "A100", "H200", "B100", "B200", "GH200")
"""GPU families (as :func:`core.pricing.gpu_family` names them, or prefixes of them) of the
"H100 / A100 class": data-centre GPUs with HBM."""

family_of = functools.lru_cache(maxsize=4096)(gpu_family)
""":func:`core.pricing.gpu_family`, memoised: a fleet has few distinct model names."""

TIER_FACTORS: dict[str, float] = {"platinum": 1.0, "gold": 0.9, "silver": 0.75, "unverified": 0.5}
"""The default ranking factor of each tier, in (0, 1]: platinum gets first assignment;
unverified workers still take work (fresh agents must be usable), ranked last."""


def is_platinum_hardware(models: list[str]) -> bool:
    """True if there is at least one GPU and every one is of the H100 / A100 class."""
    return bool(models) and all(family_of(m).startswith(PLATINUM_FAMILIES) for m in models)


def tier_for(uptime_ratio: float, models: list[str]) -> Tier:
    """The tier of a worker observed long enough, from its uptime and its GPU models.

    Args:
        uptime_ratio: in [0, 1].
        models: NVML model names of the worker's GPUs (empty for a CPU host: at most gold).
    """
    if uptime_ratio >= PLATINUM_UPTIME and is_platinum_hardware(models):
        return "platinum"
    if uptime_ratio >= GOLD_UPTIME:
        return "gold"
    if uptime_ratio >= SILVER_UPTIME:
        return "silver"
    return "unverified"


def tier_factor(tier: str, factors: dict[str, float] = TIER_FACTORS) -> float:
    """The ranking factor of ``tier`` in (0, 1] (an unknown tier ranks as ``unverified``)."""
    return factors.get(tier, factors["unverified"])
