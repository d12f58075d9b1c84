"""Every id is the kernel's, scoped by tenant: ids two parties may both choose never meet.

With real credentials (:mod:`tests.support.secured`: a nats-server with accounts on, the real gateway, the
intake, and a real enrolled agent process where work must run), two tenants use the same job id on
the same worker, and providers enroll the ids the kernel keeps for itself or another provider holds.
Tenants and providers choose their job, endpoint and worker ids; every key the kernel acts on
(assignment ids, command and dedupe ids, the agent's epochs, work directories, meter keys) is the
kernel's own, unique across tenants and kinds, so neither can reach the other's work.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.commands import admit, stops
from agent.running import Assignments, Preparing
from agent.state import CommandState
from core.errors import EnrollmentRefused
from core.placement.placing import assignment_id, parse_assignment_id, place, work_ref
from core.placement.values import Candidate, Placed
from core.streams import assignment_token, provider_subject
from gateway.token_meter import TokenMeter
from ops.dispatcher.fleet import worker_id_for
from ops.dispatcher.names import is_dns_label, is_label_value
from ops.enrollment import enroll_kernel_agent
from projections import LEDGER, LIVENESS, PROVIDERS, REGISTRY, SCHEDULE
from projections.admission import request_for_endpoint
from projections.base import Projection
from projections.endpoints import EndpointRecord, ReplicaRecord
from projections.providers import active_agents, enrollment_of
from projections.runner import rebuild
from projections.schedule import job_key
from schemas.commands import StartWork, StopWork, WorkSpec
from schemas.endpoints import EndpointDeployed
from schemas.providers import AgentEnrolled, EnrollmentTokenIssued
from schemas.values import WorkKind
from tests.support import AgentProcess, coordinator
from tests.support.claims import projection_hashes
from tests.support.reducer_builders import Log, S
from tests.support.secured import Stack

WAIT_FOR_FLAG = """
import json, os, time
print('RESONTECH_PROGRESS ' + json.dumps({"step": 1, "loss": 0.5}), flush=True)
while not os.path.exists("done"):  # in its own directory: the only place both it and the test see
    time.sleep(0.05)
"""


async def wait_for(
    stack: Stack, projection: Projection[Any], predicate: Callable[[Any], Any], what: str, tries: int = 300
) -> Any:
    """The state of ``projection`` rebuilt from the log, once ``predicate`` holds for it."""
    for _ in range(tries):
        state, _ = await rebuild(stack.log, projection)
        if found := predicate(state):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def submit(stack: Stack, key: str, job_id: str) -> None:
    body = {
        "name": "train",
        "job_id": job_id,
        "kind": "process",
        "shards": 1,
        "command": [sys.executable, "-c", WAIT_FOR_FLAG],
    }
    response = await stack.client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 201, response.text


def running(tenant: str, job_id: str) -> Callable[[Any], Any]:
    def check(state: Any) -> Any:
        job = state.jobs.get(job_key(tenant, job_id))
        return job is not None and job.state == "running" and job.progress is not None and job

    return check


async def honest_worker(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> tuple[AgentProcess, str]:
    """A real agent process enrolled by a provider, verified: the one worker both tenants' work lands on."""
    provider, provider_key = await stack.provider()
    await stack.enroll("honest", provider, provider_key)
    agent = enrolled_agents("honest", env={"RESONTECH_AGENT_METERING_INTERVAL_S": "600"})
    honest = await agent.worker_id()
    await wait_for(stack, REGISTRY, lambda s: (w := s.workers.get(honest)) and w.verified, "verified")
    return agent, honest


def beating(worker_id: str, running: list[str]) -> Callable[[Any], Any]:
    """Whether ``worker_id``'s latest heartbeat says it runs exactly ``running``."""
    return lambda s: (b := s.beats.get(worker_id)) is not None and sorted(b.running) == sorted(running)


