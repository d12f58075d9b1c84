"""Every number from an agent or a replica is bounded and checked against the kernel's facts (issue 25,
attacks 3, 5 and 9), tried with real credentials.

The attacker, ``mallory``, is a provider's enrolled agent (:class:`tests.support.claims.Mallory`): it
publishes raw bytes on its own ``hb.<id>`` subject with its own NATS user, as any agent may. The kernel
is the secured stack (:mod:`tests.support.secured`: the real gateway in process, the intake, the agent-user
sync) with a real coordinator (:func:`tests.support.coordinator`) and a real honest agent where work
must really be placed; a replica that lies about its token counts is a small HTTP server on loopback.

* A heartbeat whose interval is not a heartbeat interval (``1e308``, zero, a week) is refused where it
  is decoded: every reader skips it (it is in QUARANTINE with its reason), the worker's liveness is
  as if it had never been sent, so that the kernel's own maximum silence decides when it is lost, and
  the coordinator places everyone else's work, before and after a restart; ``/metrics`` answers.
* A reading that is no reading (a negative count, a utilisation of 10**9, a temperature of -300 °C)
  is dropped field by field: the beat still counts as a sign of life.
* A replica's ``usage`` is bounded by what the kernel saw: the request's bytes and ``max_tokens``,
  and the bytes the replica sent back.
* GPU readings of a worker registered without GPUs are ignored, and no GPU reading adds a replica
  without load the gateway itself measured.
* A beat's telemetry reaches a tenant's feed only for assignments the schedule says that worker
  holds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.autoscale import Load, decide
from core.clock import LOST_AFTER_INTERVALS, NS_PER_S, beat_deadline_ns, believed_interval_s, silent_at
from core.errors import AppendRejected
from core.log import EventLog
from core.streams import endpoint_subject, heartbeat_subject, metering_subject
from gateway.autoscaler import Autoscaler
from gateway.feed import FeedHub, Subscriber
from gateway.feed_filter import FeedFilter
from gateway.token_counts import TEMPLATE_TOKENS, SseUsage, billable, bound_of, tokens_of
from ops.coordinator.beat_deadlines import BeatDeadlines
from projections import ENDPOINTS, LEDGER, LIVENESS, REGISTRY, SCHEDULE
from projections.base import state_hash
from projections.ledger import charges, invoice, line_key
from projections.liveness import (
    MIN_BEAT_GAP_NS,
    LastBeat,
    LivenessState,
    admit_beat,
    overdue,
    registered_readings,
    reported_util,
)
from projections.runner import ProjectionRunner, rebuild
from projections.schedule import job_key
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady, EndpointScaled
from schemas.envelope import Recorded
from schemas.metering import TokensServed, UsageTick
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance
from schemas.workers import MIN_BEAT_INTERVAL_S, Heartbeat
from tests.support import AgentProcess, coordinator, of, records, until
from tests.support.claims import Mallory, enroll_mallory, place_on, wait_for_state
from tests.support.inference import served
from tests.support.secured import Stack

MAX_BEAT_INTERVAL_S = 3600.0
"""The longest interval an agent may beat at (``RESONTECH_AGENT_HEARTBEAT_INTERVAL_S``'s bound)."""
H100 = Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81_559, vram_free_mb=81_000, uuid="GPU-1")


def beat(**fields: Any) -> bytes:
    """A heartbeat's bytes as an attacker writes them: JSON it chose, not our encoder's."""
    return json.dumps({"type": "hb.beat", **fields}).encode()


async def send_beat(mallory: Mallory, data: bytes) -> int:
    """Publish ``data`` on mallory's own heartbeat subject, within its beat budget (one beat per
    :data:`~projections.liveness.MIN_BEAT_GAP_NS` of store time is read at all); its HEARTBEATS
    sequence."""
    await asyncio.sleep(1.5 * MIN_BEAT_GAP_NS / NS_PER_S)
    return (await mallory.log.publish_raw(heartbeat_subject(mallory.worker_id), data)).seq


