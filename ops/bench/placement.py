"""Placement throughput: a real coordinator places jobs on a simulated fleet (part of
``python -m ops.bench.schedule``).

10,000 simulated workers (:class:`agent.simulated.SimulatedFleet`: a seeded mix of A100,
H100, L40S, RTX 4090 and CPU hosts over five regions) register and heartbeat once with a one-hour
interval (so none turns silent during the run); 20,000 one-shard jobs are submitted in one
``append_many``: CPU jobs and one-GPU jobs with VRAM hints, GPU types and a preferred region, so
that every decision filters and ranks. A real :class:`ops.coordinator.Coordinator` then catches
up and places them; a placement counts when its ``job.placed`` append is acknowledged, timed from
the moment the coordinator has caught up to the last one; ``placed_and_started_per_s`` also waits
for every ``start_work`` command. The baseline beside it, same run and server: what the log alone
sustains for the same appends, with raw nats-py ``js.publish`` awaited in parallel with the
coordinator's bound and no decision (:mod:`ops.bench.raw_appends`): per job a ``job.placed`` (same
headers, expected sequence included) and its ``start_work`` command (the ratio), and ``job.placed``
alone. Both on the shipped server config (``sync_interval: always``: durable) and on a server without
per-write fsync (the client-bound figure).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from agent.simulated import SimulatedFleet
from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from ops.bench.common import private_nats, process_peak_rss_mb
from ops.bench.quantiles import nearest_rank
from ops.bench.raw_appends import raw_placements
from ops.coordinator import Coordinator
from schemas.jobs import JobResources, JobSubmitted
from schemas.values import TopologyRequest

GPU_JOBS: tuple[tuple[str | None, int, int], ...] = (
    # (GPU type, VRAM hint MiB, weight): a mix that fits the simulated fleet's free VRAM
    ("A100", 24_000, 5),
    ("H100", 40_000, 3),
    ("L40S", 16_000, 1),
    ("RTX4090", 8_000, 2),
    (None, 12_000, 2),
)
REGIONS = (None, "eu-west", "us-east", "ap-south")


def job_resources(i: int) -> tuple[JobResources, str | None]:
    """Job ``i``'s needs and preferred region: 3 in 10 are CPU jobs, the rest one-GPU jobs."""
    region = REGIONS[i % len(REGIONS)]
    if i % 10 < 3:
        return JobResources(cpus=1, memory_mb=2048), region
    weighted = [kind for kind in GPU_JOBS for _ in range(kind[2])]
    gpu_type, vram_mb, _ = weighted[(i * 7) % len(weighted)]
    return JobResources(gpus=1, vram_mb=vram_mb, gpu_type=gpu_type, cpus=2, memory_mb=8192), region


def submissions(
    count: int, prefix: str = "j", *, gangs: bool = False
) -> Iterator[tuple[str, JobSubmitted, str]]:
    """``count`` jobs; ``gangs``: each a two-shard gang that must share a rack."""
    for i in range(count):
        resources, region = job_resources(i)
        event = JobSubmitted(
            name=f"{prefix}{i}",
            kind="process",
            shards=2 if gangs else 1,
            command=["true"],
            resources=resources,
            region=region,
            priority=i % 3,
            topology=TopologyRequest(level="rack") if gangs else None,
        )
        tenant = f"tenant{i % 20}"
        yield job_subject(tenant, f"{prefix}{i}", event), event, f"submit-{tenant}-{prefix}{i}"


