"""Pure parts of the gateway's line and routing: fairness across keys, bounds, slots, Retry-After,
rendezvous hashing, bounded loads, the route keys read off a body."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from core.autoscale import Load, decide
from gateway.autoscaler import Autoscaler, gpu_util
from gateway.inference import InferenceProxy
from gateway.queueing import UNKNOWN_RETRY_S, Line, LineFull, Waiter
from gateway.routing import LOAD_FACTOR, Picker, RoutedBody, leading_text, rendezvous, route_key
from ops.cli.endpoints import traffic_text
from projections.liveness import LastBeat, LivenessState
from schemas.api.endpoints import Traffic
from schemas.endpoints import EndpointDeployed, Routing
from schemas.values import GpuTelemetry
from tests.support.records import endpoint_record


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


def test_round_robin_skips_full_replicas() -> None:
    pick = Picker("round_robin")
    assert [pick(None, ["a", "b", "c"], {}, 1) for _ in range(3)] == ["a", "b", "c"]
    assert pick(None, ["a", "b", "c"], {"a": 1, "b": 1}, 1) == "c"
    assert pick(None, ["a", "b"], {"a": 1, "b": 1}, 1) is None


def test_rendezvous_moves_only_the_keys_of_a_replica_that_left() -> None:
    replicas = ["http://h:1", "http://h:2", "http://h:3"]
    before = {k: rendezvous(k, replicas)[0] for k in map(str, range(300))}
    assert set(Counter(before.values())) == set(replicas)
    after = {k: rendezvous(k, replicas[:2])[0] for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == "http://h:3"}


def test_session_keys_stay_on_their_replica_while_it_has_room() -> None:
    pick = Picker("session")
    replicas = ["a", "b"]
    home = pick("user-1", replicas, {}, 4)
    assert home is not None
    assert all(pick("user-1", replicas, {}, 4) == home for _ in range(5))
    other = "b" if home == "a" else "a"
    assert pick("user-1", replicas, {home: 4}, 4) == other  # full: spills to the next in order
    assert pick("user-1", [other], {}, 4) == other  # its replica gone: the key moves


def test_prefix_routing_keeps_a_prefix_together_within_the_load_bound() -> None:
    pick = Picker("prefix")
    replicas = ["a", "b"]
    home = rendezvous("p", replicas)[0]
    other = "b" if home == "a" else "a"
    in_flight: dict[str, int] = {}
    chosen = []
    for _ in range(6):
        address = pick("p", replicas, in_flight, 8)
        assert address is not None
        in_flight[address] = in_flight.get(address, 0) + 1
        chosen.append(address)
    assert chosen[:3] == [home] * 3 and other in chosen  # 1.25 x average + 1 caps the home replica
    assert max(in_flight.values()) <= LOAD_FACTOR * 6 / 2 + 2  # never past 1.25 x average + 1, plus itself


def test_route_keys_come_from_the_header_the_user_or_the_prompts_leading_text() -> None:
    decode = msgspec.json.Decoder(RoutedBody).decode
    system = "You are a helpful assistant. " * 60
    chat = decode(msgspec.json.encode({"model": "m", "user": "u1", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "question 1"}]}))  # fmt: skip
    chat2 = decode(msgspec.json.encode({"model": "m", "messages": [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": "another question"}]}))  # fmt: skip
    assert route_key("session", chat, {"x-session-id": "s9"}) == "s9"
    assert route_key("session", chat, {}) == "u1"
    assert route_key("session", chat2, {}) is None
    assert route_key("round_robin", chat, {}) is None
    assert route_key("prefix", chat, {}) == route_key("prefix", chat2, {})  # the shared system prompt
    text = leading_text(chat)
    assert text is not None and text.startswith("system: You are") and len(text) == 1024
    short = decode(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert leading_text(short) == "user: hi\n"
    completion = decode(b'{"model": "m", "prompt": ["The capital of", "x"]}')
    assert leading_text(completion) == "The capital of"
    assert leading_text(decode(b'{"model": "m", "input": ["an embedding", "y"]}')) == "an embedding"
    assert route_key("prefix", decode(b'{"model": "m"}'), {}) is None


def _bounds(**changes: object) -> EndpointDeployed:
    fields: dict[str, object] = {"name": "e", "model": "m", "max_replicas": 4, "target_rps_per_replica": 10.0}
    return EndpointDeployed(**{**fields, "max_concurrency": 2, **changes})  # type: ignore[arg-type]


def test_a_waiting_line_scales_out_even_under_the_rps_target() -> None:
    out = decide(_bounds(), desired=1, rps=0.5, idle_s=0.0, load=Load(queued=3.0, in_flight=2, ready=1))
    assert out is not None and out.replicas == 3  # ceil(3 waiting / 2 per replica) more
    assert out.inputs["queue_depth"] == 3.0 and out.inputs["in_flight"] == 2.0 and out.inputs["rps"] == 0.5
    assert "wait in line" in out.reason
    assert decide(_bounds(), 1, 0.5, 0.0, Load(queued=40.0, ready=1)).replicas == 4  # type: ignore[union-attr]


def test_no_queue_scale_out_while_a_replica_starts_or_at_the_maximum() -> None:
    assert decide(_bounds(), 2, 0.5, 0.0, Load(queued=5.0, ready=1)) is None  # the one asked for starts
    assert decide(_bounds(max_replicas=2), 2, 0.5, 0.0, Load(queued=5.0, ready=2)) is None
    assert decide(_bounds(), 1, 0.5, 0.0, Load(queued=0.4, ready=1)) is None  # a blip, not a line


def test_a_waiting_line_or_busy_gpus_block_a_scale_in() -> None:
    assert decide(_bounds(), 3, 1.0, 0.0, Load(ready=3)).replicas == 1  # type: ignore[union-attr]
    assert decide(_bounds(), 3, 1.0, 0.0, Load(queued=0.5, ready=3)) is None
    assert decide(_bounds(), 3, 1.0, 0.0, Load(ready=3, gpu_util_pct=70.0)) is None


def test_busy_gpus_add_one_replica_and_their_utilisation_is_recorded() -> None:
    # while every replica holds a request the gateway sent it (tests/e2e/trust/test_numbers.py: without)
    out = decide(_bounds(), 2, 1.0, 0.0, Load(ready=2, in_flight=2, gpu_util_pct=95.0))
    assert out is not None and out.replicas == 3 and out.inputs["gpu_util_pct"] == 95.0
    assert "gpu_util_pct" not in decide(_bounds(), 3, 1.0, 0.0, Load(ready=3)).inputs  # type: ignore[union-attr]


def test_gpu_utilisation_is_the_mean_over_the_replicas_workers_reporting_it() -> None:
    beats = LivenessState(beats={
        "w1": LastBeat(seq=1, time_ns=0, interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=80.0),
                                                               GpuTelemetry(index=1, util_pct=100.0)]),
        "w2": LastBeat(seq=2, time_ns=0, interval_s=1.0, gpus=[GpuTelemetry(index=0)]),
        "w3": LastBeat(seq=3, time_ns=0, interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=0.0)]),
    })  # fmt: skip
    assert gpu_util(beats, {"w1", "w2"}) == 90.0
    assert gpu_util(beats, {"w2"}) is None and gpu_util(beats, set()) is None
    hostile = LastBeat(
        seq=4,
        time_ns=0,
        interval_s=1.0,
        gpus=[GpuTelemetry(index=0, util_pct=1e9), GpuTelemetry(index=1, util_pct=float("nan"))],
    )
    beats.beats["w4"] = hostile  # not percentages: left out, not "busy" (an agent cannot force a scale-out)
    assert gpu_util(beats, {"w1", "w4"}) == 90.0 and gpu_util(beats, {"w4"}) is None


def test_the_cli_shows_the_line_beside_the_traffic_only_when_there_is_one() -> None:
    quiet = Traffic(requests=3, rps=0.05, p50_ms=4.0, p95_ms=5.0, p99_ms=6.0)
    assert traffic_text(quiet) == "3 req, 0.05 rps, 0.0% errors, p50/p95/p99 4.0/5.0/6.0 ms"
    busy = Traffic(requests=3, queue_depth=5, in_flight=8, wait_p50_ms=120.0, wait_p99_ms=900.4, rejected=2)
    assert traffic_text(busy).endswith("; 5 waiting, 8 in flight, wait p50/p99 120/900 ms, 2 refused (429)")


def test_an_endpoint_holding_a_request_is_never_idle() -> None:
    proxy = InferenceProxy()
    scaler = Autoscaler(None, proxy)  # type: ignore[arg-type]
    endpoint = endpoint_record(tenant="t", endpoint_id="e", name="e", model="m", state="serving")
    assert scaler.idle_s("t/e", endpoint, 100.0) == 0.0  # serving since now
    assert scaler.idle_s("t/e", endpoint, 130.0) == 30.0
    line = proxy.line_of("t/e", endpoint.spec)
    line.enter("k", None, 130.0, ["r"])
    assert scaler.idle_s("t/e", endpoint, 500.0) == 0.0
    line.release("r", 500.0)
    assert scaler.idle_s("t/e", endpoint, 510.0) == 10.0


def test_a_waiter_whose_endpoint_failed_is_neither_refused_nor_abandoned() -> None:
    line = _line(limit=1)
    line.enter("a", None, 0.0, ["r"])
    waiter = line.enter("a", None, 0.0, ["r"])
    line.leave(waiter, 1.0, abandoned=False)
    assert line.depth == 0 and line.abandoned == 0 and not line.rejected
