"""The kernel believes no agent: every attack of issue 11, with real enrolled-agent credentials.

A nats-server with accounts on, the real gateway, the sync of the server's agent users and the
intake (:mod:`tests.support.secured`); a coordinator and an honest agent process where work must really run.
The attacker, ``mallory``, is a provider's enrolled agent: it publishes with its own NATS user
whatever that user may publish, and tries what it may not. An attack is held when the job, the
endpoint, the registry, the ledger and the payouts are as if the forged claim had never been sent
(every projection rebuilt from the log hashes as it did before the attack), and the claim is in
QUARANTINE with its reason and its sender.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.enroll import enroll
from core.errors import ConfigError, InvalidInput
from core.log import Quarantined
from core.streams import (
    endpoint_subject,
    heartbeat_subject,
    intake_subject,
    job_subject,
    metering_subject,
    worker_subject,
)
from ops.cli.quarantine import show
from ops.services.intake import PROGRESS
from projections import ENDPOINTS, LEDGER, REGISTRY, SCHEDULE
from projections.runner import rebuild
from projections.schedule import job_key
from schemas._base import Event
from schemas.catalog import encode
from schemas.endpoints import (
    EndpointDeployed,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaStarting,
)
from schemas.envelope import Recorded
from schemas.jobs import (
    JobCheckpointed,
    JobCheckpointPartStored,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobProgress,
    JobRejected,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.values import Assignment, Provenance
from schemas.workers import (
    Heartbeat,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRegistered,
    WorkerUncordoned,
    WorkerVerified,
)
from tests.support import AgentProcess, coordinator, until
from tests.support.claims import (
    enroll_mallory,
    place_on,
    projection_hashes,
    quarantined,
    wait_for_state,
)
from tests.support.secured import Stack, raw_agent, violation

H100_HOURS_MS = 1_000 * 3_600_000


# -- an honest agent runs a tenant's job; mallory attacks it -----------------------------------------

WAIT_FOR_FLAG = """
import json, os, sys, time
print('RESONTECH_PROGRESS ' + json.dumps({"step": 1, "loss": 0.5}), flush=True)
while not os.path.exists("done"):  # in its own directory: the only place both it and the test see
    time.sleep(0.05)
