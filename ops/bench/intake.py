"""The intake's cost on the metering path, against the direct append it replaced (part of
``python -m ops.bench.log``; runnable alone as ``python -m ops.bench.intake``).

Before issue 11 an agent appended its usage ticks straight to METERING; now it claims them on
INTAKE and the intake service checks each against the assignment it names and appends the kernel's
tick. Both are measured in the same run on the same durable server (``sync_interval: always``):

* direct: ``ticks`` usage ticks of ``assignments`` CPU assignments appended to METERING, pipelined,
  as agents did (ticks/s from the first publish to the last tick stored);
* intake: the same number of ticks claimed on INTAKE while an :class:`ops.services.intake.Intake` judges
  them; ticks/s from the first claim to the last canonical tick stored;
* both again on a server without per-write fsync (the client and the intake are the limit, not the
  disk), and both paced at :data:`RATE` ticks/s on the durable server: each tick's latency from its
  publish to its store time on METERING, p50 and p99.

Heartbeats do not go through the intake (``hb.<worker_id>`` is bound to its sender by NATS and says
nothing about anyone else), so their path is unchanged and not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

from core.log import EventLog
from core.settings import Settings
from core.streams import intake_subject, job_subject, metering_subject, worker_subject
from ops.bench.common import emit, machine, private_nats, table
from ops.services.intake import Intake
from schemas.jobs import JobPlaced, JobResources, JobSubmitted
from schemas.metering import UsageTick
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerRegistered, WorkerVerified

TICK_MS = 10
WORKERS = 100
RATE = 1_000.0
"""The paced run's ticks/s: 10,000 workers each metering every 10 s."""


async def setup(log: EventLog, tenant: str, assignments: int) -> list[Assignment]:
    """Workers and one-shard CPU jobs of ``tenant`` placed on them, as the kernel stores them."""
    workers = [f"w-{tenant}{i:07d}" for i in range(WORKERS)]
    items: list[tuple[str, Any]] = []
    for w in workers:
        items += [
            (worker_subject(w, WorkerRegistered), WorkerRegistered(provider="p", hostname=w)),
            (worker_subject(w, WorkerVerified), WorkerVerified(by="bench")),
        ]
    placed = []
    for j in range(assignments):
        job_id = f"job{j:06d}"
        a = Assignment(assignment_id=f"{job_id}-s0-e1", worker_id=workers[j % WORKERS], slot=0, epoch=1)
        submitted = JobSubmitted(name=job_id, kind="process", shards=1, resources=JobResources(cpus=1.0))
        items += [
            (job_subject(tenant, job_id, submitted), submitted),
            (
                job_subject(tenant, job_id, JobPlaced),
                JobPlaced(assignments=[a], provenance=Provenance(candidates=1)),
            ),
        ]
        placed.append(a)
    await log.append_many(items)
    return placed


def ticks_of(
    tenant: str, assignments: list[Assignment], per: int, start_ms: int
) -> list[tuple[str, UsageTick, str]]:
    """``per`` contiguous 10 ms CPU ticks of each assignment, round robin (as agents interleave)."""
    out = []
    for n in range(per):
        for a in assignments:
            tick = UsageTick(
                work_id=a.assignment_id.rsplit("-s", 1)[0],
                work_kind="job",
                assignment_id=a.assignment_id,
                epoch=1,
                start_ms=start_ms + n * TICK_MS,
                end_ms=start_ms + (n + 1) * TICK_MS,
                cpu_ms=TICK_MS,
            )
            subject = metering_subject(tenant, a.worker_id, a.assignment_id, UsageTick)
            out.append((subject, tick, f"{tenant}-{a.assignment_id}-tick-{n}"))
    return out


