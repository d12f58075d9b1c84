"""``resontech watch JOB``: a job's events as they happen, one line each, from the live feed.

It replays the job's history from the start of the log (``after=jobs:0``), then follows it live, and
returns when the job ends: exit status 0 when it completed, 1 when it failed or was cancelled. A
dropped connection is resumed from the last cursor (the feed sends nothing twice), at most
:data:`RECONNECTS` times in a row.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from gateway.wsclient import ConnectionClosed, connect

RECONNECTS = 5
TERMINAL = {"job.completed": 0, "job.failed": 1, "job.cancelled": 1}


def describe(kind: str, e: dict[str, Any]) -> str | None:
    """One line for an event of a job (``None`` for events not worth a line)."""
    slot = f"shard {e['slot']}" if e.get("slot") is not None else "job"
    match kind:
        case "job.submitted":
            return f"submitted: {e['kind']}, {e['shards']} shard(s)"
        case "job.queued":
            return f"waiting: {e['reason']}"
        case "job.placed":
            placed = ", ".join(f"shard {a['slot']} on {a['worker_id']}" for a in e["assignments"])
            return f"placed (epoch {e['assignments'][0]['epoch']}): {placed}"
        case "job.started":
            return f"{slot} started on {e['worker_id']} (epoch {e['epoch']})"
        case "job.progress":
            return progress(e)
        case "job.checkpointed":
            step = f" at step {e['step']}" if e.get("step") is not None else ""
            return f"checkpoint{step}: {e['object_key']}"
        case "job.round_completed":
            return f"round {e['round']} completed"
        case "job.assignment_revoked":
            return f"{slot} revoked (epoch {e['epoch']}): {e['reason']}"
        case "job.rejected":
            return f"rejected by {e['worker_id']}: {e['reason']}"
        case "job.shard_completed":
            return f"{slot} done"
        case "job.failed":
            tail = "".join(f"\n    {line}" for line in e.get("log_tail", "").splitlines()[-20:])
            return f"{slot} failed: {e['reason']}{tail}"
        case "job.completed":
            return "completed" + (f": {', '.join(e['outputs'])}" if e.get("outputs") else "")
        case "job.cancelled":
            return f"cancelled by {e['by']}"
    return None


def progress(e: dict[str, Any]) -> str:
    """``epoch 3 step 48 loss 0.71 accuracy 0.8 gpu 87%`` from the fields a progress event has."""
    parts = [f"{name} {e[key]}" for key, name in PROGRESS_FIELDS if e.get(key) is not None]
    parts += [f"{name} {value:g}" for name, value in sorted(e.get("metrics", {}).items())]
    if e.get("gpu_util_pct") is not None:
        parts.append(f"gpu {e['gpu_util_pct']:g}%")
    return "progress: " + " ".join(parts)


PROGRESS_FIELDS = (("round", "round"), ("train_epoch", "epoch"), ("step", "step"), ("loss", "loss"))


async def watch(
    url: str, key: str | None, job_id: str, *, tenant: str | None = None, out: Callable[[str], None] = print
) -> int:
    """Print the job's events until it ends; its exit status (0 completed, 1 failed or cancelled).

    Raises:
        HandshakeError: the gateway refused the feed (a bad key, another tenant's job).
        ConnectionClosed: the feed refused the query (4400-4499), or the connection failed
            :data:`RECONNECTS` times in a row.
    """
    query = {"job": job_id, "kind": "job"} | ({"tenant": tenant} if tenant else {})
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    cursor, failures = "jobs:0", 0
    while True:
        try:
            feed = await connect(f"{url}/v1/feed?{urlencode({**query, 'after': cursor})}", headers)
        except OSError as exc:
            closed = ConnectionClosed(1006, f"cannot connect: {exc}")
        else:
            async with feed:
                async for raw in feed:
                    failures = 0
                    message = json.loads(raw)
                    kind = message["kind"]
                    if kind in ("feed.ready", "feed.ping"):
                        cursor = message["cursor"]
                    elif "seq" in message:
                        cursor = f"jobs:{message['seq']}"
                        line = describe(kind, message["event"])
                        if line is not None:
                            out(f"{message['time'][11:19]}  {line}")
                        if kind in TERMINAL:
                            return TERMINAL[kind]
            closed = feed.closed or ConnectionClosed(1006, "the feed ended")
        failures += 1
        if 4400 <= closed.code < 4500 or failures >= RECONNECTS:  # refused, or gone for good
            raise closed
        await asyncio.sleep(min(2.0**failures / 4, 5.0))