async def test_cancelling_a_job_under_another_tenants_job_id_stops_only_its_own_shard(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> None:
    victim, victim_key = await stack.tenant("victim")
    attacker, attacker_key = await stack.tenant("attacker")
    async with coordinator(stack.log):
        agent, honest = await honest_worker(stack, enrolled_agents)
        await submit(stack, victim_key, "shared-id")
        theirs = await wait_for(stack, SCHEDULE, running(victim, "shared-id"), "the victim's job running")
        [held] = theirs.assignments.values()
        # the attacker's job under the same id, placed on the same worker, then cancelled
        await submit(stack, attacker_key, "shared-id")
        mine = await wait_for(
            stack,
            SCHEDULE,
            lambda s: (j := s.jobs.get(job_key(attacker, "shared-id"))) and j.state != "queued" and j,
            "the attacker's job placed",
        )
        [own] = mine.assignments.values()
        assert own.worker_id == honest
        cancelled = await stack.client.post(
            "/v1/jobs/shared-id/cancel", headers={"Authorization": f"Bearer {attacker_key}"}
        )
        assert cancelled.status_code in (200, 202), cancelled.text
        await wait_for(stack, LIVENESS, beating(honest, [held.assignment_id]), "the victim's shard alone")
        # the victim's shard ran on, untouched: it ends when the victim's own workload says so
        (agent.work_dir / held.assignment_id / "done").touch()
        done = await wait_for(
            stack,
            SCHEDULE,
            lambda s: (j := s.jobs[job_key(victim, "shared-id")]).state == "completed" and j,
            "the victim's job completed",
        )
    assert done.failures == 0 and done.revocations == 0 and done.epoch == 1
    assert done.assignments[str(held.slot)] == held
    schedule, _ = await rebuild(stack.log, SCHEDULE)
    assert schedule.jobs[job_key(attacker, "shared-id")].state == "cancelled"
    assert own.assignment_id != held.assignment_id


async def test_a_job_id_another_tenant_runs_does_not_keep_a_later_job_from_starting(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> None:
    victim, victim_key = await stack.tenant("victim")
    attacker, attacker_key = await stack.tenant("attacker")
    async with coordinator(stack.log):
        agent, honest = await honest_worker(stack, enrolled_agents)
        # the attacker runs job id X first; the victim's later job X must start all the same (it used
        # to stay `placed` forever: the coordinator, and JetStream's dedupe of `start-<assignment>`,
        # remembered the attacker's start under the same key)
        await submit(stack, attacker_key, "popular")
        mine = await wait_for(stack, SCHEDULE, running(attacker, "popular"), "the attacker's job running")
        await submit(stack, victim_key, "popular")
        theirs = await wait_for(stack, SCHEDULE, running(victim, "popular"), "the victim's job running")
        [own], [held] = mine.assignments.values(), theirs.assignments.values()
        assert own.worker_id == held.worker_id == honest and own.assignment_id != held.assignment_id
        await wait_for(stack, LIVENESS, beating(honest, [own.assignment_id, held.assignment_id]), "both run")
        for a in (own, held):
            (agent.work_dir / a.assignment_id / "done").touch()
        for tenant in (attacker, victim):
            key = job_key(tenant, "popular")
            await wait_for(stack, SCHEDULE, lambda s, k=key: s.jobs[k].state == "completed", "done")


# -- worker ids: the kernel's own namespace, and one provider's id never another's -----------------------


async def enroll_as(stack: Stack, token: str, worker_id: str) -> Any:
    """A provider's agent presenting ``token`` to enroll ``worker_id``."""
    body = {"token": token, "worker_id": worker_id, "hostname": "attacker-host"}
    return await stack.client.post("/v1/agents/enroll", json=body)


async def test_a_provider_cannot_enroll_the_id_the_dispatcher_gives_a_node(stack: Stack) -> None:
    provider, key = await stack.provider()
    owner, _ = await stack.tenant("owner")
    token = await stack.token(provider, key, region="eu-north")
    before = await projection_hashes(stack.log)
    reserved = [worker_id_for("prod", "gpu-node-1"), worker_id_for("prod", "GPU.node_2")]
    for node_id in [*reserved, "KERNEL-prod-gpu-node-1"]:  # in any case
        refused = await enroll_as(stack, token, node_id)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "worker_reserved", refused.text
    assert await projection_hashes(stack.log) == before  # nothing stored, the token still unused
    # the dispatcher's own enrollment of the node then holds it, as the operator's managed capacity
    node_id = worker_id_for("prod", "gpu-node-1")
    await enroll_kernel_agent(
        stack.log, node_id, provider="operator-prod", pool="managed", owner_tenant=owner, by="dispatcher prod"
    )
    providers, _ = await rebuild(stack.log, PROVIDERS)
    enrollment = enrollment_of(providers, node_id)
    assert enrollment is not None and (enrollment.provider, enrollment.pool) == ("operator-prod", "managed")
    assert [a.worker_id for a in active_agents(providers) if a.nats_user] == []  # no NATS user for it


async def test_an_id_another_provider_holds_is_never_enrolled_again(stack: Stack) -> None:
    first, first_key = await stack.provider()
    second, second_key = await stack.provider()
    enrolled = await enroll_as(stack, await stack.token(first, first_key), "w-0123456789ab")
    assert enrolled.status_code == 201, enrolled.text
    token = await stack.token(second, second_key)
    before = await projection_hashes(stack.log)
    # another provider through the gateway, and the kernel's own enrollment of the same id: refused
    taken = await enroll_as(stack, token, "w-0123456789ab")
    assert taken.status_code == 409, taken.text
    with pytest.raises(EnrollmentRefused, match="already enrolled by another provider"):
        await enroll_kernel_agent(stack.log, "w-0123456789ab", provider="operator-prod", pool="managed")
    assert await projection_hashes(stack.log) == before  # nothing stored
    # a second enrollment stored anyway (two gateways racing, an old log) changes nobody's identity
    issued = EnrollmentTokenIssued(token_id="kraced", token_sha256="0" * 64, expires_ns=2**62, issued_by="x")
    raced = AgentEnrolled(token_id="kraced", worker_id="w-0123456789ab", nats_user="agent-w-0123456789ab")
    for event in (issued, raced):
        await stack.log.append(provider_subject(second, event), event)
    providers, _ = await rebuild(stack.log, PROVIDERS)
    enrollment = enrollment_of(providers, "w-0123456789ab")
    assert enrollment is not None and (enrollment.provider, enrollment.pool) == (first, "shared")
    assert [a.worker_id for a in active_agents(providers)] == ["w-0123456789ab"]
    assert "w-0123456789ab" not in providers.providers[second].agents


# -- the keys themselves: assignment ids, meters and the agent's memory, across tenants and kinds ------


def test_assignment_ids_are_unique_across_tenants_and_kinds_and_fit_every_name() -> None:
    works = [
        ("victim", "job", "x"),
        ("attacker", "job", "x"),
        ("victim", "endpoint", "x"),
        ("a-b", "job", "c"),
    ]
    works.append(("a", "job", "b-c"))  # `-` joins tenants and ids ambiguously: never the same id
    ids = {assignment_id(w, 0, 1, tenant=t, kind=k) for t, k, w in works}
    assert len(ids) == len(works)
    longest = assignment_id("J" * 64, 999_999, 2**40, tenant="t" * 40, kind="endpoint")
    assert assignment_token(longest) == longest and is_label_value(longest) and is_dns_label(longest)
    assert parse_assignment_id(longest) == (work_ref("t" * 40, "endpoint", "J" * 64), 999_999, 2**40)
    assert parse_assignment_id("j1-s0-e1") == ("j1", 0, 1)  # an id stored before still reads


def _endpoint(tenant: str, endpoint_id: str) -> EndpointRecord:
    spec = EndpointDeployed(name=endpoint_id, model="m", min_replicas=1, max_replicas=1)
    return EndpointRecord(tenant=tenant, endpoint_id=endpoint_id, spec=spec)


def test_two_tenants_endpoints_of_one_id_each_meter_their_own_tokens() -> None:
    worker = Candidate(worker_id="w1", gpus_total=0, cpus=8, tier="gold", last_beat_ns=0)
    meter, replicas = TokenMeter(), {}
    for tenant, tokens in (("victim", 5), ("attacker", 1_000_000)):
        endpoint = _endpoint(tenant, "chat")
        decision = place(request_for_endpoint(endpoint, slots=[0]), [worker], now_ns=0)
        assert isinstance(decision, Placed)
        [a] = decision.assignments
        replica = ReplicaRecord(
            assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch, gpus=a.gpus
        )
        replicas[tenant] = replica
        meter.add(endpoint, replica, tokens)
    assert replicas["victim"].assignment_id != replicas["attacker"].assignment_id
    ledger = Log(LEDGER)
    for subject, tick, _ in meter.cut({}, now_ns=10 * S):
        ledger(subject, tick, 10.0)
    served = {line.tenant: line.tokens for line in ledger.state.lines.values()}
    assert served == {"victim": 5, "attacker": 1_000_000}


def _start(tenant: str, work_id: str, epoch: int, *, kind: WorkKind = "job", slot: int = 0) -> StartWork:
    a = assignment_id(work_id, slot, epoch, tenant=tenant, kind=kind)
    return StartWork(
        tenant=tenant,
        work_id=work_id,
        work_kind=kind,
        assignment_id=a,
        slot=slot,
        epoch=epoch,
        spec=WorkSpec(runtime="process"),
    )


def _stop(start: StartWork, **fields: Any) -> StopWork:
    said: dict[str, Any] = {"tenant": start.tenant, "work_kind": start.work_kind, **fields}
    return StopWork(
        work_id=start.work_id,
        assignment_id=start.assignment_id,
        epoch=start.epoch,
        reason="cancelled",
        **said,
    )


def test_an_agent_keeps_each_tenants_epochs_and_stops_apart(tmp_path: Path) -> None:
    state = CommandState.load(tmp_path)
    theirs = _start("attacker", "x", 5)
    assert admit(state, "c1", theirs, here=None) == "run"
    # the victim's job x at epoch 1 is not stale for the attacker's epoch 5, nor is its endpoint x
    mine = _start("victim", "x", 1)
    assert admit(state, "c2", mine, here=None) == "run"
    assert admit(state, "c3", _start("victim", "x", 1, kind="endpoint"), here=None) == "run"
    assert admit(state, "c4", _start("attacker", "x", 4), here=None) == "stale"  # its own older one is
    # a stop names its tenant and kind: it stops only the workload of that very work
    assert stops(_stop(mine), mine)
    assert not stops(_stop(mine, tenant="attacker"), mine)
    assert not stops(_stop(mine, work_kind="endpoint"), mine)
    assert not stops(_stop(theirs), mine)
    assert stops(_stop(mine, tenant="", work_kind=""), mine)  # a stop sent before stops named them
    # a newer epoch of one tenant's work supersedes nothing of another's
    running = Assignments([])
    running.preparing[mine.assignment_id] = Preparing(mine, [], 0)
    assert running.superseded_by(_start("attacker", "x", 2)) == []
    assert [p.cmd for p in running.superseded_by(_start("victim", "x", 2))] == [mine]
