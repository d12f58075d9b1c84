"""``resontech submit``, ``jobs``, ``status``, ``why``, ``cancel``, ``watch``: a tenant's jobs (and, for
``status``, an endpoint of the same id). In the CLI a job view is read here only: :func:`job_line`,
:func:`job_detail` and the one-line answers of the commands; ``watch`` follows the feed in
:mod:`ops.cli.watch`.
"""

from __future__ import annotations

import argparse

import msgspec

from gateway.client import ApiError
from ops.cli.endpoints import endpoint_detail
from ops.cli.session import UserCommand, client, job_ref, show
from ops.cli.watch import cmd_watch
from ops.specs import read_spec
from schemas.api.jobs import Job, JobAssignment


def job_line(job: Job) -> str:
    progress = ""
    if job.progress is not None:
        parts = [
            f"{name} {value}"
            for name, value in msgspec.to_builtins(job.progress).items()
            if value not in (None, {})
        ]
        progress = "  " + ", ".join(parts[:4])
    spec = job.spec
    return f"{job.job_id:<28} {spec.name:<20} {spec.kind:<9} {job.state:<10} {spec.shards} shard(s){progress}"


def shard_state(job: Job, a: JobAssignment) -> str:
    """``done``, ``stopped`` (its job ended otherwise: the kernel stopped it), ``running`` or ``placed``."""
    if a.done:
        return "done"
    if job.state in ("failed", "cancelled"):
        return "stopped"
    return "running" if a.started else "placed"


def job_detail(job: Job) -> str:
    lines = [
        f"job {job.job_id} ({job.spec.name}, {job.spec.kind}) of {job.tenant}: {job.state}",
        f"  submitted {job.submitted_at} by {job.spec.submitted_by}"
        + (f", ended {job.ended_at}" if job.ended_at else ""),
    ]
    for a in job.assignments:
        state = shard_state(job, a)
        lines.append(f"  shard {a.slot}: {state} on {a.worker_id} (epoch {a.epoch})")
    if job.progress is not None:
        values = {k: v for k, v in msgspec.to_builtins(job.progress).items() if v not in (None, {})}
        lines.append("  progress: " + ", ".join(f"{k} {v}" for k, v in values.items()))
    if job.last_checkpoint is not None:
        c = job.last_checkpoint
        whole = f" ({len(c.parts)} parts, step {c.step})" if c.parts else ""
        lines.append(f"  last checkpoint: {c.object_key}{whole}")
    if job.failure_reason:
        lines.append(f"  failed: {job.failure_reason}")
    if job.log_tail:
        lines += ["  log tail:", *(f"    {line}" for line in job.log_tail.splitlines()[-20:])]
    if job.why:
        lines += ["  why:", *(f"    {line}" for line in job.why)]
    return "\n".join(lines)


def cmd_submit(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    with client(args) as rt:
        job = rt.submit_job(spec, idempotency_key=args.idempotency_key)
    show(args, job, lambda j: f"submitted {j.job_id} ({j.state}); follow it with: resontech watch {j.job_id}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.jobs(state=args.state, kind=args.kind, name_prefix=args.name, limit=args.limit)
    show(args, page.items, lambda jobs: "\n".join(job_line(j) for j in jobs) or "(no jobs)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """A job, or else the endpoint of that id (ids are unique per tenant within each kind)."""
    ref, tenant = job_ref(args.job)
    with client(args) as rt:
        try:
            show(args, rt.job(ref, tenant=tenant), job_detail)
        except ApiError as exc:
            if exc.status != 404:
                raise
            try:
                endpoint = rt.endpoint(ref, tenant=tenant)
            except ApiError as missing:
                if missing.status != 404:
                    raise
                raise SystemExit(f"error: no job or endpoint {args.job}") from None
            show(args, endpoint, endpoint_detail)
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    job_id, tenant = job_ref(args.job)
    with client(args) as rt:
        job = rt.job(job_id, tenant=tenant)
    lines = job.why or []
    show(args, {"job": job.job_id, "state": job.state, "lines": lines}, lambda _: "\n".join(lines))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job_id, tenant = job_ref(args.job)
    with client(args) as rt:
        job = rt.cancel_job(job_id, tenant=tenant)
    show(args, job, lambda j: f"{j.job_id}: {j.state}")
    return 0


def register(user: UserCommand) -> None:
    """Add ``submit``, ``jobs``, ``status``, ``why``, ``cancel`` and ``watch``."""
    p = user("submit", cmd_submit, "submit a job from a YAML, TOML or JSON spec file")
    p.add_argument("spec", help="the job spec file (fields of POST /v1/jobs)")
    p.add_argument("--idempotency-key", help="retrying with the same key submits once")
    p = user("jobs", cmd_jobs, "list your jobs, newest first")
    p.add_argument("--state", choices=["queued", "placed", "running", "completed", "failed", "cancelled"])
    p.add_argument("--kind", choices=["process", "federated", "ddp"])
    p.add_argument("--name", help="only jobs whose name starts with this")
    p.add_argument("--limit", type=int, default=50)
    p = user(
        "status",
        cmd_status,
        "a job's state, shards, progress, checkpoint and log tail; or an "
        "endpoint's state, replicas and traffic",
    )
    p.add_argument("job", metavar="ID", help="a job or endpoint id (operator: TENANT/ID)")
    for name, handler, text in (
        ("why", cmd_why, "why a job is pending, or why it runs where it runs"),
        ("cancel", cmd_cancel, "cancel a job (running shards checkpoint and stop)"),
    ):
        p = user(name, handler, text)
        p.add_argument("job", help="the job id (operator: TENANT/JOB)")
    p = user(
        "watch",
        cmd_watch,
        "follow a job live (progress, rounds, loss, checkpoints) until it ends, its loss (or "
        "--metric) drawn as a sparkline",
    )
    p.add_argument("job", help="the job id (operator: TENANT/JOB)")
    p.add_argument(
        "--metric",
        default="loss",
        help="the metric to draw: loss, gpu_util_pct or a key of the job's progress metrics "
        "(default: loss); --json draws none",
    )