async def placement_run(
    url: str,
    workers: int,
    jobs: int,
    *,
    group_commit: bool = True,
    replicas: int = 1,
    racks: int = 0,
    gangs: bool = False,
) -> dict[str, Any]:
    """Register ``workers``, submit ``jobs``, run a coordinator until all are placed (or it stalls).

    ``group_commit=False``: the coordinator's appends go one by one, each its own write (the
    baseline :mod:`core.log.group_commit` is measured against). ``replicas``: of every stream
    (3 on a cluster: ``url`` then lists its nodes). ``racks``: the workers' racks (none: 0);
    ``gangs``: every job a two-shard gang that must share a rack."""
    settings = Settings(nats_url=url, ack_timeout_s=60.0, stream_replicas=replicas)
    await _load(settings, workers, jobs, racks=racks, gangs=gangs)
    own = await EventLog.connect(Settings(nats_url=url, group_commit=group_commit), name="bench-coordinator")
    coordinator = Coordinator(own, name="bench-coordinator")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    try:
        loaded = time.perf_counter()
        await asyncio.gather(*(r.caught_up.wait() for r in coordinator.runners))
        started = time.perf_counter()
        catch_up_s = started - loaded
        last, last_at = 0, started
        while coordinator.placements < jobs and time.perf_counter() - last_at < 30.0:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
            if coordinator.placements != last:
                last, last_at = coordinator.placements, time.perf_counter()
        elapsed = last_at - started
        placed = coordinator.placements
        while coordinator.start_commands < placed and time.perf_counter() - last_at < 60.0:
            await asyncio.sleep(0.05)
        commands_s = time.perf_counter() - started
        commanded = coordinator.start_commands
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)
        await own.close()
    decisions = list(coordinator.decision_ms)
    return {
        "placed": placed,
        "waited": jobs - placed,
        "placements_per_s": placed / elapsed if elapsed else 0.0,
        "placed_and_started_per_s": commanded / commands_s if commands_s else 0.0,
        "place_s": elapsed,
        "commands_s": commands_s,
        "catch_up_s": catch_up_s,
        "conflicts": coordinator.conflicts,
        "decisions": len(decisions),
        "decision_p50_ms": nearest_rank(decisions, 0.5),
        "decision_p99_ms": nearest_rank(decisions, 0.99),
    }


async def _load(settings: Settings, workers: int, jobs: int, *, racks: int, gangs: bool) -> None:
    """Register and beat the simulated fleet, and submit the jobs, in batched appends."""
    async with await EventLog.connect(settings, name="bench-setup") as log:
        await log.ensure_streams()
        fleet = SimulatedFleet(log, workers, interval_s=3600.0, seed=7, racks=racks)
        await fleet.register()
        await fleet.beat()
        await log.append_many(submissions(jobs, gangs=gangs))


async def placement(
    workers: int, jobs: int, *, sync_always: bool, one_by_one: bool = False
) -> dict[str, Any]:
    """One placement run and its raw baselines on a private server (durable or not); with
    ``one_by_one``, first the same run with group commit off, on a server of its own."""
    label = "durable (sync_interval: always)" if sync_always else "no per-write fsync"
    baseline: dict[str, Any] = {}
    if one_by_one:
        print(f"placement, {label}, group commit off: {workers:,} workers, {jobs:,} jobs", flush=True)
        with private_nats(sync_always=sync_always) as server:
            baseline = await placement_run(server.url, workers, jobs, group_commit=False)
        print(
            f"  coordinator, appends one by one: {baseline['placed']:,} placed in "
            f"{baseline['place_s']:.2f}s = {baseline['placements_per_s']:,.0f}/s; placed and started "
            f"{baseline['placed_and_started_per_s']:,.0f}/s",
            flush=True,
        )
    print(f"placement, {label}: {workers:,} workers, {jobs:,} jobs", flush=True)
    with private_nats(sync_always=sync_always) as server:
        ours = await placement_run(server.url, workers, jobs)
        print(
            f"  coordinator: {ours['placed']:,} placed in {ours['place_s']:.2f}s = "
            f"{ours['placements_per_s']:,.0f}/s; decision p50 {ours['decision_p50_ms']:.3f} ms, "
            f"p99 {ours['decision_p99_ms']:.3f} ms; catch-up {ours['catch_up_s']:.2f}s; "
            f"every start command sent after {ours['commands_s']:.2f}s "
            f"({ours['placed_and_started_per_s']:,.0f} placed and started/s); {ours['conflicts']} conflicts",
            flush=True,
        )
        raw = await raw_placements(server.url, jobs, commands=True)
        raw_placed = await raw_placements(server.url, jobs, commands=False)
        print(
            f"  raw js.publish awaited in parallel, no decision: job.placed and start_work "
            f"{raw:,.0f} jobs/s, job.placed alone {raw_placed:,.0f}/s",
            flush=True,
        )
        server_rss = process_peak_rss_mb(server.pid or 0)
    return {
        **ours,
        "raw_placed_and_started_per_s": raw,
        "raw_placed_eps": raw_placed,
        "ratio": ours["placed_and_started_per_s"] / raw,
        "one_by_one_placements_per_s": baseline.get("placements_per_s", 0.0),
        "one_by_one_placed_and_started_per_s": baseline.get("placed_and_started_per_s", 0.0),
        "nats_rss_mb": server_rss,
    }
