"""Pure parts of the gateway's line and routing: fairness across keys, bounds, slots, Retry-After,
rendezvous hashing, bounded loads, the route keys read off a body."""

from __future__ import annotations

import pytest

from gateway.queueing import UNKNOWN_RETRY_S, Line, LineFull, Waiter
from gateway.routing import Picker
from schemas.endpoints import Routing


def _line(limit: int = 1, max_queue: int = 10, policy: Routing = "round_robin") -> Line:
    return Line(limit, max_queue, Picker(policy))


def test_one_keys_burst_does_not_starve_another_key() -> None:
    line = _line(limit=1)
    first = line.enter("a", None, 0.0, ["r"])
    assert first.address == "r" and first.granted.is_set()
    burst = [line.enter("a", None, 0.1, ["r"]) for _ in range(5)]
    late = line.enter("b", None, 0.2, ["r"])
    assert line.depth == 6 and not late.granted.is_set()
    served: list[object] = []
    for t in range(6):
        line.release("r", 1.0 + t)
        served += [w for w in [*burst, late] if w.granted.is_set() and w not in served]
    assert served[:2] == [burst[0], late]  # b waits behind one request of a, not five
    assert served[2:] == burst[1:]
    assert line.depth == 0 and line.in_flight == {"r": 1}


def test_keys_take_turns_one_request_each() -> None:
    line = _line(limit=1)
    line.enter("x", None, 0.0, ["r"])
    waiters = [line.enter(k, None, 0.0, ["r"]) for k in ("a", "a", "a", "b", "b", "c")]
    order: list[Waiter] = []
    for t in range(len(waiters)):
        line.release("r", float(t))
        order += [w for w in waiters if w.granted.is_set() and w not in order]
    assert [w.key_id for w in order] == ["a", "b", "c", "a", "b", "a"]
    assert order[0] is waiters[0] and order[3] is waiters[1]  # first in, first out within a key


def test_a_full_line_refuses_and_counts_it() -> None:
    line = _line(limit=1, max_queue=2)
    line.enter("a", None, 0.0, ["r"])
    line.enter("a", None, 0.0, ["r"])
    line.enter("b", None, 0.0, ["r"])
    with pytest.raises(LineFull):
        line.enter("c", None, 0.0, ["r"])
    assert line.rejected == {"queue_full": 1} and line.depth == 2


def test_no_replica_means_waiting_and_a_ready_replica_serves_the_line() -> None:
    line = _line(limit=2)
    waiters = [line.enter("a", None, 0.0, []) for _ in range(3)]
    assert line.depth == 3 and not any(w.granted.is_set() for w in waiters)
    assert line.dispatch(["r1"], 2.0) == 2
    assert [w.address for w in waiters] == ["r1", "r1", None]
    assert line.wait_ms(2.0, 0.5) == 2000.0


def test_leaving_the_line_frees_the_place_and_a_granted_slot() -> None:
    line = _line(limit=1)
    line.enter("a", None, 0.0, ["r"])
    gone = line.enter("a", None, 0.0, ["r"])
    timed_out = line.enter("b", None, 0.0, ["r"])
    line.leave(gone, 1.0)
    line.leave(timed_out, 1.0, "queue_timeout")
    line.leave(timed_out, 1.0)  # twice: counted once
    assert line.depth == 0 and line.abandoned == 1 and line.rejected == {"queue_timeout": 1}
    third = line.enter("c", None, 2.0, ["r"])
    line.release("r", 3.0)
    assert third.address == "r"
    line.leave(third, 4.0)  # granted, then its client left: the slot is freed
    assert line.in_flight == {}


def test_retry_after_follows_depth_and_the_recent_service_rate() -> None:
    line = _line(limit=1, max_queue=100)
    assert line.retry_after_s(0.0) == UNKNOWN_RETRY_S
    line.enter("a", None, 0.0, ["r"])
    for _ in range(9):
        line.enter("a", None, 0.0, ["r"])
    for t in range(3):  # 3 done in 30 s: 0.1/s; 7 waiting + itself
        line.release("r", 10.0 + t)
    assert line.depth == 6
    assert line.retry_after_s(20.0) == 70


def test_failover_moves_a_slot_and_the_depth_mean_is_sampled() -> None:
    line = _line(limit=1)
    line.enter("a", None, 0.0, ["r1", "r2"])
    line.moved("r1", "r2")
    assert line.in_flight == {"r2": 1}
    for t, depth in ((0.0, 0), (1.0, 2), (2.0, 4)):
        line.depth = depth
        line.sample(t)
    assert line.mean_depth(2.0, 10.0) == 2.0 and line.mean_depth(2.0, 1.5) == 3.0


def test_a_waiter_whose_endpoint_failed_is_neither_refused_nor_abandoned() -> None:
    line = _line(limit=1)
    line.enter("a", None, 0.0, ["r"])
    waiter = line.enter("a", None, 0.0, ["r"])
    line.leave(waiter, 1.0, abandoned=False)
    assert line.depth == 0 and line.abandoned == 0 and not line.rejected