async def refused_beats(log: EventLog, worker_id: str, count: int) -> list[str]:
    """The reasons of the worker's heartbeats in QUARANTINE, once there are ``count``."""
    reasons: list[str] = []
    for _ in range(200):
        found = [
            q
            for q in await log.quarantined(limit=10_000)
            if q.stream == "HEARTBEATS" and q.subject == heartbeat_subject(worker_id)
        ]
        reasons = [q.reason for q in sorted(found, key=lambda q: q.origin_seq)]
        if len(reasons) >= count:
            return reasons
        await asyncio.sleep(0.1)
    raise AssertionError(f"{len(reasons)} of {count} beats of {worker_id} quarantined: {reasons}")


async def submit(stack: Stack, admin: str, name: str) -> str:
    body = {"name": name, "kind": "process", "shards": 1, "command": [sys.executable, "-c", "print('ok')"]}
    response = await stack.post("/v1/jobs", admin, body)
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


async def placed_on(stack: Stack, tenant: str, job_id: str) -> str:
    """The worker the coordinator placed the job on, once it did."""
    key = job_key(tenant, job_id)
    job = await wait_for_state(
        stack.log, SCHEDULE, lambda s: (j := s.jobs.get(key)) and j.assignments and j, f"{job_id} placed"
    )
    [held] = job.assignments.values()
    return str(held.worker_id)


async def metrics_answer(stack: Stack) -> httpx.Response:
    return await stack.client.get("/metrics", headers={"Authorization": f"Bearer {stack.operator_key}"})


# -- attack 3: one heartbeat stopped placement for everyone --------------------------------------


HOSTILE_INTERVALS: tuple[Any, ...] = (1e308, 1e6, 0, -1.0, 604_800.0, "1.0", None)
"""Not heartbeat intervals: the overflow, a dead worker kept alive for 11 days or a week, never-lost
zero and negatives, and the wrong types."""


