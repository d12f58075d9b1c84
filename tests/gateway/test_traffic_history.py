"""Pure parts of an endpoint's hour of traffic and replicas: the 10-second buckets (counts, rates,
percentiles within 2.5% of the exact ones, the line's peak depth and 429s), what they keep and
forget (an hour, only buckets where something happened, a cap on endpoints that one tenant cannot
spend for another), and the replica steps and scale marks folded from an endpoint's events."""

from __future__ import annotations

import random
from typing import Any

import pytest

from core.clock import NS_PER_S
from core.streams import endpoint_subject
from gateway.queueing import percentile
from gateway.scale_history import HISTORY_S as SCALE_HISTORY_S
from gateway.scale_history import Folded, ReplicaStep, counts, label_of
from gateway.traffic_history import BINS, BUCKET_S, FIELDS, HISTORY_S, TrafficBuckets, bin_ms, bin_of
from projections.endpoints import endpoint_key
from schemas.endpoints import (
    EndpointDeployed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointScaled,
    EndpointScaledToZero,
)
from schemas.envelope import Recorded
from schemas.values import Assignment, Provenance

T0 = 1_775_001_000.0  # 2026-04-01, a multiple of 10 s
KEY = "acme/ep-1"


def test_requests_fall_in_10_second_buckets_with_their_rates_and_errors() -> None:
    history = TrafficBuckets()
    for i in range(20):  # 2 requests a second for 10 s, every fifth failing
        history.record(KEY, T0 + i * 0.5, 0.010, ok=i % 5 != 0)
    history.record(KEY, T0 + 12.0, 0.030, ok=True)
    history.record(KEY, T0 + 13.0, 0.050, ok=True)
    closed, current = history.window(KEY, T0 + 14.0, 3600)
    assert (closed.start, closed.requests, closed.errors) == (T0, 20, 4)
    assert closed.rps == 2.0 and closed.error_rate == 0.2
    assert closed.p50_ms == closed.p99_ms == pytest.approx(10.0, rel=0.025)
    # the open bucket: its rate over the 4 s elapsed, not over 10
    assert (current.start, current.requests, current.rps) == (T0 + 10, 2, 0.5)
    assert current.p50_ms == pytest.approx(30.0, rel=0.025)
    assert current.p99_ms == pytest.approx(50.0, rel=0.025)
    assert history.window("acme/other", T0 + 14.0, 3600) == []


@pytest.mark.parametrize("shape", ["uniform", "lognormal", "bimodal"])
def test_percentiles_are_within_2_5_percent_of_the_exact_nearest_rank(shape: str) -> None:
    rng = random.Random(shape)
    draw = {
        "uniform": lambda: rng.uniform(0.001, 2.0),
        "lognormal": lambda: rng.lognormvariate(-3.0, 1.2),
        "bimodal": lambda: rng.choice([0.004, 0.9]) * rng.uniform(0.9, 1.1),
    }[shape]
    history = TrafficBuckets()
    latencies = [draw() for _ in range(5000)]
    for i, seconds in enumerate(latencies):
        history.record(KEY, T0 + i / 1000, seconds, ok=True, waited_s=seconds / 10)
    [bucket] = history.window(KEY, T0 + 9.9, 60)
    exact = sorted(latencies)
    for q, shown in ((0.5, bucket.p50_ms), (0.95, bucket.p95_ms), (0.99, bucket.p99_ms)):
        assert shown == pytest.approx(percentile(exact, q) * 1000, rel=0.025), q
    assert bucket.wait_p99_ms == pytest.approx(percentile(exact, 0.99) * 100, rel=0.025)


def test_bins_cover_a_tenth_of_a_millisecond_to_an_hour_five_percent_apart() -> None:
    assert bin_of(0.0) == bin_of(0.1) == 0 and bin_ms(0) == 0.1
    assert bin_of(3_600_000.0) == BINS - 1 and bin_of(1e12) == BINS - 1
    for ms in (0.15, 1.0, 7.3, 250.0, 61_000.0):
        assert bin_ms(bin_of(ms)) == pytest.approx(ms, rel=0.025)


def test_the_line_peak_depth_and_429s_count_in_their_bucket_and_an_empty_line_keeps_nothing() -> None:
    history = TrafficBuckets()
    history.depth(KEY, T0 + 1, 0)
    assert history.window(KEY, T0 + 2, 60) == [] and history.series == {}
    for t, depth in ((1, 3), (2, 7), (4, 2)):
        history.depth(KEY, T0 + t, depth)
    history.refused(KEY, T0 + 5)
    history.refused(KEY, T0 + 5.5)
    history.depth(KEY, T0 + 11, 1)
    first, second = history.window(KEY, T0 + 12, 60)
    assert (first.depth, first.rejected, first.requests, first.p50_ms, first.rps) == (7, 2, 0, None, 0.0)
    assert (second.depth, second.rejected) == (1, 0)


def test_an_hour_is_kept_and_idle_time_costs_nothing() -> None:
    history = TrafficBuckets()
    for minute in range(120):  # two hours, one request a minute
        history.record(KEY, T0 + minute * 60, 0.02, ok=True)
    now = T0 + 119 * 60 + 5
    series = history.series[KEY]
    assert len(series.starts) <= HISTORY_S // 60 and len(series.values) == len(series.starts) * len(FIELDS)
    buckets = history.window(KEY, now, 3600)
    assert all(b.requests == 1 for b in buckets)
    # the buckets that end inside the window: minute 59's (ending 5 s into it) to minute 119's
    assert [b.start for b in buckets] == [T0 + minute * 60 for minute in range(59, 120)]
    assert buckets[0].start + BUCKET_S > now - 3600 >= buckets[0].start
    assert len(history.window(KEY, now, 600)) == 11  # minutes 109 (its last 5 s) to 119


