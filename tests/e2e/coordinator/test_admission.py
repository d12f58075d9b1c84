"""Quotas, preemption and rejection through the coordinator, with real agent processes.

The agents use the explicitly selected simulated GPU source (``--devices simulated``): this machine
has no GPU, and GPU quotas and preemption need GPUs to count. Everything else is real: the agents
run the workloads as processes, the coordinator decides, the log arbitrates.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core.log import EventLog
from core.streams import job_subject, tenant_subject
from schemas.commands import StopWork
from schemas.jobs import JobAssignmentRevoked, JobFailed, JobPlaced, JobQueued, JobResources, JobSubmitted
from schemas.tenants import QuotaSet, TenantCreated
from tests.support import AgentProcess, coordinator, of, records, registered, wait_records


def gpu_agent(agents: Callable[..., AgentProcess], name: str, gpus: int, *extra: str) -> AgentProcess:
    """A real agent whose GPUs come from the explicitly selected simulated source."""
    return agents(name, "--devices", "simulated", *extra, env={"RESONTECH_AGENT_SIMULATED_GPUS": str(gpus)})


async def submit_gpu_job(
    log: EventLog, tenant: str, job_id: str, *, pool: str = "shared", priority: int = 0
) -> None:
    event = JobSubmitted(
        name=job_id,
        kind="process",
        shards=1,
        pool=pool,  # type: ignore[arg-type]
        priority=priority,
        command=["sleep", "60"],
        resources=JobResources(gpus=1, vram_mb=1000),
    )
    await log.append(job_subject(tenant, job_id, event), event)


async def test_a_tenant_over_its_gpu_quota_waits_with_the_reason(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    await registered(log, gpu_agent(agents, "quota", 4))
    await log.append(
        tenant_subject("acme", TenantCreated), TenantCreated(display_name="Acme", bucket="rt-acme")
    )
    await log.append(tenant_subject("acme", QuotaSet), QuotaSet(pool="shared", gpus=2))
    async with coordinator(log):
        for n in range(3):
            await submit_gpu_job(log, "acme", f"q{n}")
        jobs = await wait_records(
            log,
            "JOBS",
            lambda rs: len(of(rs, JobPlaced)) == 2 and of(rs, JobQueued),
            "two placed, one queued",
        )
    [queued] = of(jobs, JobQueued)
    assert "quota" in queued.reason
    assert not [r for r in jobs if r.subject == "job.acme.q2.placed"]


async def test_managed_work_preempts_shared_work_on_its_reserved_hardware(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    # globex's reserved worker, lent to the shared pool while globex does not need it
    policy = tmp_path / "lend.yaml"
    policy.write_text("allowed_pools: [shared, managed]\n")
    reserved = gpu_agent(
        agents, "reserved", 1, "--pool", "managed", "--owner-tenant", "globex", "--policy", str(policy)
    )
    worker_id = await registered(log, reserved)
    async with coordinator(log):
        await submit_gpu_job(log, "acme", "borrower")
        await wait_records(
            log, "JOBS", lambda rs: any(r.subject == "job.acme.borrower.started" for r in rs), "started"
        )
        await submit_gpu_job(log, "globex", "owner", pool="managed")
        jobs = await wait_records(
            log,
            "JOBS",
            lambda rs: any(r.subject == "job.globex.owner.placed" for r in rs),
            "the owner's job placed",
        )
    [revoked] = of(jobs, JobAssignmentRevoked)
    assert revoked.worker_id == worker_id and "preempted" in revoked.reason
    stops = of(await records(log, "COMMANDS"), StopWork)
    assert all(stop.checkpoint for stop in stops)
    assert not of(jobs, JobFailed)


async def test_a_job_that_can_never_fit_is_rejected_with_the_reason(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    await registered(log, gpu_agent(agents, "small", 1))
    async with coordinator(log):
        event = JobSubmitted(name="huge", kind="process", shards=3, resources=JobResources(gpus=8))
        await log.append(job_subject("acme", "huge", event), event)
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobFailed), "job.failed")
    [failed] = of(jobs, JobFailed)
    assert failed.reason.startswith("rejected:") and not failed.retryable
