"""Figures per day and per fleet bucket (:mod:`projections.days`): how intervals are cut, a worker's
uptime per day from the registry, the ledger's days summing to its months on the golden history, the
fleet's registered GPUs over time and the agents' reported utilisation per bucket."""

from __future__ import annotations

import math
from collections import defaultdict

from core.streams import heartbeat_subject, worker_subject
from projections import LEDGER, LIVENESS, REGISTRY
from projections.days import (
    BUCKET_MS,
    BUCKETS_KEPT,
    DAYS_KEPT,
    NS_PER_DAY,
    SPLIT_MAX,
    add_days,
    day_name,
    day_of_ms,
    spread,
)
from projections.fleet import fleet_points, registered_gpus
from projections.ledger import LedgerState, charges, payouts, period_of
from projections.liveness import LivenessState, reported_util
from projections.registry import RegistryState, daily_uptime
from schemas.values import Gpu, GpuTelemetry
from schemas.workers import Heartbeat, WorkerDeregistered, WorkerLost, WorkerRecovered, WorkerRegistered
from tests.golden.make import HISTORY, load_history, stream_records
from tests.support.reducer_builders import Log, roundtrips

HOUR = 3600
DAY = 86_400
D = 20_544  # 2026-04-01


def test_days_are_utc_dates() -> None:
    assert day_name(D) == "2026-04-01" and day_name(0) == "1970-01-01"
    assert day_of_ms(D * 86_400_000) == D and day_of_ms(D * 86_400_000 - 1) == D - 1


def test_an_interval_is_cut_at_midnight_and_old_days_are_dropped() -> None:
    start = D * NS_PER_DAY - 2 * HOUR * 10**9
    days = add_days({}, start, start + 5 * HOUR * 10**9)
    assert days == {str(D - 1): 2 * HOUR * 10**9, str(D): 3 * HOUR * 10**9}
    again = add_days(days, D * NS_PER_DAY, D * NS_PER_DAY + 10)
    assert again[str(D)] == 3 * HOUR * 10**9 + 10 and days[str(D)] == 3 * HOUR * 10**9  # a copy
    later = add_days(again, (D + DAYS_KEPT) * NS_PER_DAY, (D + DAYS_KEPT) * NS_PER_DAY + 1)
    assert later == {str(D): again[str(D)], str(D + DAYS_KEPT): 1}


def test_an_amount_is_shared_among_the_buckets_it_covers_exactly() -> None:
    buckets: dict[str, int] = {}
    spread(buckets, 10 * BUCKET_MS, 10 * BUCKET_MS + 10_000, 20_000)  # inside one bucket
    assert buckets == {"10": 20_000}
    spread(buckets, 11 * BUCKET_MS - BUCKET_MS // 3, 13 * BUCKET_MS, 7)  # a third, then two whole buckets
    assert buckets == {"10": 20_000 + 1, "11": 2, "12": 4} and sum(buckets.values()) == 20_007
    wide: dict[str, int] = {}
    spread(wide, 0, (SPLIT_MAX + 2) * BUCKET_MS, 5)  # a malformed interval: all in its end's bucket
    assert wide == {str(SPLIT_MAX + 1): 5}


def _register(log: Log, worker: str, t_s: float, gpus: int = 0) -> None:
    gpu_list = [Gpu(index=i, model="A100", vram_total_mb=80_000, vram_free_mb=80_000) for i in range(gpus)]
    registered = WorkerRegistered(provider="p1", hostname=f"{worker}.example", gpus=gpu_list)
    log(worker_subject(worker, registered), registered, t_s)


def test_a_workers_uptime_per_day_is_its_share_of_the_day_not_lost() -> None:
    log = Log(REGISTRY)
    t0 = D * DAY
    _register(log, "w1", t0 + 12 * HOUR)
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), t0 + DAY + 18 * HOUR)
    log(
        worker_subject("w1", WorkerRecovered), WorkerRecovered(), t0 + 2 * DAY + 6 * HOUR
    )  # 12 h over midnight
    log(worker_subject("w1", WorkerDeregistered), WorkerDeregistered(), t0 + 3 * DAY)
    state: RegistryState = log.state
    record = state.workers["w1"]
    assert daily_uptime(record, D + 3, D + 3, (t0 + 3 * DAY + 12 * HOUR) * 10**9) == [None]  # away
    _register(log, "w1", t0 + 3 * DAY + 12 * HOUR)  # back at noon: the morning is not observed
    record = state.workers["w1"]
    now_ns = (t0 + 4 * DAY) * 10**9
    assert daily_uptime(record, D - 1, D + 4, now_ns) == [None, 1.0, 0.75, 0.75, 1.0, None]
    log(worker_subject("w1", WorkerLost), WorkerLost(silent_s=3), t0 + 3 * DAY + 18 * HOUR)  # still lost
    assert daily_uptime(state.workers["w1"], D + 3, D + 3, now_ns) == [0.5]
    down = sum(state.workers["w1"].down_days.values())
    assert down == state.workers["w1"].downtime_ns == 12 * HOUR * 10**9


