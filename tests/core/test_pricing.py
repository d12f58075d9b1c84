"""Pricing (:mod:`core.pricing`): exact half-up rounding, the table in effect, a GPU-hour's price from
milliseconds, GPU families."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import msgspec

from core.pricing import PRICE_TABLES, PriceTable, gpu_family, price, round_half_up, table_at
from tests.support.reducer_builders import APRIL_MS, HOUR_MS, usage_tick


def test_round_half_up_is_exact() -> None:
    assert [round_half_up(n, 2) for n in (-3, -1, 0, 1, 3, 5)] == [-1, 0, 0, 1, 2, 3]
    assert round_half_up(7, 3) == 2
    assert round_half_up(8, 3) == 3
    big = 10**30 + 1
    assert round_half_up(big * 2 + 1, 2) == big + 1


def test_table_at_picks_the_latest_table_in_effect() -> None:
    v1 = PRICE_TABLES[0]
    v2 = msgspec.structs.replace(v1, version=2, effective_from_ms=APRIL_MS)
    tables = (v1, v2)
    assert table_at(v1.effective_from_ms - 1, tables) is v1  # before the first table: the first
    assert table_at(APRIL_MS - 1, tables) is v1
    assert table_at(APRIL_MS, tables) is v2
    assert table_at(APRIL_MS + 10**12, tables) is v2
    assert price(usage_tick(end_ms=APRIL_MS), tables)[2] == 2
    assert price(usage_tick(start_ms=0, end_ms=APRIL_MS - 1), tables)[2] == 1


def test_version_one_table() -> None:
    v1 = PRICE_TABLES[0]
    assert isinstance(v1, PriceTable)
    assert v1.version == 1 and v1.effective_from_ms == 1_767_225_600_000
    assert {"H100", "A100", "L40S", "RTX4090", "RTX3090", "T4"} <= set(v1.gpu_hour_micros)
    assert v1.provider_share_pct_by_tier == {"platinum": 80, "gold": 75, "silver": 70, "unverified": 0}
    assert v1.pool_multiplier_pct == {"shared": 100, "managed": 125, "private": 0}
    versions = [t.version for t in PRICE_TABLES]
    assert versions == sorted(set(versions))


def test_price_one_gpu_hour() -> None:
    assert price(usage_tick()) == (2_490_000, 1_992_000, 1)
    assert price(usage_tick(pool="managed")) == (3_112_500, 2_490_000, 1)
    assert price(usage_tick(pool="private")) == (0, 0, 1)
    assert price(usage_tick(tier="gold")) == (2_490_000, 1_867_500, 1)
    assert price(usage_tick(tier="unverified")) == (2_490_000, 0, 1)
    assert price(usage_tick(tier="diamond")) == (2_490_000, 0, 1)
    assert price(usage_tick(gpu_type="B200")) == (500_000, 400_000, 1)
    assert price(usage_tick(gpu_type="cpu", gpu_ms=0, cpu_ms=8 * HOUR_MS)) == (160_000, 128_000, 1)
    assert price(usage_tick(gpu_ms=0)) == (0, 0, 1)


def test_price_rounds_half_up_from_milliseconds() -> None:
    # 60 ms on an H100: 60 * 2_490_000 / 3_600_000 = 41.5 micros exactly -> 42.
    charge, payout, _ = price(usage_tick(gpu_ms=60))
    assert (charge, payout) == (42, 34)  # 42 * 0.8 = 33.6 -> 34
    assert price(usage_tick(gpu_ms=59))[0] == 41  # 40.808...
    assert price(usage_tick(gpu_ms=1))[0] == 1  # 0.6917 -> 1
    # one tick of 10 s on two GPUs at +25%: 20_000 * 2_490_000 * 125 / 360_000_000 = 17_291.67 -> 17_292
    assert price(usage_tick(gpu_ms=20_000, pool="managed"))[0] == 17_292
    assert all(type(x) is int for x in price(usage_tick(gpu_ms=12_345, cpu_ms=6_789)))


def test_price_matches_exact_rational_arithmetic() -> None:
    rng = random.Random(2026)
    table = PRICE_TABLES[0]
    for _ in range(2_000):
        tick = usage_tick(
            gpu_ms=rng.randrange(0, 10**9),
            cpu_ms=rng.randrange(0, 10**9),
            gpu_type=rng.choice(["H100", "T4", "cpu", "X1"]),
            pool=rng.choice(["shared", "managed", "private"]),
            tier=rng.choice(["platinum", "gold", "silver", "unverified"]),
        )
        rate = table.gpu_hour_micros.get(tick.gpu_type, table.default_gpu_hour_micros)
        exact = Fraction(tick.gpu_ms * rate + tick.cpu_ms * table.cpu_hour_micros, HOUR_MS)
        exact *= Fraction(table.pool_multiplier_pct[tick.pool], 100)
        charge = math.floor(exact + Fraction(1, 2))
        payout = math.floor(
            charge * Fraction(table.provider_share_pct_by_tier[tick.tier], 100) + Fraction(1, 2)
        )
        assert price(tick) == (charge, payout, 1)


def test_gpu_family() -> None:
    assert gpu_family("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_family("NVIDIA A100-SXM4-80GB") == "A100"
    assert gpu_family("NVIDIA GeForce RTX 4090") == "RTX4090"
    assert gpu_family("NVIDIA GeForce RTX 3090") == "RTX3090"
    assert gpu_family("NVIDIA L40S") == "L40S"
    assert gpu_family("Tesla T4") == "T4"
    assert gpu_family("") == "cpu"
    assert gpu_family("NVIDIA B200") == "B200"
