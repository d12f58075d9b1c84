"""The Kubernetes dispatcher's time to running: a 2-shard DDP gang and a 2-replica endpoint, from their
placement to every pod running, and from a node lost to the replacement running.

``python -m ops.bench.dispatcher_recovery [--trials 3]``, also run by ``python -m ops.bench.dispatcher``.

A private nats-server, the intake, a coordinator and the dispatcher in this process, and kmock as the
cluster (``tests/support/kube.py``) with three 1-GPU nodes. A stand-in kubelet makes each Job's and
Deployment's pod and moves it to Running as soon as it exists, so the clocks time the kernel and the
dispatcher, not image pulls. Running is what the kernel stores: ``job.started`` of both shards, or
``endpoint.replica_ready`` of both replicas.

Node loss: the node of shard 0 (or replica 0) goes NotReady and its kubelet stops answering. The clock
runs from then to the replacement running. Most of it is the heartbeat deadline: the dispatcher stops
beating for the node, and the kernel declares it lost after three intervals (``heartbeat_s`` here:
1 s; 10 s by default). ``lost_to_running`` is the part after the kernel's ``worker.lost``: re-placement,
the dispatcher's apply and the pod's start. The baseline, in the same run: the node loss detection
alone (``worker.lost`` after the NotReady), so ``recovery_ratio`` is the whole over detection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.settings import Settings
from core.streams import command_subject, endpoint_subject, job_subject
from ops.bench.agents import until
from ops.bench.common import median, private_nats
from ops.coordinator import Coordinator
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import Identity, worker_id_for
from ops.dispatcher.service import Dispatcher, Timing
from ops.services import intake
from projections import ENDPOINTS, REGISTRY, SCHEDULE
from projections.runner import ProjectionRunner
from schemas.commands import StopWork
from schemas.endpoints import EndpointDeleted, EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady
from schemas.jobs import JobCancelled, JobPlaced, JobResources, JobStarted, JobSubmitted
from schemas.workers import WorkerLost, WorkerRecovered
from tests.support.kube import PODS, Kube, serving

CTX = RenderContext()
NODES = ("gpu-a", "gpu-b", "gpu-c")
TIMING = Timing(poll_s=0.1, heartbeat_s=1.0, metering_s=10.0, nodes_s=0.2, linger_s=0.0)


@dataclass
class Seen:
    """Store times (Unix ns) of what the bench waits for, as the projections apply them."""

    placed: dict[str, int] = field(default_factory=dict)
    """work id -> its first placement."""
    running: dict[tuple[str, int, int], int] = field(default_factory=dict)
    """(work id, slot, epoch) -> started (a shard) or ready (a replica)."""
    slots: dict[tuple[str, int], str] = field(default_factory=dict)
    """(work id, slot) -> the worker of its latest placement."""
    lost: dict[str, int] = field(default_factory=dict)
    """worker id -> when it was last declared lost."""
    assignments: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """assignment id -> (work id, slot, epoch), as placed."""

    def record(self, record: Any) -> None:
        event, work = record.event, record.token(2)
        match event:
            case JobPlaced() | EndpointReplicaPlaced():
                self.placed.setdefault(work, record.time_ns)
                for a in event.assignments:
                    self.slots[work, a.slot] = a.worker_id
                    self.assignments[a.assignment_id] = (work, a.slot, a.epoch)
            case JobStarted() | EndpointReplicaReady() if event.assignment_id in self.assignments:
                self.running.setdefault(self.assignments[event.assignment_id], record.time_ns)
            case WorkerLost():
                self.lost[record.token(1)] = record.time_ns
            case WorkerRecovered():
                self.lost.pop(record.token(1), None)

    def all_running(self, work: str, epochs: tuple[int, ...] = (1, 1)) -> int | None:
        """When the last of the work's slots ran, slot ``i`` at ``epochs[i]`` or later (``None``: not
        yet)."""
        times = [
            min(
                (t for (w, s, e), t in self.running.items() if (w, s) == (work, slot) and e >= epoch),
                default=0,
            )
            for slot, epoch in enumerate(epochs)
        ]
        return max(times) if all(times) else None


async def stand_in_kubelet(kube: Kube, stop: asyncio.Event) -> None:
    """Make the controllers' pods and start each at once, on nodes whose kubelet answers."""
    while not stop.is_set():
        kube.forget_requests()  # else the emulator's cost per request grows with every request served
        await kube.run_controllers()
        for (resource, ns, name), obj in list(kube.mock.objects.items()):
            if (
                resource != PODS
                or ns is None
                or obj.deleted
                or obj.raw.get("status", {}).get("phase") != "Pending"
            ):
                continue
            spec = obj.raw.get("spec") or {}
            if spec.get("nodeName") not in kube.mock.dead_kubelets:
                container = spec["containers"][0]["name"]
                with contextlib.suppress(AssertionError):  # gone meanwhile
                    await kube.set_pod_phase(ns, name, "Running", container=container)
        await asyncio.sleep(0.005)


async def lose_and_restore(kube: Kube, node: str) -> int:
    """The node goes NotReady and its kubelet stops answering; returns when (Unix ns)."""
    kube.kubelet_down(node)
    lost_at = time.time_ns()
    await kube.set_node_ready(node, "False")
    return lost_at


async def heal(kube: Kube, node: str, seen: Seen, worker: str) -> None:
    await kube.force_delete_pods(node)
    kube.mock.dead_kubelets.pop(node, None)
    await kube.set_node_ready(node, "True")
    await until(lambda: worker not in seen.lost, f"{worker} recovered", timeout=60)


