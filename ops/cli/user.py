"""The user-facing commands of ``resontech``: they talk to the gateway through the SDK
(:mod:`gateway.client`), never to NATS. ``login`` remembers the gateway URL and key; every command
takes ``--url`` and ``--key`` to override, then ``RESONTECH_GATEWAY_URL`` / ``RESONTECH_API_KEY``, then
what ``login`` stored, then the dev stack's ``dev.env``.

Output is a short human summary, or with ``--json`` the API's own JSON. Errors are one line.

Over 500 lines on purpose: one short handler per command (an SDK call and how to print its answer)
beside the parser that registers them all; split by resource, the shared options and printing would
be scattered for no gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from core.files import write_private
from core.settings import read_env_file
from gateway.client import CREDENTIALS, ApiError, Client, Progress
from schemas.api.billing import Usage
from schemas.api.endpoints import Endpoint, Traffic
from schemas.api.feed import FeedMessage, FeedTelemetry
from schemas.api.jobs import Job
from schemas.api.workers import Worker

Command = Callable[[argparse.Namespace], int]
T = TypeVar("T")


def _defaults(args: argparse.Namespace) -> dict[str, str]:
    data_dir = Path(getattr(args, "data_dir", None) or os.environ.get("RESONTECH_DATA_DIR") or ".resontech")
    env_file = data_dir / "dev.env"
    return read_env_file(env_file) if env_file.exists() else {}


def client(args: argparse.Namespace) -> Client:
    """A client configured from flags, environment, the login file, then dev.env."""
    fallback = _defaults(args)
    url = args.url or os.environ.get("RESONTECH_GATEWAY_URL")
    key = args.key or os.environ.get("RESONTECH_API_KEY")
    if not CREDENTIALS.exists():
        url = url or fallback.get("RESONTECH_GATEWAY_URL")
        key = key or fallback.get("RESONTECH_API_KEY")
    return Client(url, key)


def show(args: argparse.Namespace, value: T, human: Callable[[T], str]) -> None:
    """``value`` as ``human`` says, or with ``--json`` as the API's JSON (Structs as their fields)."""
    if args.json:
        print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))
    else:
        print(human(value))


def progress_bar(label: str) -> Progress:
    """A one-line progress bar on stderr (only when it is a terminal: logs stay clean)."""
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if not tty or (now - last[0] < 0.1 and done < total):
            return
        last[0] = now
        width = 30
        filled = width * done // max(total, 1)
        rate = done / max(now - start, 1e-6) / 1e6
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done >= total else ""
        sys.stderr.write(
            f"\r{label} [{bar}] {100 * done // max(total, 1):3d}% "
            f"{done / 1e6:,.1f}/{total / 1e6:,.1f} MB {rate:,.1f} MB/s{end}"
        )
        sys.stderr.flush()

    return report


# -- commands ----------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    with client(args) as rt:
        if not rt.config.key:
            raise SystemExit("error: give the key: resontech login --key rt_... [--url URL]")
        me = rt.me()
    CREDENTIALS.parent.mkdir(parents=True, exist_ok=True)
    write_private(CREDENTIALS, json.dumps({"url": rt.config.url, "key": rt.config.key}))
    show(
        args,
        me,
        lambda m: f"logged in to {rt.config.url} as {m.principal} ({m.role}); saved to {CREDENTIALS}",
    )
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    CREDENTIALS.unlink(missing_ok=True)
    print(f"removed {CREDENTIALS}")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    with client(args) as rt:
        me = rt.me()
        show(args, me, lambda m: f"{m.principal} ({m.role}) at {rt.config.url}")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    source = Path(args.file)
    if source.is_dir():
        return _upload_folder(args, source)
    if not source.is_file():
        raise SystemExit(f"error: {source} is not a file or a folder")
    key = args.key_path or f"jobs/{source.stem}/{source.name}"
    with client(args) as rt:
        stored = rt.upload(source, key, content_type=args.content_type, progress=progress_bar(source.name))
    show(args, stored, lambda o: f"uploaded {source} -> {o.key} ({o.size:,} bytes)")
    return 0