"""


async def test_an_agent_cannot_fail_complete_reject_checkpoint_or_bill_another_workers_job(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    tenant, admin = await stack.tenant("victim")
    provider, provider_key = await stack.provider()
    await stack.enroll("honest", provider, provider_key)
    # its own credentials; one tick, at the end: a quiet ledger while it is attacked
    agent = enrolled_agents("honest", env={"RESONTECH_AGENT_METERING_INTERVAL_S": "600"})
    mallory = await enroll_mallory(stack)
    await mallory.register()
    async with coordinator(stack.log) as running:
        honest = await agent.worker_id()
        await wait_for_state(
            stack.log, REGISTRY, lambda s: (w := s.workers.get(honest)) and w.verified, "verified"
        )
        body = {
            "name": "train",
            "kind": "process",
            "shards": 1,
            "command": [sys.executable, "-c", WAIT_FOR_FLAG],
        }
        submitted = await stack.client.post(
            "/v1/jobs", json=body, headers={"Authorization": f"Bearer {admin}"}
        )
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job_id"]
        key = job_key(tenant, job_id)
        job = await wait_for_state(
            stack.log,
            SCHEDULE,
            lambda s: (j := s.jobs.get(key)) and j.state == "running" and j.progress and j,
            "running",
        )
        [held] = job.assignments.values()
        assert held.worker_id == honest
        flag = agent.work_dir / held.assignment_id / "done"
        await wait_for_state(
            stack.log,
            REGISTRY,
            lambda s: (w := s.workers.get(mallory.worker_id)) and w.challenge,
            "mallory challenged",
        )
        before = await projection_hashes(stack.log)
        a, epoch, slot = held.assignment_id, held.epoch, held.slot

        def on_job(event: Event) -> str:
            return job_subject(tenant, job_id, event)

        forged: list[tuple[str, Event]] = [
            # its failure fails the job; its completion completes it (it never ran it)
            (on_job(JobFailed), JobFailed(reason="oom", epoch=epoch, slot=slot, assignment_id=a)),
            (
                on_job(JobShardCompleted),
                JobShardCompleted(assignment_id=a, worker_id=honest, slot=slot, epoch=epoch),
            ),
            (
                on_job(JobShardCompleted),
                JobShardCompleted(assignment_id=a, worker_id=mallory.worker_id, slot=slot, epoch=epoch),
            ),
            # a job.completed stored on a subject agents may use
            (on_job(JobProgress), JobCompleted()),
            # a rejection in the honest worker's name bans it from the job
            (
                on_job(JobRejected),
                JobRejected(assignment_id=a, worker_id=honest, epoch=epoch, reason="policy"),
            ),
            # a checkpoint key the next epoch would be given a presigned GET of
            (
                on_job(JobCheckpointed),
                JobCheckpointed(epoch=epoch, slot=slot, assignment_id=a, object_key="datasets/secret.csv"),
            ),
            (on_job(JobProgress), JobProgress(epoch=epoch, slot=slot, assignment_id=a, loss=99.0)),
            # a job-wide failure, as the kernel would say it
            (on_job(JobFailed), JobFailed(reason="cancelled by the provider")),
            # 1,000 H100-hours at platinum for a tenant it never served, on its own meter
            (
                metering_subject(tenant, mallory.worker_id, a, UsageTick),
                UsageTick(
                    work_id=job_id,
                    work_kind="job",
                    assignment_id=a,
                    epoch=epoch,
                    provider=mallory.enrolled.provider,
                    gpu_type="H100",
                    pool="shared",
                    start_ms=0,
                    end_ms=1,
                    gpu_ms=H100_HOURS_MS,
                    tier="platinum",
                ),
            ),
        ]
        for subject, event in forged:
            await mallory.claim(subject, event)
        # its own registration, claiming the victim's private pool: the victim's private work would land on it
        await mallory.register(pool="private", owner_tenant=tenant)
        refused = await quarantined(stack.log, mallory.worker_id, len(forged) + 1)

        async with raw_agent(mallory.enrolled) as (nc, errors):  # what its user may not even publish
            for subject in (
                on_job(JobFailed),  # a stream the projections fold
                f"meter.{tenant}.{mallory.worker_id}.{a}.tick",
                worker_subject(honest, WorkerUncordoned),
                intake_subject(honest, on_job(JobFailed)),  # a claim under the honest worker's id
                intake_subject(mallory.worker_id, worker_subject(mallory.worker_id, WorkerUncordoned)),
                intake_subject(mallory.worker_id, f"meter.{tenant}.{honest}.{a}.tick"),
                intake_subject(mallory.worker_id, on_job(JobCompleted)),
                intake_subject(mallory.worker_id, worker_subject(honest, WorkerRegistered)),
            ):
                await nc.publish(subject, b"{}")
                await violation(errors, subject)

        assert await projection_hashes(stack.log) == before  # as if nothing had been sent
        reasons = [q.reason for q in refused]
        assert sum(f"belongs to worker {honest}, not {mallory.worker_id}" in r for r in reasons) == 7, reasons
        assert "a job.completed claim on" in reasons[3]
        assert "must name its slot and assignment" in reasons[7]
        assert "registers pool 'private', but its enrollment says 'shared'" in reasons[9]
        assert all(
            q.stream == "INTAKE" and q.subject.startswith(f"intake.{mallory.worker_id}.") for q in refused
        )
        assert running.conflicts >= 0

        flag.touch()  # the honest agent's job ends as it would have
        done = await wait_for_state(
            stack.log, SCHEDULE, lambda s: s.jobs[key].state == "completed" and s.jobs[key], "done"
        )
        assert done.rejected_by == {} and done.last_checkpoint is None and done.progress.loss == 0.5
    registry, _ = await rebuild(stack.log, REGISTRY)
    assert registry.workers[honest].state == "available" and not registry.workers[honest].cordoned
    assert registry.workers[mallory.worker_id].registration.pool == "shared"
    ledger, _ = await rebuild(stack.log, LEDGER)
    [line] = ledger.lines.values()  # the honest agent's usage alone
    assert (line.tenant, line.work_id, line.gpu_type, line.gpu_ms) == (tenant, job_id, "cpu", 0)
    assert 0 < line.cpu_ms < 60_000
    assert {p.provider for p in ledger.payouts.values()} == {provider}
    await mallory.log.close()


# -- mallory holds a tenant's work: what it may say about it, and what it may not -----------------------


async def test_usage_is_the_kernels_fact_and_over_claims_are_quarantined(stack: Stack) -> None:
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await mallory.register()
    me = mallory.worker_id
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    cpu_job, cpu, cpu_placed_ms = await place_on(stack.log, me, tenant)
    gpu_job, gpu, gpu_placed_ms = await place_on(stack.log, me, tenant, gpus=1)
    await wait_for_state(stack.log, SCHEDULE, lambda s: job_key(tenant, gpu_job) in s.jobs, "placed")

    def tick(job_id: str, a: Assignment, start: int, end: int, **usage: Any) -> tuple[str, UsageTick]:
        claimed = UsageTick(
            work_id=job_id,
            work_kind="job",
            assignment_id=a.assignment_id,
            epoch=1,
            start_ms=start,
            end_ms=end,
            provider="somebody-else",
            gpu_type="H100",
            pool="managed",
            tier="platinum",
            **usage,
        )
        return metering_subject(tenant, me, a.assignment_id, UsageTick), claimed

    other, _ = await stack.tenant("bystander")
    await asyncio.sleep(2.0)  # usage is claimed after it happened: the intervals below are in the past
    c, g = cpu_placed_ms + 10, gpu_placed_ms + 10
    honest = tick(cpu_job, cpu, c, c + 1_000, cpu_ms=1_000)
    await mallory.claim(*honest)
    ledger = await wait_for_state(stack.log, LEDGER, lambda s: s.lines and s, "the honest tick billed")
    [line] = ledger.lines.values()
    # billed as the kernel knows the work: its provider, CPU, the shared pool, unverified (paid nothing)
    assert (line.gpu_type, line.pool, line.cpu_ms, line.gpu_ms) == ("cpu", "shared", 1_000, 0)
    [payout] = ledger.payouts.values()
    assert (payout.provider, payout.tier, payout.payout_micros) == (
        mallory.enrolled.provider,
        "unverified",
        0,
    )
    before = await projection_hashes(stack.log)

    over = [
        tick(gpu_job, gpu, g, g + 1, gpu_ms=H100_HOURS_MS),  # 1,000 GPU-hours in a millisecond
        tick(gpu_job, gpu, g, g + 1_000, gpu_ms=2_000),  # two GPUs' worth on a one-GPU assignment
        tick(cpu_job, cpu, c + 500, c + 1_500, cpu_ms=1_000),  # overlaps what was billed
        tick(cpu_job, cpu, c - 600_000, c - 599_000, cpu_ms=1_000),  # before its placement
        tick(cpu_job, cpu, c + 3_600_000, c + 3_601_000, cpu_ms=1_000),  # in the future
        tick(cpu_job, cpu, c + 1_000, c + 1_500, gpu_ms=500),  # GPU time on CPU work
        tick(gpu_job, gpu, g, g + 1_000, gpu_ms=1_000, cpu_ms=1_000),  # CPU time on GPU work too
        tick(cpu_job, cpu, c + 1_500, c + 1_000, cpu_ms=0),  # reversed
    ]
    for subject, claimed in over:
        await mallory.claim(subject, claimed)
    # usage of its assignment, billed to another tenant
    wrong = msgspec.structs.replace(over[1][1], gpu_ms=1)
    await mallory.claim(metering_subject(other, me, gpu.assignment_id, UsageTick), wrong)
    refused = await quarantined(stack.log, me, len(over) + 1)
    assert await projection_hashes(stack.log) == before
    reasons = [q.reason for q in refused]
    assert "claims 3600000000 GPU-ms over 1 ms of an assignment holding 1 GPU(s)" in reasons[0]
    assert "claims 2000 GPU-ms over 1000 ms" in reasons[1]
    assert "overlaps usage already billed" in reasons[2]
    assert "before the assignment was placed" in reasons[3]
    assert "in the future" in reasons[4]
    assert "GPU time claimed for CPU work" in reasons[5]
    assert "CPU time claimed for GPU work" in reasons[6]
    assert "empty or reversed" in reasons[7]
    assert f"no assignment {gpu.assignment_id} of job {other}/" in reasons[8]
    await mallory.log.close()


async def test_reports_of_held_work_are_checked_too(stack: Stack) -> None:
    """Mallory holds the work: it may start it and report it, not point its checkpoints at the tenant's
    other objects, nor its replica at another host or at the kernel itself."""
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await mallory.register()
    me = mallory.worker_id
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    job_id, a, _ = await place_on(stack.log, me, tenant)
    deployed = EndpointDeployed(name="chat", model="m", max_replicas=2)
    await stack.log.append(endpoint_subject(tenant, "ep1", deployed), deployed)
    replica = Assignment(assignment_id="ep1-s0-e1", worker_id=me, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
    await stack.log.append(endpoint_subject(tenant, "ep1", placed), placed)
    await wait_for_state(
        stack.log,
        ENDPOINTS,
        lambda s: s.endpoints.get(f"{tenant}/ep1") and s.endpoints[f"{tenant}/ep1"].replicas,
        "placed",
    )

    def on_job(event: Event) -> str:
        return job_subject(tenant, job_id, event)

    def on_endpoint(event: Event) -> str:
        return endpoint_subject(tenant, "ep1", event)

    accepted: list[tuple[str, Event]] = [
        (on_job(JobStarted), JobStarted(assignment_id=a.assignment_id, worker_id=me, slot=0, epoch=1)),
        (
            on_job(JobCheckpointed),
            JobCheckpointed(
                epoch=1,
                slot=0,
                assignment_id=a.assignment_id,
                object_key=f"jobs/fine-tune/checkpoints/{job_id}/e1-0.ckpt",
            ),
        ),
        (
            on_endpoint(EndpointReplicaStarting),
            EndpointReplicaStarting(assignment_id="ep1-s0-e1", worker_id=me, epoch=1),
        ),
    ]
    for subject, event in accepted:
        await mallory.claim(subject, event)
    await wait_for_state(
        stack.log,
        SCHEDULE,
        lambda s: (j := s.jobs[job_key(tenant, job_id)]).last_checkpoint and j,
        "checkpoint",
    )
    await wait_for_state(
        stack.log,
        ENDPOINTS,
        lambda s: s.endpoints[f"{tenant}/ep1"].replicas["0"].state == "starting",
        "starting",
    )
    before = await projection_hashes(stack.log)
    nats_port = stack.server.url.rsplit(":", 1)[1]
    parts = f"jobs/fine-tune/checkpoints/{job_id}/e1-0/"
    refused_claims: list[tuple[str, Event]] = [
        (
            on_job(JobCheckpointed),
            JobCheckpointed(
                epoch=1, slot=0, assignment_id=a.assignment_id, object_key="datasets/private.csv"
            ),
        ),
        (
            on_job(JobCheckpointed),
            JobCheckpointed(
                epoch=1,
                slot=0,
                assignment_id=a.assignment_id,
                object_key=f"jobs/fine-tune/checkpoints/{job_id}/../../../datasets/x",
            ),
        ),
        (
            on_job(JobProgress),
            JobProgress(
                epoch=1, slot=0, assignment_id=a.assignment_id, metrics={f"m{i}": 1.0 for i in range(65)}
            ),
        ),
        (
            on_job(JobStarted),
            JobStarted(assignment_id=a.assignment_id, worker_id=me, slot=1, epoch=1),
        ),  # not its slot
        (
            on_job(JobStarted),
            JobStarted(assignment_id=a.assignment_id, worker_id=me, slot=0, epoch=2),
        ),  # not its epoch
        (
            on_endpoint(EndpointReplicaReady),
            EndpointReplicaReady(assignment_id="ep1-s0-e1", epoch=1, address="http://10.9.9.9:8000"),
        ),
        (
            on_endpoint(EndpointReplicaReady),
            EndpointReplicaReady(assignment_id="ep1-s0-e1", epoch=1, address=f"http://127.0.0.1:{nats_port}"),
        ),
        (
            on_endpoint(EndpointReplicaReady),
            EndpointReplicaReady(assignment_id="ep1-s0-e1", epoch=1, address="http://10.66.0.7:8000/v1?x=1"),
        ),
        (
            worker_subject(me, WorkerPolicySet),
            WorkerRegistered(provider="p", hostname="h"),
        ),  # not what it names
        (
            on_job(JobCheckpointed),
            JobCheckpointed(epoch=1, slot=0, assignment_id=a.assignment_id, object_key=parts, parts=[parts]),
        ),  # only the kernel says a sharded checkpoint is whole
        (
            on_job(JobCheckpointPartStored),
            JobCheckpointPartStored(
                epoch=1, slot=0, step=5, assignment_id=a.assignment_id, object_key=f"{parts}node-1.tar"
            ),
        ),  # another node's part: it would stand in for that node's shards
        (
            on_job(JobCheckpointPartStored),
            JobCheckpointPartStored(
                epoch=1, slot=0, step=5, assignment_id=a.assignment_id, object_key=f"{parts}x/node-0.tar"
            ),
        ),  # not one of its presigned keys
    ]
    for subject, event in refused_claims:
        await mallory.claim(subject, event)
    refused = await quarantined(stack.log, me, len(refused_claims))
    reasons = [q.reason for q in refused]
    assert "is not under the job's own jobs/fine-tune/checkpoints/" in reasons[0]
    assert "is not under the job's own" in reasons[1]
    assert "progress with 65 metrics" in reasons[2]
    assert "holds slot 0, not 1" in reasons[3]
    assert "is of epoch 1, not 2" in reasons[4]
    assert "is not on the worker's registered host" in reasons[5]
    assert "is not on the worker's registered host" in reasons[6]  # registered 10.66.0.7, not loopback
    assert "has more than a scheme, host and port" in reasons[7]
    assert "a worker.registered claim on" in reasons[8]
    assert "only the kernel names a sharded checkpoint's set of parts" in reasons[9]
    assert "is not one of node 0's own keys" in reasons[10]
    assert "is not one of node 0's own keys" in reasons[11]
    assert await projection_hashes(stack.log) == before
    # the honest form of the same claims is taken: a replica on its registered host
    ready = EndpointReplicaReady(assignment_id="ep1-s0-e1", epoch=1, address="http://10.66.0.7:8000")
    await mallory.claim(on_endpoint(ready), ready)
    table = await wait_for_state(
        stack.log, ENDPOINTS, lambda s: s.endpoints[f"{tenant}/ep1"].state == "serving" and s, "serving"
    )
    assert table.endpoints[f"{tenant}/ep1"].replicas["0"].address == "http://10.66.0.7:8000"
    await mallory.log.close()


async def test_a_replica_never_claims_a_kernel_service_as_its_address(stack: Stack) -> None:
    """Registered on the kernel's own host (as the dev stack's agents are), a replica still cannot
    name the kernel's NATS or object store as where it serves."""
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await mallory.register(address="127.0.0.1")
    me = mallory.worker_id
    deployed = EndpointDeployed(name="chat", model="m")
    await stack.log.append(endpoint_subject(tenant, "ep2", deployed), deployed)
    replica = Assignment(assignment_id="ep2-s0-e1", worker_id=me, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
    await stack.log.append(endpoint_subject(tenant, "ep2", placed), placed)
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    store = stack.log.settings.s3_endpoint
    for address in (stack.server.url.replace("nats://", "http://"), store):
        ready = EndpointReplicaReady(assignment_id="ep2-s0-e1", epoch=1, address=address)
        await mallory.claim(endpoint_subject(tenant, "ep2", ready), ready)
    refused = await quarantined(stack.log, me, 2)
    assert all("is one of the kernel's own services" in q.reason for q in refused), refused
    await mallory.log.close()


# -- identity is fixed at enrollment ---------------------------------------------------------------


async def test_identity_comes_from_the_enrollment_not_the_registration(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    me = mallory.worker_id
    for lie in (
        {"pool": "private", "owner_tenant": tenant},
        {"provider": "someone-else"},
        {"region": "us-east"},
        {"pool": "managed", "owner_tenant": tenant},
        {"sandbox": "kubernetes"},  # to be given work that names a container image, and run it bare
        {"topology": {"rack": "acme-gpus/r1"}},  # to read as another provider's rack, and join its gangs
    ):
        await mallory.register(**lie)
    refused = await quarantined(stack.log, me, 6)
    assert [q.reason.split(",")[0].split(" (")[0] for q in refused] == [
        "registers pool 'private'",
        "registers provider 'someone-else'",
        "registers region 'us-east'",
        "registers pool 'managed'",
        "sandbox 'kubernetes' is the kernel's own Kubernetes nodes'",
        "topology 'rack': 'acme-gpus/r1': a level is one of clique",
    ]
    registry, _ = await rebuild(stack.log, REGISTRY)
    assert me not in registry.workers  # nothing it said about itself was believed
    # the operator sees them, with who sent them and why; nobody else does
    page = await stack.client.get(
        "/v1/quarantine", params={"limit": 3}, headers={"Authorization": f"Bearer {stack.operator_key}"}
    )
    assert page.status_code == 200, page.text
    items = page.json()["items"]
    assert [i["sender"] for i in items] == [me] * 3 and page.json()["next_after"] == items[-1]["seq"]
    assert items[0]["stream"] == "INTAKE" and "registers pool 'private'" in items[0]["reason"]
    assert '"owner_tenant":"victim"' in items[0]["data"].replace(" ", "")
    assert await show(stack.log.settings, limit=4) == 0  # resontech quarantine
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("#1 ") and f"from {me}: registers pool 'private'" in lines[0]
    assert '"owner_tenant":"victim"' in lines[1]
    assert await show(stack.log.settings, limit=1, as_json=True) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["seq"], row["stream"], row["sender"]) == (1, "INTAKE", me)
    admin = (await stack.tenant())[1]
    assert (
        await stack.client.get("/v1/quarantine", headers={"Authorization": f"Bearer {admin}"})
    ).status_code == 403
    # and it is told: the intake sends a refused registration back as a command
    commands = [r.event async for r in stack.log.replay("COMMANDS")]
    assert any(type(c).__name__ == "RegistrationRefused" and "enrollment says" in c.reason for c in commands)
    # its honest registration is taken, with the identity of its token
    await mallory.register()
    registry = await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers and s, "registered")
    worker = registry.workers[me]
    registered = worker.registration
    assert (registered.provider, registered.pool, registered.owner_tenant, registered.region) == (
        mallory.enrolled.provider,
        "shared",
        None,
        "eu-north",
    )
    assert worker.state == "unverified" and not worker.verified  # no tenant work until it passes
    await mallory.log.close()