def test_the_ledgers_days_sum_to_its_months_on_the_golden_history() -> None:
    state: LedgerState = LEDGER.fold(stream_records(LEDGER, load_history(HISTORY)))
    assert len(state.spend) >= 3 and len(state.earned) >= 3
    spent: dict[tuple[str, str], int] = defaultdict(int)
    for key, micros in state.spend.items():
        tenant, day = key.rsplit("/", 1)
        spent[(tenant, period_of(int(day) * 86_400_000))] += micros
    assert {k for k, v in spent.items() if v} == {(line.tenant, line.period) for line in state.lines.values()}
    for (tenant, period), micros in spent.items():
        assert micros == charges(state, tenant, period)
    earned: dict[tuple[str, str, str], int] = defaultdict(int)
    for key, tiers in state.earned.items():
        provider, day = key.rsplit("/", 1)
        for tier, micros in tiers.items():
            earned[(provider, period_of(int(day) * 86_400_000), tier)] += micros
    lines = [line for provider in {k[0] for k in earned} for line in payouts(state, provider)]
    assert earned == {(p.provider, p.period, p.tier): p.payout_micros for p in lines}
    assert sum(state.fleet_gpu_ms.values()) == sum(line.gpu_ms for line in state.lines.values()) > 0


def test_registered_gpus_over_time_follow_registrations() -> None:
    log = Log(REGISTRY)
    _register(log, "w1", 100, gpus=2)
    _register(log, "w2", 200, gpus=4)
    _register(log, "cpu", 150)
    log(worker_subject("w1", WorkerDeregistered), WorkerDeregistered(), 300)
    at = [50 * 10**9, 100 * 10**9, 250 * 10**9, 300 * 10**9, 400 * 10**9]
    assert registered_gpus(log.state, at) == [0, 2, 6, 4, 4]


def test_a_hostile_agents_readings_that_are_not_percentages_are_not_counted() -> None:
    """A heartbeat is its agent's own word: NaN, an infinity, a negative or a huge utilisation would
    spoil the fleet's mean for every host in the bucket; only readings from 0 to 100 count."""
    log = Log(LIVENESS)
    bogus = [math.nan, math.inf, -math.inf, -5.0, 100.5, 1e300]
    log(
        heartbeat_subject("w-hostile"),
        Heartbeat(gpus=[GpuTelemetry(index=i, util_pct=u) for i, u in enumerate(bogus)]),
        0,
    )
    log(
        heartbeat_subject("w1"),
        Heartbeat(gpus=[GpuTelemetry(index=0, util_pct=100.0), GpuTelemetry(index=1, util_pct=0.0)]),
        5,
    )
    assert reported_util(log.state, 0) == (100.0, 2)


def test_reported_utilisation_is_kept_per_bucket_for_eight_days() -> None:
    log = Log(LIVENESS)
    beat = Heartbeat(gpus=[GpuTelemetry(index=0, util_pct=40.0), GpuTelemetry(index=1, util_pct=None)])
    log(heartbeat_subject("w1"), beat, 0)
    log(heartbeat_subject("w2"), Heartbeat(gpus=[GpuTelemetry(index=0, util_pct=80.0)]), 10)
    log(heartbeat_subject("w3"), Heartbeat(), 20)  # no GPUs: nothing to count
    state: LivenessState = log.state
    assert reported_util(state, 0) == (120.0, 2) and reported_util(state, 1) == (0.0, 0)
    log(heartbeat_subject("w1"), beat, BUCKETS_KEPT * BUCKET_MS / 1000)
    assert reported_util(state, 0) == (120.0, 2) and reported_util(state, BUCKETS_KEPT) == (40.0, 1)
    log(heartbeat_subject("w1"), beat, (BUCKETS_KEPT + 1) * BUCKET_MS / 1000)  # bucket 0 is 8 days old
    assert reported_util(state, 0) == (0.0, 0) and set(state.util) == {str(BUCKETS_KEPT)}
    assert reported_util(state, BUCKETS_KEPT + 1) == (40.0, 1)
    log(heartbeat_subject("w2"), beat, BUCKETS_KEPT * BUCKET_MS / 1000)  # a store time earlier again
    log(heartbeat_subject("w2"), beat, (BUCKETS_KEPT + 1) * BUCKET_MS / 1000)
    assert reported_util(state, BUCKETS_KEPT) == (80.0, 2)
    assert reported_util(state, BUCKETS_KEPT + 1) == (80.0, 2)
    roundtrips(LIVENESS, state)

    registry = Log(REGISTRY)
    _register(registry, "w1", 0, gpus=2)
    [point] = fleet_points(
        registry.state,
        LedgerState(fleet_gpu_ms={str(BUCKETS_KEPT): 60_000}),
        state,
        BUCKETS_KEPT,
        BUCKETS_KEPT,
        (BUCKETS_KEPT * BUCKET_MS + 30_000) * 1_000_000,
    )
    # the bucket is 30 s old: 60 GPU-seconds in 30 s are two GPUs
    assert (point.registered_gpus, point.allocated_gpus, point.util_sum, point.readings) == (2, 2.0, 80.0, 2)