def test_one_tenant_creating_many_endpoints_evicts_only_its_own_history() -> None:
    history = TrafficBuckets(max_series=10, max_per_tenant=4)
    for i in range(4):
        history.record(f"calm/ep-{i}", T0 + i, 0.01, ok=True)
    for i in range(50):  # a hostile tenant: a request to each of 50 endpoints
        history.record(f"noisy/ep-{i}", T0 + 10 + i, 0.01, ok=True)
    assert sum(k.startswith("noisy/") for k in history.series) == 4
    assert {f"calm/ep-{i}" for i in range(4)} <= set(history.series)
    assert set(history.series) >= {f"noisy/ep-{i}" for i in range(46, 50)}  # its latest four
    for i in range(3):  # over the total: the least recently served go, whoever they are
        history.record(f"third/ep-{i}", T0 + 100 + i, 0.01, ok=True)
    assert len(history.series) == 10 and "calm/ep-0" not in history.series
    assert history.per_tenant == {"calm": 3, "noisy": 4, "third": 3}


def test_endpoints_idle_for_an_hour_are_forgotten() -> None:
    history = TrafficBuckets()
    history.record("acme/old", T0, 0.01, ok=True)
    history.record("acme/new", T0 + HISTORY_S + 1, 0.01, ok=True)
    assert set(history.series) == {"acme/new"} and history.per_tenant == {"acme": 1}


# -- replicas and scale marks from the endpoint's events ----------------------------------------


class Events:
    """The events of one endpoint as the log would store them (sequence, subject, store time)."""

    def __init__(self, tenant: str, endpoint_id: str) -> None:
        self.tenant, self.endpoint_id, self.seq = tenant, endpoint_id, 0

    def __call__(self, event: Any, t: float) -> Recorded[Any]:
        self.seq += 2  # other endpoints' events in between
        return Recorded(
            stream="ENDPOINTS",
            seq=self.seq,
            subject=endpoint_subject(self.tenant, self.endpoint_id, event),
            time_ns=round(t * NS_PER_S),
            msg_id=f"m{self.seq}",
            event=event,
        )


def _replica(slot: int, epoch: int) -> tuple[EndpointReplicaPlaced, EndpointReplicaReady]:
    a = Assignment(assignment_id=f"ep-1-s{slot}-e{epoch}", worker_id="w1", slot=slot, epoch=epoch)
    placed = EndpointReplicaPlaced(assignments=[a], provenance=Provenance(candidates=1))
    ready = EndpointReplicaReady(assignment_id=a.assignment_id, epoch=epoch, address=f"http://h:{slot}")
    return placed, ready


def test_replica_steps_and_scale_marks_follow_the_endpoints_events() -> None:
    event = Events("acme", "ep-1")
    folded = Folded(endpoint_key("acme", "ep-1"), 0)
    placed0, ready0 = _replica(0, 1)
    placed1, ready1 = _replica(1, 2)
    lost1 = EndpointReplicaLost(assignment_id=ready1.assignment_id, epoch=2, reason="engine died")
    history = [
        (EndpointDeployed(name="chat", model="m/x", max_replicas=3), T0),
        (placed0, T0 + 1),
        (ready0, T0 + 20),
        (EndpointScaled(replicas=2, reason="rps 25 over 10 per replica"), T0 + 60),
        (placed1, T0 + 61),
        (ready1, T0 + 90),
        (lost1, T0 + 300),
        (EndpointScaledToZero(idle_s=300), T0 + 900),
    ]
    for e, t in history:
        folded.fold(event(e, t))
    assert list(folded.steps) == [
        ReplicaStep(T0, 1, 0),
        ReplicaStep(T0 + 20, 1, 1),
        ReplicaStep(T0 + 60, 2, 1),
        ReplicaStep(T0 + 90, 2, 2),
        ReplicaStep(T0 + 300, 2, 1),
        ReplicaStep(T0 + 900, 0, 0),
    ]
    assert [(m.kind, m.label) for m in folded.marks] == [
        ("endpoint.deployed", "deployed"),
        ("endpoint.scaled", "scaled to 2"),
        ("endpoint.replica_lost", "replica lost"),
        ("endpoint.scaled_to_zero", "to zero"),
    ]
    assert folded.seq == event.seq
    # a window from T0 + 100: the count in force then, moved to its start, and what came after
    steps, marks = folded.window(T0 + 100)
    assert steps == [ReplicaStep(T0 + 100, 2, 2), ReplicaStep(T0 + 300, 2, 1), ReplicaStep(T0 + 900, 0, 0)]
    assert [m.t for m in marks] == [T0 + 300, T0 + 900]
    # an hour later the steps before are forgotten, but the one in force stays
    folded.trim(T0 + 900 + SCALE_HISTORY_S + 1)
    assert list(folded.steps) == [ReplicaStep(T0 + 900, 0, 0)] and not folded.marks


def test_a_tenant_setting_bounds_is_marked_apart_and_counts_need_a_live_endpoint() -> None:
    assert (
        label_of(EndpointScaled(replicas=1, reason="bounds", min_replicas=1, by="tenant:acme"))
        == "bounds set"
    )
    assert label_of(EndpointReplicaReady(assignment_id="a", epoch=1, address="http://h:1")) is None
    assert counts(None) == (0, 0)
