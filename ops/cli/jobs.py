"""``resontech submit``, ``jobs``, ``status``, ``why``, ``cancel``, ``watch``: a tenant's jobs (and, for
``status``, an endpoint of the same id). In the CLI a job view is read here only: :func:`job_line`,
:func:`job_detail` and the one-line answers of the commands.
"""

from __future__ import annotations

import argparse
import json

import msgspec

from gateway.client import ApiError
from ops.cli.endpoints import endpoint_detail
from ops.cli.session import UserCommand, client, read_spec, show
from schemas.api.feed import FeedMessage, FeedTelemetry
from schemas.api.jobs import Job, JobAssignment


def job_ref(ref: str) -> tuple[str, str | None]:
    """``JOB`` or (for the operator) ``TENANT/JOB`` -> ``(job_id, tenant)``."""
    tenant, sep, job_id = ref.partition("/")
    return (job_id, tenant) if sep else (ref, None)


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
        lines.append(f"  last checkpoint: {job.last_checkpoint.object_key}")
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


ENDED = {"job.completed": "completed", "job.failed": "failed", "job.cancelled": "cancelled"}
WATCHED_FIELDS = (
    *("round", "epoch", "step", "loss", "slot", "worker_id", "reason", "object_key", "train_epoch"),
    *("server", "first_round", "rounds"),  # federated jobs: the FL server, each FL run
)


def event_fields(message: FeedMessage) -> dict[str, object]:
    """The fields of a feed message's event (its stored event, as JSON)."""
    return message.event if isinstance(message.event, dict) else {}


def describe(message: FeedMessage) -> str:
    """One line for a feed event."""
    event = event_fields(message)
    stamp = (message.time or "")[11:19]
    if message.kind == "telemetry":
        gpus = msgspec.convert(event, FeedTelemetry).gpus
        utils = ", ".join(f"gpu{g.index} {g.util_pct or 0:.0f}%" for g in gpus) or "no GPU"
        return f"{stamp}  telemetry {message.worker}: {utils}"
    details = {k: v for k, v in event.items() if k in WATCHED_FIELDS and v not in (None, "")}
    metrics = event.get("metrics")
    if isinstance(metrics, dict):
        details.update(list(metrics.items())[:4])
    text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in details.items())
    return f"{stamp}  {message.kind.removeprefix('job.')}" + (f": {text}" if text else "")


def cmd_watch(args: argparse.Namespace) -> int:
    """Live progress of one job until it ends (or Ctrl-C)."""
    job_id, tenant = job_ref(args.job)
    with client(args) as rt:
        job = rt.job(job_id, tenant=tenant)
        if not args.json:
            print(f"job {job.job_id} ({job.spec.name}): {job.state}", flush=True)
        if job.state in ENDED.values():
            return 0 if job.state == "completed" else 1
        for message in rt.feed(job=job_id, tenant=tenant, after="jobs:0"):  # its history, then live
            if args.json:
                print(json.dumps(msgspec.to_builtins(message)), flush=True)
            else:
                print(describe(message), flush=True)
            ended = ENDED.get(message.kind)
            if ended == "failed" and event_fields(message).get("slot") is not None:
                ended = None  # one shard's failure: the kernel places it again, or fails the job
            if ended is not None:
                if not args.json:
                    print(f"job {job_id} {ended}", flush=True)
                return 0 if ended == "completed" else 1
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
        ("watch", cmd_watch, "follow a job live (progress, rounds, loss, checkpoints) until it ends"),
    ):
        p = user(name, handler, text)
        p.add_argument("job", help="the job id (operator: TENANT/JOB)")
