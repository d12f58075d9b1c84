"""The Kubernetes dispatcher's speed: from ``job.placed`` to every object of a 2-shard job in the
cluster, against applying the same objects straight to the same API server.

``python -m ops.bench.dispatcher [--jobs 20] [--trials 3]``

A private nats-server, the intake and a coordinator in this process, the dispatcher (polling every
0.1 s) and kmock as the cluster, with two GPU nodes (the emulator of ``tests/support/kube.py``: no real API
server is packaged for this machine; see docs/dispatcher.md). Per trial a 2-shard DDP job is submitted; the
clock runs from the store time of its ``job.placed`` to the moment the emulator holds both shards'
Jobs (checked every 2 ms); then the job is cancelled as the gateway cancels it and the clock runs to
its namespace's deletion. The baseline, in the same run: the very objects the dispatcher made for
that job, applied again by :meth:`~ops.dispatcher.cluster.Cluster.apply` into a namespace of another
name, on the same emulator: what the API calls alone cost. ``dispatch_ratio`` is the dispatcher's
median over the baseline's: what taking the command, rendering, recording and reporting add.

Then :mod:`ops.bench.dispatcher_recovery`: a 2-shard gang and a 2-replica endpoint, placed to running
and a node lost to running again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.settings import Settings
from core.streams import command_subject, job_subject
from ops.bench import dispatcher_recovery as recovery
from ops.bench.agents import until
from ops.bench.common import median, private_nats
from ops.coordinator import Coordinator
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import Identity
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.service import Dispatcher, Timing
from ops.services import intake
from projections import REGISTRY, SCHEDULE
from projections.runner import ProjectionRunner
from schemas.commands import StopWork
from schemas.jobs import JobCancelled, JobPlaced, JobResources, JobSubmitted
from tests.support.kube import JOBS, Kube, serving

CTX = RenderContext()
TICK_S = 0.002
"""How often the emulator is looked at while a trial's clock runs."""


@contextlib.asynccontextmanager
async def emulated_cluster(root: Path) -> AsyncIterator[Kube]:
    """kmock with two 1-GPU nodes, on a free loopback port."""
    async with serving(root) as kube:
        for n, name in enumerate(("gpu-a", "gpu-b")):
            await kube.add_gpu_node(name, f"10.0.0.{n + 1}")
        yield kube


def held_objects(kube: Kube, ns: str) -> list[dict[str, Any]]:
    """The objects the emulator holds in ``ns`` and the namespace itself, as they were applied."""
    found = []
    for (_, namespace, name), obj in kube.mock.objects.items():
        if obj.deleted or not (namespace == ns or (namespace is None and name == ns)):
            continue
        raw = copy.deepcopy(obj.raw)
        raw.pop("status", None)
        found.append(raw)
    return found


def renamed(objects: list[dict[str, Any]], ns: str, to: str) -> list[dict[str, Any]]:
    out = []
    for o in copy.deepcopy(objects):
        meta = o["metadata"]
        if o["kind"] == "Namespace":
            meta["name"] = to
        else:
            meta["namespace"] = to
        out.append(o)
    return out


Placements = dict[str, tuple[int, JobPlaced]]
"""job id -> the store time of its first ``job.placed``, and the event."""


