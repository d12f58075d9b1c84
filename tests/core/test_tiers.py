"""Provider tiers: 30-day uptime from the registry's bookkeeping and the tier table's boundaries."""

from __future__ import annotations

import pytest

from core.tiers import (
    MIN_OBSERVATION_S,
    TIER_FACTORS,
    WINDOW_S,
    is_platinum_hardware,
    tier_factor,
    tier_for,
)
from projections.candidates import tier_of, uptime_30d
from projections.registry import WorkerRecord
from schemas.values import Gpu
from tests.support.projection_records import worker_record

S = 1_000_000_000
DAY = 86_400 * S
NOW = 1_772_000_000 * S


def record(
    since_days: float, *, models: tuple[str, ...] = ("NVIDIA A100-SXM4-80GB",), **kw: object
) -> WorkerRecord:
    gpus = [Gpu(index=i, model=m, vram_total_mb=81920, vram_free_mb=81920) for i, m in enumerate(models)]
    return worker_record(
        worker_id="w1",
        provider="p",
        hostname="h",
        gpus=gpus,
        since_ns=NOW - int(since_days * DAY),
        registered_ns=NOW - int(since_days * DAY),
        **{"verified": True, **kw},  # type: ignore[arg-type]
    )


def test_young_worker_uptime_is_exact() -> None:
    assert uptime_30d(record(10), NOW) == 1.0
    assert uptime_30d(record(10, downtime_ns=DAY // 10), NOW) == pytest.approx(0.99)
    assert uptime_30d(record(0), NOW) == 1.0  # nothing observed yet


def test_open_lost_interval_counts_up_to_now() -> None:
    lost = record(10, lost=True, state="lost", lost_since_ns=NOW - DAY)
    assert uptime_30d(lost, NOW) == pytest.approx(0.9)


def test_old_worker_open_interval_is_clipped_to_the_window() -> None:
    # lost 40 days ago and still lost: the whole 30-day window is downtime, nothing more
    lost = record(100, lost=True, state="lost", lost_since_ns=NOW - 40 * DAY)
    assert uptime_30d(lost, NOW) == 0.0
    # lost 3 days ago, no other downtime: 3 of 30 days
    recent = record(100, lost=True, state="lost", lost_since_ns=NOW - 3 * DAY)
    assert uptime_30d(recent, NOW) == pytest.approx(0.9)


def test_old_worker_closed_downtime_is_prorated_over_its_life() -> None:
    # 120 days observed, 4 days down in closed intervals: 1 of them expected in the last 30 days
    old = record(120, downtime_ns=4 * DAY)
    assert uptime_30d(old, NOW) == pytest.approx(1 - 1 / 30)
    # excluded (deregistered) time shrinks the observed window the same way
    excluded = record(120, downtime_ns=4 * DAY, excluded_ns=60 * DAY)
    assert uptime_30d(excluded, NOW) == pytest.approx(1 - 1 / 15)


def test_window_is_a_parameter() -> None:
    old = record(20, downtime_ns=2 * DAY)
    assert uptime_30d(old, NOW) == pytest.approx(0.9)
    assert uptime_30d(old, NOW, window_s=10 * 86_400) == pytest.approx(0.9)  # prorated: 1 of 10 days
    assert WINDOW_S == 30 * 86_400


@pytest.mark.parametrize(
    ("ratio", "models", "tier"),
    [
        (1.0, ["NVIDIA H100 80GB HBM3"], "platinum"),
        (0.99, ["NVIDIA A100-SXM4-40GB"], "platinum"),
        (0.99, ["NVIDIA H200"], "platinum"),
        (0.9899, ["NVIDIA H100 80GB HBM3"], "gold"),
        (0.99, ["NVIDIA GeForce RTX 4090"], "gold"),
        (0.99, ["NVIDIA A100-SXM4-40GB", "Tesla T4"], "gold"),  # every GPU must be of the class
        (0.99, [], "gold"),  # a CPU host is never platinum
        (0.95, ["NVIDIA GeForce RTX 3090"], "gold"),
        (0.9499, ["NVIDIA GeForce RTX 3090"], "silver"),
        (0.90, ["Tesla T4"], "silver"),
        (0.8999, ["Tesla T4"], "unverified"),
        (0.0, ["NVIDIA H100 80GB HBM3"], "unverified"),
    ],
)
def test_tier_boundaries(ratio: float, models: list[str], tier: str) -> None:
    assert tier_for(ratio, models) == tier


def test_hardware_class() -> None:
    assert is_platinum_hardware(["NVIDIA H100 PCIe", "NVIDIA H100 PCIe"])
    assert not is_platinum_hardware([])
    assert not is_platinum_hardware(["NVIDIA L40S"])


def test_tier_of_needs_a_day_of_observation_and_a_passed_verification() -> None:
    assert tier_of(record(0.5), NOW) == "unverified"
    assert tier_of(record(10, verified=False), NOW) == "unverified"  # zero until verified (seed 001)
    assert tier_of(record(MIN_OBSERVATION_S / 86_400), NOW) == "platinum"
    assert tier_of(record(0.5), NOW, min_observation_s=3600) == "platinum"


def test_tier_of_from_downtime() -> None:
    assert tier_of(record(10, downtime_ns=DAY // 10), NOW) == "platinum"  # exactly 99%
    assert tier_of(record(10, downtime_ns=DAY // 10 + S), NOW) == "gold"
    assert tier_of(record(10, downtime_ns=DAY // 2), NOW) == "gold"  # exactly 95%
    assert tier_of(record(10, downtime_ns=DAY), NOW) == "silver"  # exactly 90%
    assert tier_of(record(10, downtime_ns=DAY + S), NOW) == "unverified"
    assert tier_of(record(10, models=("Tesla T4",)), NOW) == "gold"


def test_tier_factors_order_the_tiers() -> None:
    factors = [tier_factor(t) for t in ("platinum", "gold", "silver", "unverified")]
    assert factors == sorted(factors, reverse=True)
    assert all(0 < f <= 1 for f in factors)
    assert tier_factor("bogus") == TIER_FACTORS["unverified"]