def _upload_folder(args: argparse.Namespace, source: Path) -> int:
    """Every file under ``source`` (hidden ones and ``__pycache__`` left out) to ``KEY/<its path>``:
    an NVFlare job folder, a script's folder."""
    prefix = args.key_path or ""
    if not prefix.endswith("/"):
        raise SystemExit("error: uploading a folder needs KEY, a prefix ending in '/' (jobs/x/flare/)")
    files = [
        path
        for path in sorted(source.rglob("*"))
        if path.is_file()
        and not any(p.startswith(".") or p == "__pycache__" for p in path.relative_to(source).parts)
    ]
    with client(args) as rt:
        stored = [rt.upload(path, prefix + path.relative_to(source).as_posix()) for path in files]
    show(
        args,
        stored,
        lambda objs: "\n".join(f"uploaded {o.key} ({o.size:,} bytes)" for o in objs) or "(empty)",
    )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    with client(args) as rt:
        target = rt.download(args.object_key, args.dest, progress=progress_bar(Path(args.object_key).name))
    if args.json:
        print(json.dumps({"key": args.object_key, "path": str(target)}))
    else:
        print(f"downloaded {args.object_key} -> {target}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.objects(args.prefix, limit=args.limit)
        items = list(page.items)
        while page.next and len(items) < args.limit:
            page = rt.objects(args.prefix, limit=args.limit, after=page.next)
            items += page.items
    show(
        args,
        items,
        lambda objs: "\n".join(f"{o.size:>14,}  {o.last_modified}  {o.key}" for o in objs) or "(empty)",
    )
    return 0


def read_spec(path: str) -> dict[str, object]:
    """A job or endpoint spec from a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON file."""
    source = Path(path)
    if not source.is_file():
        raise SystemExit(f"error: no spec file {source}")
    text = source.read_text()
    try:
        if source.suffix == ".toml":
            import tomllib

            spec: object = tomllib.loads(text)
        elif source.suffix in (".yaml", ".yml"):
            import yaml

            spec = yaml.safe_load(text)
        else:
            spec = json.loads(text)
    except Exception as exc:  # the parsers' own errors name the line
        raise SystemExit(
            f"error: {source} is not valid {source.suffix.lstrip('.') or 'JSON'}: {exc}"
        ) from None
    if not isinstance(spec, dict):
        raise SystemExit(f"error: {source} must hold a mapping of spec fields, got {type(spec).__name__}")
    return spec


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
    return f"{job.job_id:<28} {job.name:<20} {job.kind:<9} {job.state:<10} {job.shards} shard(s){progress}"


def job_detail(job: Job) -> str:
    lines = [
        f"job {job.job_id} ({job.name}, {job.kind}) of {job.tenant}: {job.state}",
        f"  submitted {job.submitted_at} by {job.submitted_by}"
        + (f", ended {job.ended_at}" if job.ended_at else ""),
    ]
    for a in job.assignments:
        state = "done" if a.done else "running" if a.started else "placed"
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
            print(f"job {job.job_id} ({job.name}): {job.state}", flush=True)
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


def traffic_text(t: Traffic) -> str:
    """An endpoint's traffic through the gateway (its last 60 s) in one phrase: requests, RPS, error
    rate and P50/P95/P99 latency, or that nothing was served."""
    if t.requests == 0:
        return "no requests"
    return (
        f"{t.requests} req, {t.rps:.2f} rps, {t.error_rate:.1%} errors, "
        f"p50/p95/p99 {t.p50_ms:.1f}/{t.p95_ms:.1f}/{t.p99_ms:.1f} ms"
    )


def endpoint_line(e: Endpoint) -> str:
    """One line per endpoint; a failed one adds why on the next line."""
    replicas = f"{e.ready_replicas}/{e.desired_replicas} ready"
    line = (
        f"{e.endpoint_id:<28} {e.name:<20} {e.state:<15} {replicas:<11} {e.model}\n"
        f"{'':<28} last 60 s: {traffic_text(e.traffic)}"
    )
    return line + (f"\n{'':<28} failed: {e.scale_reason}" if e.state == "failed" else "")


def endpoint_detail(e: Endpoint) -> str:
    """An endpoint, its replicas, its traffic, and the latest replica failure with the engine's last
    lines."""
    zero = (
        "never to zero"
        if e.scale_to_zero_after_s is None
        else f"to zero after {e.scale_to_zero_after_s} s idle"
    )
    lines = [
        f"endpoint {e.endpoint_id} ({e.name}, {e.model}) of {e.tenant}: {e.state}",
        f"  replicas: {e.ready_replicas}/{e.desired_replicas} ready (min {e.min_replicas}, max "
        f"{e.max_replicas}, target {e.target_rps_per_replica:g} rps per replica, {zero})",
    ]
    if e.scale_reason:
        lines.append(f"  {'failed' if e.state == 'failed' else 'last scaled'}: {e.scale_reason}")
    for r in e.replicas:
        where = f" at {r.address}" if r.address else ""
        why = f": {r.reason}" if r.reason else ""
        lines.append(f"  replica {r.slot}: {r.state} on {r.worker_id}{where} (epoch {r.epoch}){why}")
    lines.append(f"  traffic, last 60 s: {traffic_text(e.traffic)}")
    if e.last_failure:
        lines.append(f"  last replica failure ({e.start_failures} in a row): {e.last_failure}")
        lines += [f"    | {line}" for line in e.last_failure_log_tail.splitlines()]
    return "\n".join(lines)


def cmd_endpoints(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.endpoints(limit=args.limit)
    show(args, page.items, lambda items: "\n".join(endpoint_line(e) for e in items) or "(no endpoints)")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    with client(args) as rt:
        endpoint = rt.deploy(read_spec(args.spec))
    show(args, endpoint, lambda e: f"deployed {e.endpoint_id} ({e.name}): {e.state}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    with client(args) as rt:
        endpoint = rt.scale(args.endpoint, min_replicas=args.min, max_replicas=args.max)
    show(args, endpoint, endpoint_line)
    return 0


def cmd_undeploy(args: argparse.Namespace) -> int:
    with client(args) as rt:
        rt.delete_endpoint(args.endpoint)
    print(f"deleted {args.endpoint}")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    """Ask an endpoint through the gateway's OpenAI-compatible routes, with the official client."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam

    with client(args) as rt:
        config = rt.config
    api = openai.OpenAI(base_url=f"{config.url.rstrip('/')}/v1", api_key=config.key or "", timeout=180.0)
    try:
        if args.embed:
            vector = api.embeddings.create(model=args.endpoint, input=args.prompt).data[0].embedding
            print(json.dumps(vector) if args.json else f"{len(vector)} dimensions: {vector[:4]}...")
            return 0
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": args.prompt}]
        stream = api.chat.completions.create(
            model=args.endpoint, messages=messages, max_tokens=args.max_tokens, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()
    except openai.APIStatusError as exc:
        print(f"error: {exc.status_code} {exc.message}", file=sys.stderr)
        return 1
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.workers(limit=args.limit)

    def human(items: list[Worker]) -> str:
        rows = []
        for w in items:
            gpus = f"{len(w.gpus)}x {w.gpus[0].model}" if w.gpus else f"no GPU, {w.cpus} CPUs"
            rows.append(
                f"{w.worker_id:<18} {w.hostname:<16} {w.state:<11} {w.tier:<10} "
                f"{w.uptime_30d:.1%} up  {gpus}  earned {w.earnings.payout.usd} USD"
            )
        return "\n".join(rows) or "(no workers)"

    show(args, page.items, human)
    return 0


def cmd_billing(args: argparse.Namespace) -> int:
    with client(args) as rt:
        me = rt.me()
        if me.kind == "provider":
            payouts = rt.payouts(args.period)
            show(
                args,
                payouts,
                lambda p: (
                    "\n".join(
                        f"{period.period}: {t.tier} {t.payout.usd} USD"
                        for period in p.periods
                        for t in period.tiers
                    )
                    or "(no payouts)"
                ),
            )
            return 0
        if args.period:
            invoice = rt.invoice(args.period)
            show(
                args,
                invoice,
                lambda i: "\n".join(
                    [f"invoice {i.period}: {i.total.usd} USD ({'open' if i.open else 'closed'})"]
                    + [
                        f"  {line.work_kind} {line.work_id} on {line.gpu_type} ({line.pool}): "
                        f"{line.gpu_seconds:,.0f} GPU-s, {line.cpu_seconds:,.0f} CPU-s"
                        + (f", {line.tokens:,} tokens" if line.tokens else "")
                        + f": {line.charge.usd} USD"
                        for line in i.lines
                    ]
                ),
            )
        else:
            invoices = rt.invoices()
            show(
                args,
                invoices,
                lambda items: (
                    "\n".join(
                        f"{i.period}: {i.total.usd} USD ({'open' if i.open else 'closed'}, {i.lines} lines)"
                        for i in items
                    )
                    or "(no invoices yet)"
                ),
            )
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    """A tenant's usage by period and by job or endpoint: GPU- and CPU-seconds, tokens, charges."""
    with client(args) as rt:
        usage = rt.usage(args.period)

    def human(u: Usage) -> str:
        rows = []
        for p in u.periods:
            rows.append(f"{p.period}: {p.gpu_seconds:,.0f} GPU-s, {p.cpu_seconds:,.0f} CPU-s, "
                        f"{p.tokens:,} tokens: {p.charge.usd} USD")  # fmt: skip
            rows += [f"  {w.work_kind} {w.work_id}: {w.gpu_seconds:,.0f} GPU-s, {w.cpu_seconds:,.0f} CPU-s, "
                     f"{w.tokens:,} tokens: {w.charge.usd} USD" for w in p.work]  # fmt: skip
        return "\n".join(rows) or "(no usage yet)"

    show(args, usage, human)
    return 0


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the user commands to the ``resontech`` parser (``command(name, handler, help)``)."""

    def user(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        p = command(name, lambda args, _settings: handler(args), help_text)
        p.add_argument("--url", help="gateway URL (default: RESONTECH_GATEWAY_URL, login, dev.env)")
        p.add_argument("--key", help="API key (default: RESONTECH_API_KEY, login, dev.env)")
        return p

    user("login", cmd_login, "check a gateway URL and key, and remember them for later commands")
    user("logout", cmd_logout, "forget what login remembered")
    user("whoami", cmd_whoami, "who the current key is")
    p = user("upload", cmd_upload, "upload a file (or a folder's files) to your workspace")
    p.add_argument("file", help="the local file, or a folder (its files go under KEY, a prefix)")
    p.add_argument(
        "key_path", nargs="?", metavar="KEY", help="where in the workspace (default jobs/<stem>/<name>)"
    )
    p.add_argument("--content-type", help="MIME type stored with the object")
    p = user("download", cmd_download, "download an object of your workspace")
    p.add_argument("object_key", metavar="KEY", help="the object's key, e.g. model_out/final.pt")
    p.add_argument("dest", nargs="?", default=".", help="file or directory (default: here)")
    p = user("ls", cmd_ls, "list your workspace")
    p.add_argument("prefix", nargs="?", default="", help="only keys starting with this")
    p.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
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
    p = user("endpoints", cmd_endpoints, "list your inference endpoints, with their traffic (last 60 s)")
    p.add_argument("--limit", type=int, default=50)
    p = user("deploy", cmd_deploy, "deploy an endpoint from a YAML, TOML or JSON spec file")
    p.add_argument("spec", help="the endpoint spec file (fields of POST /v1/endpoints)")
    p = user("scale", cmd_scale, "change an endpoint's replica bounds")
    p.add_argument("endpoint")
    p.add_argument("--min", type=int, help="minimum replicas (0 allows scale to zero)")
    p.add_argument("--max", type=int, help="maximum replicas")
    p = user("undeploy", cmd_undeploy, "delete an endpoint (its replicas stop)")
    p.add_argument("endpoint")
    p = user("infer", cmd_infer, "ask an endpoint a question (chat, streamed) or embed a text")
    p.add_argument("endpoint", help="the endpoint's name")
    p.add_argument("prompt")
    p.add_argument("--embed", action="store_true", help="embed the text instead of chatting")
    p.add_argument("--max-tokens", type=int, default=128)
    p = user("workers", cmd_workers, "a provider's nodes: health, tier, uptime, earnings")
    p.add_argument("--limit", type=int, default=50)
    p = user("billing", cmd_billing, "invoices (tenants) or payouts (providers)")
    p.add_argument("--period", help="one month, YYYY-MM")
    p = user("usage", cmd_usage, "your usage by month and by job or endpoint, tokens included")
    p.add_argument("--period", help="one month, YYYY-MM")