async def test_a_hostile_heartbeat_interval_is_refused_and_placement_goes_on(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> None:
    tenant, admin = await stack.tenant("victim")
    provider, provider_key = await stack.provider()
    await stack.enroll("honest", provider, provider_key)
    agent = enrolled_agents("honest")
    mallory = await enroll_mallory(stack)
    await mallory.register()
    me = mallory.worker_id
    honest_seq = await send_beat(mallory, beat(interval_s=1.0, cpu_pct=5.0))
    await wait_for_state(stack.log, LIVENESS, lambda s: me in s.beats, "mallory's honest beat")
    liveness, _ = await rebuild(stack.log, LIVENESS)
    before = liveness.beats[me]
    for interval in HOSTILE_INTERVALS:
        await send_beat(mallory, beat(interval_s=interval, running=["x"]))
    reasons = await refused_beats(stack.log, me, len(HOSTILE_INTERVALS))
    assert all("interval_s" in r for r in reasons), reasons
    # every reader skips them: its latest beat is its honest one, and the kernel's clock declares it
    # silent three of those intervals later, whatever it said since
    liveness, _ = await rebuild(stack.log, LIVENESS)
    assert liveness.beats[me] == before and before.seq == honest_seq
    later = before.time_ns + int((LOST_AFTER_INTERVALS + 0.5) * NS_PER_S)
    assert me in overdue(liveness, later)
    assert (await metrics_answer(stack)).status_code == 200
    async with coordinator(stack.log):
        honest = await agent.worker_id()
        await wait_for_state(
            stack.log, REGISTRY, lambda s: (w := s.workers.get(honest)) and w.verified, "verified"
        )
        first = await submit(stack, admin, "first")
        assert await placed_on(stack, tenant, first) == honest
        await send_beat(mallory, beat(interval_s=1e308))  # once more, while it runs
        second = await submit(stack, admin, "second")
        assert await placed_on(stack, tenant, second) == honest
        assert (await metrics_answer(stack)).status_code == 200
    async with coordinator(stack.log, name="restarted"):  # a restart reads every beat again
        third = await submit(stack, admin, "third")
        assert await placed_on(stack, tenant, third) == honest
    liveness, _ = await rebuild(stack.log, LIVENESS)
    assert liveness.beats[me] == before  # as if the hostile beats had never been sent
    assert all(b.interval_s <= MAX_BEAT_INTERVAL_S for b in liveness.beats.values())
    await mallory.log.close()


async def test_readings_that_are_no_readings_are_dropped_and_the_beat_still_counts(stack: Stack) -> None:
    mallory = await enroll_mallory(stack)
    await mallory.register(gpus=[H100])
    me = mallory.worker_id
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    hostile = {
        "interval_s": 2.0,
        "cpu_pct": -5.0,
        "memory_used_mb": 2**62,
        "gpus": [
            {
                "index": 0,
                "util_pct": 1e9,
                "mem_used_mb": -1,
                "temp_c": -300.0,
                "power_w": 1e300,
                "ecc_errors": -7,
                "xid_errors": 2**62,
            }
        ],
    }
    seq = await send_beat(mallory, beat(**hostile))
    liveness = await wait_for_state(stack.log, LIVENESS, lambda s: me in s.beats and s, "the beat folded")
    last = liveness.beats[me]
    assert last.seq == seq and last.interval_s == 2.0  # a sign of life all the same
    assert (last.cpu_pct, last.memory_used_mb) == (0.0, 0)
    [gpu] = last.gpus
    assert (gpu.util_pct, gpu.mem_used_mb, gpu.temp_c, gpu.power_w, gpu.ecc_errors) == (None,) * 5
    assert gpu.xid_errors is not None and 0 < gpu.xid_errors < 2**62  # errors it reports stay errors
    # a structural lie (thousands of "GPUs", a running list of a million ids) is refused whole
    await send_beat(mallory, beat(interval_s=1.0, gpus=[{"index": i} for i in range(10_000)]))
    await send_beat(mallory, beat(interval_s=1.0, running=[f"a-{i}" for i in range(5_000)]))
    assert len(await refused_beats(stack.log, me, 2)) == 2
    with pytest.raises(AppendRejected, match="message size"):  # over a MiB: the server stores nothing
        await send_beat(mallory, beat(interval_s=1.0, running=[f"a-{i}" for i in range(100_000)]))
    liveness, _ = await rebuild(stack.log, LIVENESS)
    assert liveness.beats[me].seq == seq
    workers = await stack.client.get(
        f"/v1/workers/{me}", headers={"Authorization": f"Bearer {stack.operator_key}"}
    )
    assert workers.status_code == 200, workers.text
    assert (await metrics_answer(stack)).status_code == 200
    await mallory.log.close()


# -- budgets: one agent's flood of beats ------------------------------------------------------------

FLOOD = 4_000
"""Beats mallory publishes as fast as the server takes them (half of them undecodable)."""


def admitted_at_most(times_ns: list[int]) -> int:
    """The most beats of one worker stored at ``times_ns`` (in stream order) the fold may admit: one
    per :data:`MIN_BEAT_GAP_NS` of the span they were stored over, and the first."""
    return (max(times_ns) - min(times_ns)) // MIN_BEAT_GAP_NS + 1


async def flood(mallory: Mallory, count: int) -> list[int]:
    """Publish ``count`` beats on mallory's own subject, 200 in flight at a time: every other one
    with an interval that does not decode. Their HEARTBEATS sequences."""
    subject = heartbeat_subject(mallory.worker_id)
    good, bad = beat(interval_s=1.0, cpu_pct=99.0, running=["x"]), beat(interval_s=1e308)
    seqs: list[int] = []
    for start in range(0, count, 200):
        sent = [mallory.log.publish_raw(subject, bad if i % 2 else good) for i in range(start, start + 200)]
        seqs += [p.seq for p in await asyncio.gather(*sent)]
    return seqs


async def test_one_agents_flood_of_beats_is_passed_over_and_slows_no_one_else(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> None:
    provider, provider_key = await stack.provider()
    await stack.enroll("honest", provider, provider_key)
    honest = await enrolled_agents("honest").worker_id()
    mallory = await enroll_mallory(stack)
    me = mallory.worker_id
    live = stack.kernel.runners[LIVENESS.name]  # the gateway's: its feed listens to what it applies
    folded: list[str] = []
    live.listeners.append(lambda record: folded.append(record.subject))
    await until(lambda: honest in live.state.beats, "the honest agent's beats folded")
    seqs = await flood(mallory, FLOOD)
    last = max(seqs)
    # the honest agent's liveness is current: a beat it sent after the whole flood is folded
    await until(lambda: live.state.beats[honest].seq > last, "an honest beat after the flood folded")
    stored = [r for r in await stack.log.replay_raw("HEARTBEATS") if r.subject == heartbeat_subject(me)]
    assert len(stored) == FLOOD  # the server took every one: the budget is the kernel's fold
    bound = admitted_at_most([r.time_ns for r in stored])
    assert bound < FLOOD // 10, bound  # the flood was faster than its budget, by far
    # the gateway's live fold (and so its feed) applied at most the budget of mallory's beats...
    assert 0 < folded.count(heartbeat_subject(me)) <= bound
    # ...and so do a fresh catch-up (a coordinator starting) and a rebuild, the same beats
    runner = ProjectionRunner(stack.log, LIVENESS, write_snapshots=False)
    caught_up: list[int] = []
    runner.listeners.append(
        lambda record: record.subject == heartbeat_subject(me) and caught_up.append(record.seq)
    )
    await runner.catch_up()
    assert runner.seq >= last  # passed over, not waited for
    rebuilt, _ = await rebuild(stack.log, LIVENESS, until_seq=last)
    caught, _ = await rebuild(stack.log, LIVENESS, until_seq=runner.seq)
    assert state_hash(caught) == runner.hash()
    assert rebuilt.beats[me].seq in caught_up
    later = max(r.time_ns for r in stored) + int(MIN_BEAT_INTERVAL_S * NS_PER_S)
    assert honest not in overdue(runner.state, later)
    # the undecodable half cost a quarantine write only for the beats admitted, not one each
    refused = [q for q in await stack.log.quarantined(limit=10_000) if q.subject == heartbeat_subject(me)]
    assert len(caught_up) > 0 and len(caught_up) + len(refused) <= bound, (len(caught_up), len(refused))
    await mallory.log.close()


# -- attack 5: token counts and GPU readings are the provider's word ------------------------------

HUGE = 10**12


def lying_replica() -> Starlette:
    """An OpenAI-shaped engine that answers every request with ``usage`` of 10**12 tokens, plain or
    streamed."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        usage = {"prompt_tokens": HUGE, "completion_tokens": HUGE, "total_tokens": 2 * HUGE}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            return JSONResponse(
                {"id": "c1", "object": "chat.completion", "choices": [choice], "usage": usage}
            )

        async def events() -> AsyncIterator[bytes]:
            delta = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
            yield f"data: {json.dumps(delta)}\n\n".encode()
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return Response("ok")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


async def ready_endpoint(
    stack: Stack, admin: str, tenant: str, worker_id: str, address: str, **spec: Any
) -> str:
    """Deploy an endpoint through the API and make one replica of it ready on ``worker_id`` at
    ``address``, as the kernel does once the worker's claims are judged."""
    body = {"name": spec.pop("name", "chat"), "model": "m", **spec}
    deployed = await stack.post("/v1/endpoints", admin, body)
    assert deployed.status_code == 201, deployed.text
    endpoint_id = str(deployed.json()["endpoint_id"])
    replica = Assignment(assignment_id=f"{endpoint_id}-s0-e1", worker_id=worker_id, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
    ready = EndpointReplicaReady(assignment_id=replica.assignment_id, epoch=1, address=address)
    for event in (placed, ready):
        await stack.kernel.append(endpoint_subject(tenant, endpoint_id, event), event, visible_in=ENDPOINTS)
    return endpoint_id


async def test_a_replicas_token_count_is_bounded_by_what_the_kernel_saw(stack: Stack) -> None:
    tenant, admin = await stack.tenant("victim")
    app = stack.client._transport.app  # type: ignore[attr-defined]
    async with served(lying_replica()) as address:
        endpoint_id = await ready_endpoint(stack, admin, tenant, "w-replica", address)
        sent: list[int] = []
        for stream in (False, True):
            request = {
                "model": "chat",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 16,
                "stream": stream,
            }
            answer = await stack.post("/v1/chat/completions", admin, request)
            assert answer.status_code == 200, answer.text
            if stream:  # as forwarded: the gateway asks the replica for its usage
                request["stream_options"] = {"include_usage": True}
            sent.append(len(json.dumps(request, separators=(",", ":"))))
        assert await app.state.tokens.flush(stack.kernel)
    ticks = of(await records(stack.log, "METERING", f"meter.{tenant}.>"), TokensServed)
    billed = sum(t.tokens for t in ticks if t.work_id == endpoint_id)
    # at most a token per byte of each request as forwarded (and the template's allowance), and
    # max_tokens: not the 4 * 10**12 the replica said
    assert 0 < billed <= sum(sent) + 2 * (TEMPLATE_TOKENS + 16), billed
    await app.state.inference.close()


async def test_a_cpu_hosts_gpu_readings_scale_nothing(stack: Stack) -> None:
    tenant, admin = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await mallory.register()  # no GPUs
    me = mallory.worker_id
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    app = stack.client._transport.app  # type: ignore[attr-defined]
    endpoint_id = await ready_endpoint(
        stack, admin, tenant, me, "http://10.66.0.7:8000", min_replicas=1, max_replicas=3
    )
    busy = [{"index": 0, "util_pct": 100.0}, {"index": 1, "util_pct": 100.0}]
    await send_beat(mallory, beat(interval_s=1.0, gpus=busy, running=[f"{endpoint_id}-s0-e1"]))
    await wait_for_state(stack.log, LIVENESS, lambda s: me in s.beats and s.beats[me].gpus, "its beat")
    autoscaler = Autoscaler(stack.kernel, app.state.inference)
    start = time.monotonic()
    for i in range(5):  # ticks, one simulated second apart (the decision reads the time it is given)
        await autoscaler.tick(start + i)
    scaled = of(await records(stack.log, "ENDPOINTS", f"endpoint.{tenant}.{endpoint_id}.>"), EndpointScaled)
    assert scaled == [], scaled
    endpoint = stack.kernel.state(ENDPOINTS).endpoints[f"{tenant}/{endpoint_id}"]
    assert endpoint.desired_replicas == 1
    await app.state.inference.close()
    await mallory.log.close()


# -- attack 9: spoofed telemetry -----------------------------------------------------------------


async def test_a_beat_reaches_a_tenants_feed_only_from_the_worker_the_schedule_says_holds_the_work(
    stack: Stack,
) -> None:
    tenant, admin = await stack.tenant("victim")
    enrolled, state_dir = await stack.enroll("holder")  # an agent like any other: it holds the work
    holder = Mallory(stack, enrolled, await stack.as_agent(enrolled, state_dir))
    await holder.register(gpus=[H100])
    mallory = await enroll_mallory(stack)
    await mallory.register(gpus=[H100])
    for w in (holder, mallory):  # as the gateway knows them (it shows readings of registered GPUs)
        await until(lambda w=w: w.worker_id in stack.kernel.state(REGISTRY).workers, "registered")
    job_id, held, _ = await place_on(stack.log, holder.worker_id, tenant, gpus=1)
    key = job_key(tenant, job_id)
    await until(
        lambda: (j := stack.kernel.state(SCHEDULE).jobs.get(key)) and j.assignments, "the gateway saw it"
    )
    subscriber = Subscriber(FeedFilter(tenant), limit=100)
    stack.kernel.feed.subscribe(subscriber)
    try:
        made_up = [{"index": 0, "util_pct": 12.5, "mem_used_mb": 1234}]
        await send_beat(mallory, beat(interval_s=1.0, gpus=made_up, running=[held.assignment_id]))
        real = [{"index": 0, "util_pct": 77.0, "mem_used_mb": 40_000}]
        holder_seq = await send_beat(holder, beat(interval_s=1.0, gpus=real, running=[held.assignment_id]))
        await until(lambda: stack.kernel.runners[LIVENESS.name].seq >= holder_seq, "both beats applied")
        messages = [json.loads(text) for _, _, text in subscriber.pending]
        telemetry = [m for m in messages if m["kind"] == "telemetry"]
        assert [(m["worker"], m["jobs"]) for m in telemetry] == [(holder.worker_id, [job_id])]
        assert telemetry[0]["event"]["gpus"][0]["util_pct"] == 77.0
    finally:
        stack.kernel.feed.unsubscribe(subscriber)
    answer = await stack.client.get(
        f"/v1/jobs/{job_id}/telemetry", headers={"Authorization": f"Bearer {admin}"}
    )
    assert answer.status_code == 200, answer.text
    workers = {w["worker_id"]: w for w in answer.json()["workers"]}
    assert set(workers) == {holder.worker_id}
    assert {s["util_pct"] for s in workers[holder.worker_id]["samples"]} == {77.0}
    # rebuilt, the liveness of the holder is its own beat; the kernel's projections never saw mallory's
    liveness, _ = await rebuild(stack.log, LIVENESS)
    assert liveness.beats[holder.worker_id].seq == holder_seq
    assert state_hash(liveness) == state_hash(stack.kernel.state(LIVENESS))
    for w in (holder, mallory):
        await w.log.close()


# -- the rules, as pure functions ----------------------------------------------------------------


def test_the_kernel_counts_silence_in_intervals_it_believes() -> None:
    assert believed_interval_s(2.0) == 2.0
    for hostile in (1e308, float("inf"), 1e6):
        assert believed_interval_s(hostile) == MAX_BEAT_INTERVAL_S
    for hostile in (0.0, -1.0, float("nan"), float("-inf")):
        assert believed_interval_s(hostile) == 0.0
    # a beat that got past decoding (an old snapshot, a struct built by hand) overflows nothing
    assert beat_deadline_ns(0, 1e308) == int(LOST_AFTER_INTERVALS * MAX_BEAT_INTERVAL_S * NS_PER_S)
    assert silent_at(1, 0, float("nan"))
    beats = {
        "w-inf": LastBeat(seq=1, time_ns=0, interval_s=1e308),
        "w-nan": LastBeat(seq=2, time_ns=0, interval_s=float("nan")),
    }
    deadlines = BeatDeadlines()
    for worker_id, last in beats.items():
        deadlines.beat(worker_id, last)
    later = int((LOST_AFTER_INTERVALS * MAX_BEAT_INTERVAL_S + 1) * NS_PER_S)
    assert sorted(deadlines.expire(later)) == ["w-inf", "w-nan"]
    assert overdue(LivenessState(beats=beats), later) == ["w-inf", "w-nan"]


def test_a_replicas_usage_is_billed_within_the_request_and_the_answer() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"n":2}'
    bound = bound_of(body)
    assert (bound.prompt, bound.completion) == (len(body) + TEMPLATE_TOKENS, 20)
    assert bound_of(b'{"model":"m","max_completion_tokens":5,"max_tokens":99}').completion == 5
    assert bound_of(b'{"model":"m","max_tokens":"many"}').completion is None  # the answer bounds it
    usage = b'{"usage":{"prompt_tokens":1000000000000,"completion_tokens":1000000000000}}'
    assert tokens_of(usage, bound, len(usage)) == bound.prompt + 20
    assert tokens_of(usage, bound_of(b'{"model":"m"}'), 70) == len(b'{"model":"m"}') + TEMPLATE_TOKENS + 70
    assert tokens_of(b'{"usage":{"prompt_tokens":5,"completion_tokens":7}}', bound, 1000) == 12  # honest
    assert billable(-5, -7, bound, 100) == 0
    stream = SseUsage(strip=True, bound=bound_of(b'{"model":"m"}'))
    stream.feed(b'data: {"choices":[]}\n\n')
    stream.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":99999}}\n\n')
    assert stream.tokens == 3 + stream.received  # no more completion tokens than bytes streamed


def test_no_gpu_reading_adds_or_keeps_a_replica_without_load_the_gateway_measured() -> None:
    bounds = EndpointDeployed(name="e", model="m", max_replicas=4, target_rps_per_replica=10.0)
    busy = 100.0
    assert decide(bounds, 1, 0.0, 0.0, Load(ready=1, gpu_util_pct=busy)) is None  # no traffic at all
    assert decide(bounds, 2, 1.0, 0.0, Load(ready=2, in_flight=1, gpu_util_pct=busy)) is None  # one idle
    out = decide(bounds, 2, 1.0, 0.0, Load(ready=2, in_flight=2, gpu_util_pct=busy))
    assert out is not None and out.replicas == 3
    # said busy, with no traffic seen: the tenant's replicas go back down
    back = decide(bounds, 3, 0.0, 0.0, Load(ready=3, gpu_util_pct=busy))
    assert back is not None and back.replicas == 1
    assert decide(bounds, 3, 1.0, 0.0, Load(ready=3, gpu_util_pct=busy)) is None  # with traffic: held


def test_the_fold_admits_one_beat_of_a_worker_per_gap_of_store_time() -> None:
    state = LivenessState()
    gap = MIN_BEAT_GAP_NS
    assert admit_beat(state, "hb.w1", 1, 10 * gap)
    assert not admit_beat(state, "hb.w1", 2, 10 * gap + gap - 1)  # too soon: passed over
    assert admit_beat(state, "hb.w2", 3, 10 * gap + 1)  # another worker's budget is its own
    assert admit_beat(state, "hb.w1", 4, 11 * gap)  # a gap after the last admitted one
    assert not admit_beat(state, "hb.w1", 4, 20 * gap)  # a sequence asked about already
    assert admit_beat(state, "hb.w1", 5, 5 * gap)  # a clock gone back never silences a worker
    assert state.admitted == {"w1": 5 * gap, "w2": 10 * gap + 1}
    # a tiny interval buys no budget: it reads as the least the kernel believes, twice the gap
    tiny = Heartbeat(interval_s=1e-9)
    assert tiny.interval_s == MIN_BEAT_INTERVAL_S and 2 * gap <= MIN_BEAT_INTERVAL_S * NS_PER_S
    # a fold over records admits the same: a beat too soon after another changes nothing
    records = [
        Recorded(stream="HEARTBEATS", seq=i + 1, subject="hb.w1", time_ns=t, msg_id=f"m{i}", event=beat_)
        for i, (t, beat_) in enumerate(
            [(0, Heartbeat(cpu_pct=1.0)), (gap // 2, Heartbeat(cpu_pct=99.0)), (gap, Heartbeat(cpu_pct=2.0))]
        )
    ]
    state = LIVENESS.fold(records)
    assert (state.beats["w1"].seq, state.beats["w1"].cpu_pct) == (3, 2.0)
    assert state_hash(LIVENESS.fold(r for r in records for _ in (0, 1))) == state_hash(state)


def test_a_tenants_job_and_endpoint_of_one_id_are_two_invoice_lines() -> None:
    april_ms, hour_ms = 1_775_001_600_000, 3_600_000  # 2026-04-01
    common = {"work_id": "x", "epoch": 1, "provider": "p1", "gpu_type": "H100", "pool": "shared"}
    ticks = [
        UsageTick(
            work_kind="job",
            assignment_id="a-job",
            start_ms=april_ms,
            end_ms=april_ms + hour_ms,
            gpu_ms=hour_ms,
            tier="platinum",
            **common,
        ),
        UsageTick(
            work_kind="endpoint",
            assignment_id="a-ep",
            start_ms=april_ms,
            end_ms=april_ms + 2 * hour_ms,
            gpu_ms=2 * hour_ms,
            tier="platinum",
            **common,
        ),
        TokensServed(
            work_kind="endpoint",
            assignment_id="a-ep",
            start_ms=april_ms,
            end_ms=april_ms + 1,
            tokens=42,
            source="gateway-a",
            **common,
        ),
    ]
    records = [
        Recorded(
            stream="METERING",
            seq=i + 1,
            subject=metering_subject("acme", "w1", t.assignment_id, t),
            time_ns=i,
            msg_id=f"m{i}",
            event=t,
        )
        for i, t in enumerate(ticks)
    ]
    state = LEDGER.fold(records)
    lines = {(line.work_kind, line.work_id): line for line in state.lines.values()}
    assert set(lines) == {("job", "x"), ("endpoint", "x")}  # not one line, of the first tick's kind
    job, endpoint = lines["job", "x"], lines["endpoint", "x"]
    assert (job.gpu_ms, job.tokens, job.ticks) == (hour_ms, 0, 1)
    assert (endpoint.gpu_ms, endpoint.tokens, endpoint.ticks) == (2 * hour_ms, 42, 2)
    assert endpoint.charge_micros == 2 * job.charge_micros > 0
    assert state.lines[line_key("acme", "2026-04", "job", "x", "H100", "shared", 1)] == job
    assert sum(line.charge_micros for line in invoice(state, "acme", "2026-04")) == charges(state, "acme")


def test_the_fleet_chart_counts_one_reading_per_gpu_of_a_beat() -> None:
    repeated = Heartbeat(gpus=[GpuTelemetry(index=0, util_pct=100.0)] * 64 + [GpuTelemetry(index=1)])
    record = Recorded(stream="HEARTBEATS", seq=1, subject="hb.w1", time_ns=0, msg_id="m1", event=repeated)
    state = LIVENESS.fold([record])
    assert reported_util(state, 0) == (100.0, 1)  # GPU 0 once, GPU 1 reported nothing


def test_gpu_readings_count_only_for_gpus_the_worker_registered() -> None:
    readings = [GpuTelemetry(index=i, util_pct=100.0) for i in (0, 0, 1, 7)]
    assert registered_readings(readings, []) == []
    assert registered_readings(readings, [H100]) == [readings[0]]  # one reading per GPU it has


def test_the_feed_names_only_owners_the_schedule_gives_the_beating_worker() -> None:
    hub = FeedHub()
    hub._index(("t1", "job", "j"), frozenset({("w-1", "a")}))
    hub._index(("t2", "job", "j"), frozenset({("w-1", "a"), ("w-2", "b")}))  # an id two owners share
    assert hub.owners("w-1", ["a"]) == set()  # a beat cannot say whose "a" it ran: neither's
    assert hub.owners("w-2", ["b", "a"]) == {("t2", "job", "j")}
    assert hub.owners("w-3", ["a", "b"]) == set()  # holds nothing: names nothing
    hub._index(("t2", "job", "j"), frozenset())
    assert hub.owners("w-1", ["a"]) == {("t1", "job", "j")}
    assert hub.owners("w-2", ["b"]) == set()
