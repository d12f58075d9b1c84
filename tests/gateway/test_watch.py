"""``resontech watch``: a job's history, then its live events, through a served gateway's feed, until
the job ends (the real CLI in a child process)."""

from __future__ import annotations

import asyncio
import os
import sys

from core.log import EventLog
from core.streams import job_subject
from ops.watch import describe
from schemas import (
    Assignment,
    JobCheckpointed,
    JobCompleted,
    JobPlaced,
    JobProgress,
    JobSubmitted,
    Provenance,
)
from tests.gateway.conftest import GatewayServer
from tests.support import REPO


async def test_watch_prints_the_history_then_live_progress_and_ends_with_the_job(
    gateway_server: GatewayServer, log: EventLog
) -> None:
    tenant, admin = await gateway_server.tenant()

    async def append(event: object) -> None:
        await log.append(job_subject(tenant, "j-watch", event), event)  # type: ignore[arg-type]

    await append(JobSubmitted(name="mlp", kind="ddp", shards=2, command=["train.py"]))
    a = Assignment(assignment_id="j-watch-s0-e1", worker_id="w-1", slot=0, epoch=1)
    await append(JobPlaced(assignments=[a], provenance=Provenance(candidates=1)))
    await append(JobProgress(epoch=1, slot=0, train_epoch=1, step=8, loss=0.9, metrics={"accuracy": 0.5}))

    for _ in range(100):  # the gateway follows the log: wait until it knows the job
        if (await gateway_server.request("GET", "/v1/jobs/j-watch", admin)).status_code == 200:
            break
        await asyncio.sleep(0.1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(RESONTECH_GATEWAY_URL=gateway_server.url, RESONTECH_API_KEY=admin)
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", "watch", "j-watch",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert watcher.stdout is not None
        history = [(await asyncio.wait_for(watcher.stdout.readline(), 30)).decode() for _ in range(3)]
        assert "progress: epoch 1" in history[-1]  # the history is out: what follows comes live
        await append(JobProgress(epoch=1, slot=0, train_epoch=2, step=16, loss=0.5, gpu_util_pct=87.0))
        await append(JobCheckpointed(epoch=1, slot=0, object_key="jobs/mlp/checkpoints/j/e1-0.ckpt", step=16))
        await append(JobCompleted())
        raw, _ = await asyncio.wait_for(watcher.communicate(), 30)
    finally:
        if watcher.returncode is None:
            watcher.kill()
    out = "".join(history) + raw.decode()
    assert watcher.returncode == 0, out
    lines = [line.split("  ", 1)[1] for line in out.splitlines()]
    assert lines == [
        "submitted: ddp, 2 shard(s)",
        "placed (epoch 1): shard 0 on w-1",
        "progress: epoch 1 step 8 loss 0.9 accuracy 0.5",
        "progress: epoch 2 step 16 loss 0.5 gpu 87%",
        "checkpoint at step 16: jobs/mlp/checkpoints/j/e1-0.ckpt",
        "completed",
    ]


def test_a_failure_shows_the_reason_and_the_end_of_the_log() -> None:
    line = describe(
        "job.failed", {"reason": "shard 1 failed: exit status 1", "log_tail": "a\nValueError: boom"}
    )
    assert line == "job failed: shard 1 failed: exit status 1\n    a\n    ValueError: boom"
    assert describe("job.failed", {"slot": 1, "reason": "exit status 1"}) == "shard 1 failed: exit status 1"
    assert describe("job.some_future_event", {}) is None