async def trial(log: EventLog, kube: Kube, placements: Placements, n: int) -> dict[str, float]:
    job_id, tenant = f"d{n}", "bench"
    kube.forget_requests()  # each trial starts alike
    ns = work_namespace(tenant, job_id, "job", CTX)
    submitted = JobSubmitted(
        name=job_id, kind="ddp", shards=2, command=["train.py"], resources=JobResources(gpus=1, cpus=2)
    )
    await log.append(job_subject(tenant, job_id, submitted), submitted)
    await until(lambda: len(kube.names(JOBS, ns)) == 2, f"{job_id}'s Jobs", step_s=TICK_S)
    applied_ns = time.time_ns()
    placed_ns, placed = await until(lambda: placements.get(job_id), f"{job_id} placed", step_s=0.01)
    objects = held_objects(kube, ns)
    cluster = Cluster.from_kubeconfig(kube.kubeconfig)
    started = time.perf_counter()
    await cluster.apply(renamed(objects, ns, f"base-{n}"))
    raw_s = time.perf_counter() - started
    await cluster.delete_namespace(f"base-{n}")
    cluster.close()
    cancel_ns = time.time_ns()
    cancelled = JobCancelled(by="bench", reason="trial over")
    await log.append(job_subject(tenant, job_id, cancelled), cancelled)
    for a in placed.assignments:
        stop = StopWork(work_id=job_id, assignment_id=a.assignment_id, epoch=a.epoch, reason="trial over")
        await log.append(command_subject(a.worker_id), stop, event_id=f"cancel-{a.assignment_id}")
    await until(lambda: not kube.mock.has_namespace(ns), f"{ns} deleted", step_s=TICK_S)
    teardown_s = (time.time_ns() - cancel_ns) / 1e9
    dispatch_s = (applied_ns - placed_ns) / 1e9
    print(
        f"  job {n + 1}: placed -> {len(objects)} objects in {dispatch_s * 1000:.0f} ms (applied straight: "
        f"{raw_s * 1000:.0f} ms), cancel -> namespace gone in {teardown_s * 1000:.0f} ms",
        flush=True,
    )
    return {"dispatch_s": dispatch_s, "raw_s": raw_s, "teardown_s": teardown_s, "objects": len(objects)}


async def bench(jobs: int) -> dict[str, Any]:
    print(f"dispatcher: {jobs} 2-shard DDP jobs on an emulated cluster of two GPU nodes", flush=True)
    with private_nats(sync_always=True) as server, tempfile.TemporaryDirectory(prefix="rt-disp-") as tmp:
        root = Path(tmp)
        settings = Settings(nats_url=server.url)
        own = await EventLog.connect(settings, name="bench")
        await own.ensure_streams()
        coordinator = Coordinator(own, name="bench-coordinator", tick_s=0.05)
        placements: Placements = {}

        def placed(record: Any) -> None:
            if isinstance(record.event, JobPlaced):
                placements.setdefault(record.token(2), (record.time_ns, record.event))

        # the bench's own projections: it sees the coordinator only through what the log holds
        schedule = ProjectionRunner(own, SCHEDULE, write_snapshots=False)
        registry = ProjectionRunner(own, REGISTRY, write_snapshots=False)
        schedule.listeners.append(placed)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(run(stop)) for run in (coordinator.run, schedule.run, registry.run)]
        results = []
        try:
            async with intake.running(settings, name="bench-intake"), emulated_cluster(root) as kube:
                d_log = await EventLog.connect(settings, name="bench-dispatcher")
                cluster = Cluster.from_kubeconfig(kube.kubeconfig)
                identity = Identity(cluster="bench", provider="bench-provider")
                # linger 0: the namespace goes at the round after the work's last assignment, so that
                # cancel -> namespace gone times the dispatcher, not the 60 s a replacement is waited for
                timing = Timing(poll_s=0.1, heartbeat_s=1.0, metering_s=10.0, nodes_s=5.0, linger_s=0.0)
                dispatcher = Dispatcher(
                    cluster, d_log, identity, CTX, root / "state", vouch=True, timing=timing
                )
                tasks.append(asyncio.create_task(dispatcher.run(stop)))
                await until(
                    lambda: (
                        len(registry.state.workers) == 2
                        and all(w.state == "available" for w in registry.state.workers.values())
                    ),
                    "verified",
                    step_s=0.05,
                )
                for n in range(jobs):
                    results.append(await trial(own, kube, placements, n))
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                await d_log.close()
                cluster.close()
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await own.close()
    dispatch = median([r["dispatch_s"] for r in results])
    raw = median([r["raw_s"] for r in results])
    return {
        "placed_to_applied_ms": round(dispatch * 1000, 1),
        "applied_straight_ms": round(raw * 1000, 1),
        "dispatch_ratio": round(dispatch / raw, 2),
        "objects_per_job": int(median([r["objects"] for r in results])),
        "cancel_to_namespace_gone_ms": round(median([r["teardown_s"] for r in results]) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=20, help="trials (default 20)")
    parser.add_argument("--trials", type=int, default=3, help="recovery trials of each kind (default 3)")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.jobs))
    figures |= asyncio.run(recovery.bench(args.trials))
    print("\nfigures (medians):")
    for key, value in figures.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