async def run_path(
    settings: Settings,
    items: list[tuple[str, UsageTick, str]],
    *,
    via_intake: bool,
    rate: float | None = None,
) -> dict[str, float]:
    """Publish ``items`` as agents do (pipelined; paced at ``rate`` a second, or as fast as possible),
    straight to METERING or as claims with an intake running; ticks/s from the first publish to the
    last tick stored on METERING, and each tick's latency from its publish to its store time (the
    server runs on this host: one clock)."""
    async with (
        await EventLog.connect(settings, name="bench-kernel") as own,
        await EventLog.connect(settings, name="bench-agents") as agents,
    ):
        intake = Intake(own, name="bench-intake")
        stop = asyncio.Event()
        task = asyncio.create_task(intake.run(stop)) if via_intake else None
        if via_intake:
            await intake.ready.wait()
        first = await agents.last_seq("METERING")
        sent_ns: list[int] = []
        acks = []
        begin = time.perf_counter()
        for n, (subject, tick, event_id) in enumerate(items):
            if rate is not None and (ahead := n / rate - (time.perf_counter() - begin)) > 0:
                await asyncio.sleep(ahead)
            target = intake_subject(subject.split(".")[2], subject) if via_intake else subject
            sent_ns.append(time.time_ns())
            acks.append(await agents.submit(target, tick, event_id=event_id))
            if len(acks) % 4096 == 0:
                await asyncio.gather(*acks[-4096:])
        positions = await asyncio.gather(*acks)
        while via_intake and intake.accepted + intake.refused < len(items):
            await asyncio.sleep(0.01)
        if task is not None:
            stop.set()
            await task
        stored = [r async for r in agents.replay("METERING", start_seq=first + 1)]
    # a tick stored by the intake is ``intake-<its claim's INTAKE sequence>``; a direct one keeps its id
    ids = [f"intake-{p.seq}" for p in positions] if via_intake else [i for _, _, i in items]
    published = dict(zip(ids, sent_ns, strict=True))
    latencies = sorted((r.time_ns - published[r.msg_id]) / 1e6 for r in stored if r.msg_id in published)
    span_s = (max(r.time_ns for r in stored) - sent_ns[0]) / 1e9
    return {
        "eps": len(items) / span_s,
        "stored": float(len(latencies)),
        "refused": float(intake.refused),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
    }


async def measure(ticks: int, assignments: int, seconds: float, *, rate: float = 1_000.0) -> dict[str, Any]:
    """Both paths in one run (see the module docstring), each on assignments of its own (the intake
    refuses intervals already billed): as fast as they go on a durable server and on one without
    per-write fsync, then paced at ``rate`` ticks/s for ``seconds`` on the durable one."""
    per = max(1, ticks // assignments)
    paced_per = max(1, int(rate * seconds) // assignments)
    out: dict[str, Any] = {"intake_ticks": per * assignments}
    for durable in (True, False):
        with private_nats(sync_always=durable) as server:
            settings = Settings(nats_url=server.url)
            async with await EventLog.connect(settings, name="bench-setup") as log:
                await log.ensure_streams()
                work = {
                    path: await setup(log, path, assignments) for path in ("direct", "claimed", "pd", "pc")
                }
            start_ms = time.time_ns() // 1_000_000
            await asyncio.sleep(
                max(per, paced_per + 1) * TICK_MS / 1000
            )  # usage is claimed after it happened
            label = "durable" if durable else "no fsync"
            print(
                f"intake cost, {label}: {per * assignments:,} ticks of {assignments:,} assignments",
                flush=True,
            )
            direct = await run_path(
                settings, ticks_of("direct", work["direct"], per, start_ms), via_intake=False
            )
            claimed = await run_path(
                settings, ticks_of("claimed", work["claimed"], per, start_ms), via_intake=True
            )
            key = "" if durable else "_nofsync"
            out |= {
                f"direct_tick_eps{key}": round(direct["eps"]),
                f"intake_tick_eps{key}": round(claimed["eps"]),
                f"intake_ratio{key}": round(claimed["eps"] / direct["eps"], 3),
                f"intake_refused{key}": int(claimed["refused"]),
            }
            if not durable:
                continue
            print(f"intake cost, durable: paced at {rate:g} ticks/s for {seconds:g} s", flush=True)
            pd = await run_path(
                settings, ticks_of("pd", work["pd"], paced_per, start_ms), via_intake=False, rate=rate
            )
            pc = await run_path(
                settings, ticks_of("pc", work["pc"], paced_per, start_ms), via_intake=True, rate=rate
            )
            out |= {
                "paced_tick_rate": rate,
                "direct_latency_p50_ms": round(pd["p50_ms"], 1),
                "direct_latency_p99_ms": round(pd["p99_ms"], 1),
                "intake_latency_p50_ms": round(pc["p50_ms"], 1),
                "intake_latency_p99_ms": round(pc["p99_ms"], 1),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.intake", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    ticks, assignments, seconds = (10_000, 500, 5.0) if args.quick else (50_000, 1_000, 20.0)
    figures = uvloop.run(measure(ticks, assignments, seconds, rate=RATE))
    print(table([("figure", "value"), *((k, f"{v}") for k, v in figures.items())]))
    emit({"bench": "intake", **figures, **machine()})


if __name__ == "__main__":
    main()