async def test_an_unenrolled_worker_id_and_a_revoked_agent_are_not_believed(stack: Stack) -> None:
    provider, key = await stack.provider()
    enrolled, state_dir = await stack.enroll("gone", provider, key)
    own = await stack.as_agent(enrolled, state_dir)
    response = await stack.client.delete(
        f"/v1/providers/{provider}/agents/{enrolled.worker_id}", headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 204
    await stack.synced()
    # the kernel itself cannot be made to register what no enrollment vouches for
    claim = WorkerRegistered(provider=provider, hostname="h", region="eu-north")
    await stack.log.append(intake_subject("w-000000000000", worker_subject("w-000000000000", claim)), claim)
    await stack.log.append(
        intake_subject(enrolled.worker_id, worker_subject(enrolled.worker_id, claim)), claim
    )
    for sender in ("w-000000000000", enrolled.worker_id):
        [refused] = await quarantined(stack.log, sender, 1)
        assert "is not enrolled (or its credentials were revoked)" in refused.reason
    with pytest.raises(Exception):  # noqa: B017  (the server disconnects and refuses revoked credentials)
        await own.append(heartbeat_subject(enrolled.worker_id), Heartbeat(interval_s=1.0))
    await own.close()
    # refused, the connection was reconnecting: closing the log closes it, or nats-py would go on
    # trying forever (a test's event loop then never finished cancelling it)
    assert own._nc.is_closed


async def test_a_provider_cannot_enroll_a_host_into_a_tenants_private_pool(stack: Stack) -> None:
    """Nor learn whether a tenant id exists: the answer is the same for a tenant that does not."""
    tenant, admin = await stack.tenant("victim")
    provider, key = await stack.provider()
    answers = []
    for owner in (tenant, "no-such-tenant"):
        response = await stack.post(
            f"/v1/providers/{provider}/enrollment-tokens", key, {"pool": "private", "owner_tenant": owner}
        )
        assert response.status_code == 201, response.text
        answers.append(response.json())
    assert [a["status"] for a in answers] == ["pending_approval", "pending_approval"]
    with pytest.raises(ConfigError, match=r"enrollment refused \(403\)"):
        await enroll(stack.client, answers[0]["token"], stack.root / "sneaky")
    assert (
        await stack.post(
            f"/v1/tenants/{tenant}/enrollment-requests/{answers[0]['token_id']}/approve", key, {}
        )
    ).status_code in (403, 404)
    approved = await stack.post(
        f"/v1/tenants/{tenant}/enrollment-requests/{answers[0]['token_id']}/approve", admin, {}
    )
    assert approved.status_code == 200, approved.text
    enrolled = await enroll(stack.client, answers[0]["token"], stack.root / "consented")
    assert (enrolled.pool, enrolled.owner_tenant) == ("private", tenant)


# -- every stored event's type matches its subject -------------------------------------------------


async def test_a_stored_event_whose_type_its_subject_does_not_name_is_quarantined_on_every_read(
    stack: Stack,
) -> None:
    """What an agent could store before the intake existed (a ``job.completed`` on a progress subject)
    is refused by appends through the log, and quarantined by every reader of a log that holds it: a
    replay gives the same state with it and without it."""
    log = stack.log
    job = JobSubmitted(name="train", kind="process", shards=1, command=["x"])
    await log.append(job_subject("victim", "j1", job), job)
    a = Assignment(assignment_id="j1-s0-e1", worker_id="w-1", slot=0, epoch=1)
    placed = JobPlaced(assignments=[a], provenance=Provenance(candidates=1))
    await log.append(job_subject("victim", "j1", placed), placed)
    without = await projection_hashes(log, stored=False)
    with pytest.raises(InvalidInput, match=r"names a progress event, not job\.completed"):
        await log.append(job_subject("victim", "j1", JobProgress), JobCompleted())
    forged = [
        (job_subject("victim", "j1", JobProgress), JobCompleted()),
        (job_subject("victim", "j1", JobStarted), JobSubmitted(name="x", kind="process", shards=9)),
        (worker_subject("w-1", WorkerRegistered), WorkerUncordoned(by="me")),
        (
            f"meter.victim.w-1.{a.assignment_id}.tokens",
            UsageTick(
                work_id="j1", work_kind="job", assignment_id="a", epoch=1, start_ms=1, end_ms=2, gpu_ms=10**12
            ),
        ),
    ]
    for subject, event in forged:
        await log.publish_raw(subject, encode(event))  # as a pre-intake writer could have
    assert await projection_hashes(log, stored=False) == without  # the same state, with them in the log
    held = [q for q in await log.quarantined(limit=100) if not q.sender]
    assert len(held) == len(forged) and all(
        "names a" in q.reason or "does not belong" in q.reason for q in held
    )
    schedule, _ = await rebuild(log, SCHEDULE)
    assert schedule.jobs["victim/j1"].state == "placed"


async def test_kernel_services_appending_directly_still_work(stack: Stack) -> None:
    """The honest path is unaffected: the kernel's own appends are checked and stored as before."""
    registered = WorkerRegistered(provider="p", hostname="h")
    await stack.log.append(worker_subject("w-k", registered), registered)
    await stack.log.append(worker_subject("w-k", WorkerVerified), WorkerVerified(by="operator"))
    policy = WorkerPolicySet(policy=WorkerPolicy(max_concurrent=1))
    await stack.log.append(worker_subject("w-k", policy), policy)
    registry = await wait_for_state(stack.log, REGISTRY, lambda s: "w-k" in s.workers and s, "registered")
    assert registry.workers["w-k"].state == "available"


async def test_a_flood_of_progress_reports_is_capped(stack: Stack) -> None:
    """An agent (or its workload, through it) sending a progress report per printed line: the intake
    takes a burst, then five a second per assignment (an honest agent sends at most one)."""
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await mallory.register()
    me = mallory.worker_id
    await wait_for_state(stack.log, REGISTRY, lambda s: me in s.workers, "registered")
    job_id, a, _ = await place_on(stack.log, me, tenant)
    await wait_for_state(stack.log, SCHEDULE, lambda s: job_key(tenant, job_id) in s.jobs, "placed")
    flood = 200
    began = time.monotonic()
    for step in range(flood):
        progress = JobProgress(epoch=1, slot=0, assignment_id=a.assignment_id, step=step)
        await mallory.claim(job_subject(tenant, job_id, progress), progress)
    # Each claim is stored before the next is sent, so their store times span at most this long; a
    # slow machine spreads the flood out and earns it more refills (the budget is by store time).
    sending_s = time.monotonic() - began
    await until(
        lambda: stack.intake.accepted + stack.intake.refused >= flood + 1, "every claim judged"
    )  # and the registration
    stored: list[Recorded[Any]] = []
    refused: list[Quarantined] = []

    async def all_settled() -> bool:  # a judged claim's append or quarantine may still be in flight
        nonlocal stored, refused
        stored = [r async for r in stack.log.replay("JOBS", subjects=f"job.{tenant}.{job_id}.progress")]
        refused = [q for q in await stack.log.quarantined(limit=10_000) if q.sender == me]
        return len(stored) + len(refused) >= flood

    for _ in range(200):
        if await all_settled():
            break
        await asyncio.sleep(0.1)
    assert len(stored) + len(refused) == flood
    assert PROGRESS.burst <= len(stored) <= PROGRESS.burst + PROGRESS.per_s * sending_s + 1
    assert all("more than 5 progress reports a second" in q.reason for q in refused)
    await mallory.log.close()