async def trial(log: EventLog, kube: Kube, seen: Seen, kind: str, n: int) -> dict[str, float]:
    work = f"{kind[0]}{n}"
    if kind == "gang":
        submitted = JobSubmitted(
            name=work, kind="ddp", shards=2, command=["train.py"], resources=JobResources(gpus=1, cpus=2)
        )
        await log.append(job_subject("bench", work, submitted), submitted)
    else:
        deployed = EndpointDeployed(name=work, model="org/model", min_replicas=2, max_replicas=2)
        await log.append(endpoint_subject("bench", work, deployed), deployed)
    running = await until(lambda: seen.all_running(work), f"{work} running", timeout=60, step_s=0.002)
    placed_s = (running - seen.placed[work]) / 1e9
    victim_worker = seen.slots[work, 0]
    node = next(n for n in NODES if worker_id_for("bench", n) == victim_worker)
    lost_at = await lose_and_restore(kube, node)
    epochs = (2, 2) if kind == "gang" else (2, 1)  # a gang restarts whole; a replica alone
    again = await until(
        lambda: seen.all_running(work, epochs), f"{work} running again", timeout=90, step_s=0.002
    )
    detected = seen.lost.get(victim_worker, 0)
    result = {
        "placed_to_running_s": placed_s,
        "loss_to_running_s": (again - lost_at) / 1e9,
        "lost_to_running_s": (again - detected) / 1e9,
        "detection_s": (detected - lost_at) / 1e9,
    }
    print(
        f"  {kind} {n + 1}: placed -> running {placed_s * 1000:.0f} ms; node lost -> running again "
        f"{result['loss_to_running_s']:.2f} s (detection {result['detection_s']:.2f} s)",
        flush=True,
    )
    if kind == "gang":  # as the gateway cancels: the cancellation, and a stop to each holder
        cancelled = JobCancelled(by="bench", reason="trial over")
        await log.append(job_subject("bench", work, cancelled), cancelled)
        for slot in (0, 1):
            worker = seen.slots[work, slot]
            assignment = next(a for a, placed in seen.assignments.items() if placed == (work, slot, 2))
            stop = StopWork(work_id=work, assignment_id=assignment, epoch=2, reason="trial over")
            await log.append(command_subject(worker), stop, event_id=f"cancel-{assignment}")
    else:
        deleted = EndpointDeleted(by="bench")
        await log.append(endpoint_subject("bench", work, deleted), deleted)
    await heal(kube, node, seen, victim_worker)
    return result


@contextlib.asynccontextmanager
async def kernel(root: Path, settings: Settings, seen: Seen) -> AsyncIterator[tuple[EventLog, Kube]]:
    """The coordinator, the bench's projections, the intake and a dispatcher of kmock's three nodes."""
    own = await EventLog.connect(settings, name="bench")
    await own.ensure_streams()
    runners = [ProjectionRunner(own, p, write_snapshots=False) for p in (SCHEDULE, ENDPOINTS, REGISTRY)]
    for runner in runners:
        runner.listeners.append(seen.record)
    stop = asyncio.Event()
    coordinator = Coordinator(own, name="bench-coordinator", tick_s=0.05)
    tasks = [asyncio.create_task(run(stop)) for run in (coordinator.run, *(r.run for r in runners))]
    try:
        async with intake.running(settings, name="bench-intake"), serving(root) as kube:
            for i, name in enumerate(NODES):
                await kube.add_gpu_node(name, f"10.0.0.{i + 1}")
            d_log = await EventLog.connect(settings, name="bench-dispatcher")
            cluster = Cluster.from_kubeconfig(kube.kubeconfig)
            identity = Identity(cluster="bench", provider="bench-provider")
            dispatcher = Dispatcher(cluster, d_log, identity, CTX, root / "state", vouch=True, timing=TIMING)
            tasks += [
                asyncio.create_task(dispatcher.run(stop)),
                asyncio.create_task(stand_in_kubelet(kube, stop)),
            ]
            registry = runners[2]
            await until(
                lambda: sum(w.state == "available" for w in registry.state.workers.values()) == len(NODES),
                "the nodes verified",
                timeout=60,
            )
            try:
                yield own, kube
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                await d_log.close()
                cluster.close()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await own.close()


async def bench(trials: int) -> dict[str, Any]:
    print(f"dispatcher recovery: {trials} trials each of a 2-shard gang and a 2-replica endpoint", flush=True)
    results: dict[str, list[dict[str, float]]] = {"gang": [], "endpoint": []}
    seen = Seen()
    with private_nats(sync_always=True) as server, tempfile.TemporaryDirectory(prefix="rt-disp-") as tmp:
        async with kernel(Path(tmp), Settings(nats_url=server.url), seen) as (log, kube):
            for n in range(trials):
                for kind in results:
                    results[kind].append(await trial(log, kube, seen, kind, n))
    figures: dict[str, Any] = {"heartbeat_s": TIMING.heartbeat_s}
    for kind, found in results.items():
        for key in ("placed_to_running_s", "loss_to_running_s", "lost_to_running_s", "detection_s"):
            figures[f"{kind}_{key}"] = round(median([r[key] for r in found]), 3)
        figures[f"{kind}_recovery_ratio"] = round(
            figures[f"{kind}_loss_to_running_s"] / figures[f"{kind}_detection_s"], 2
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=3, help="trials of each (default 3)")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.trials))
    print("\nfigures (medians):")
    for key, value in figures.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
