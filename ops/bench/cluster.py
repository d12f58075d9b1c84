"""Benchmark the 3-node cluster: what R3 costs, how fast the JOBS leader fails over, and that no
acknowledged append is lost or stored twice when it does.

On private servers this program starts and stops (every one with ``sync_interval: always``):

* **appends, R3 against R1**: the same ``append_many`` of job events into JOBS on a one-node server
  (R1) and on a 3-node cluster on loopback (R3), both with group commit, alternating, medians
  (``r3_append_ratio``); and R3 one by one (group commit off);
* **leader kills**: a writer appends job events continuously through the cluster (64 appends in
  flight, each retried with its own event id until acknowledged, as every client of the log does)
  while the JOBS leader is SIGKILLed, 10 times; each time the killed node is started again and
  caught up before the next kill. ``failover_s`` is the time from the kill to the first
  acknowledgement of an append sent after it (median); afterwards every acknowledged event id is
  looked up in JOBS: ``acked_lost`` (acknowledged, not stored) and ``duplicates`` (stored twice);
* **placements on R3**: the schedule bench's placement run (10,000 simulated workers, 20,000 jobs,
  a real coordinator; :mod:`ops.bench.placement`) against the cluster, R3 streams.

The three nodes share this machine's two cores and one disk: a production cluster has a host and
a disk per node.

Usage: ``python -m ops.bench.cluster [--quick]`` (``--quick``: 3 kills, 2,000 workers and jobs,
smaller append runs).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import uvloop

from core.errors import AppendRejected, AppendTimeout, LogUnavailable
from core.log import EventLog, new_event_id
from core.settings import Settings
from core.streams import job_subject
from ops.bench.common import emit, machine, private_nats, process_peak_rss_mb, self_peak_rss_mb, table
from ops.bench.heartbeats import ingest_at
from ops.bench.placement import placement_run
from ops.devstack.natscluster import NatsCluster
from schemas.jobs import JobProgress

IN_FLIGHT = 64
STALL_S = 60.0
"""A kill after which no append is acknowledged for this long is a stall: no leader was elected."""
RETRY_S = 0.05


def progress(i: int) -> tuple[str, JobProgress, str]:
    """Append ``i``: a job's progress, on one of 500 jobs, with its own event id."""
    return job_subject(f"t{i % 10}", f"j{i % 500}", JobProgress), JobProgress(epoch=1, step=i), new_event_id()


async def append_rate(settings: Settings, count: int, first: int) -> float:
    """Events/s of one ``append_many`` of ``count`` job events."""
    async with await EventLog.connect(settings, name="bench-appends") as log:
        await log.ensure_streams()
        items = [progress(first + i) for i in range(count)]
        started = time.perf_counter()
        await log.append_many(items)
        return count / (time.perf_counter() - started)


async def append_figures(cluster: NatsCluster, count: int, reps: int) -> dict[str, Any]:
    """R1 (one server) against R3 (the cluster), alternating; and R3 with group commit off."""
    r1: list[float] = []
    r3: list[float] = []
    r3_one_by_one: list[float] = []
    with private_nats(sync_always=True) as single:
        for rep in range(reps):
            first = rep * count
            r1.append(await append_rate(Settings(nats_url=single.url, ack_timeout_s=60), count, first))
            r3.append(await append_rate(cluster.settings(ack_timeout_s=60), count, first))
            r3_one_by_one.append(
                await append_rate(
                    cluster.settings(ack_timeout_s=60, group_commit=False), count, first + 10**7
                )
            )
            print(
                f"  appends, rep {rep + 1}: R1 {r1[-1]:,.0f}/s, R3 {r3[-1]:,.0f}/s, "
                f"R3 one by one {r3_one_by_one[-1]:,.0f}/s",
                flush=True,
            )
    return {
        "r1_append_eps": round(statistics.median(r1)),
        "r3_append_eps": round(statistics.median(r3)),
        "r3_one_by_one_append_eps": round(statistics.median(r3_one_by_one)),
        "r3_append_ratio": round(statistics.median(r3) / statistics.median(r1), 2),
    }


class Writer:
    """Appends job events without pause, ``IN_FLIGHT`` at a time, each until acknowledged.

    Attributes:
        acked: event id -> the sequence its acknowledgement named.
        sent: (monotonic time it was first sent, time acknowledged) per acknowledged id.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.acked: dict[str, int] = {}
        self.sent: list[tuple[float, float]] = []
        self.failed_attempts = 0
        self._next = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._loop() for _ in range(IN_FLIGHT)))

    def stop(self) -> None:
        self._stop.set()

    def first_ack_after(self, t: float) -> float | None:
        """When the first append sent after ``t`` was acknowledged."""
        after = [acked for sent, acked in self.sent if sent > t]
        return min(after) if after else None

    async def _loop(self) -> None:
        while not self._stop.is_set():
            self._next += 1
            subject, event, event_id = progress(self._next)
            sent = time.monotonic()
            while True:
                try:
                    position = await self.log.append(subject, event, event_id=event_id)
                    break
                except (AppendTimeout, AppendRejected, LogUnavailable):
                    # unknown outcome: the same id again, so that it is stored once either way
                    self.failed_attempts += 1
                    await asyncio.sleep(RETRY_S)
                    sent = time.monotonic()
            self.acked[event_id] = position.seq
            self.sent.append((sent, time.monotonic()))


async def next_ack(
    cluster: NatsCluster, writer: Writer, leader: int, killed_at: float, kill: int
) -> float | None:
    """When the first append sent after the kill was acknowledged; ``None`` when the survivors elected
    no leader within :data:`STALL_S` and the killed node had to be started again (see docs/cluster.md)."""
    restarted = False
    while (acked := writer.first_ack_after(killed_at)) is None:
        if time.monotonic() - killed_at > STALL_S and not restarted:
            restarted = True
            print(f"  kill {kill + 1}: no leader in {STALL_S:g}s; n{leader + 1} started again", flush=True)
            await asyncio.to_thread(cluster.start_node, leader)
        if time.monotonic() - killed_at > 3 * STALL_S:
            raise RuntimeError("no append acknowledged within 3 minutes of killing the JOBS leader")
        await asyncio.sleep(0.01)
    return None if restarted else acked


async def leader_kills(cluster: NatsCluster, kills: int) -> dict[str, Any]:
    """Kill the JOBS leader ``kills`` times under a continuous writer; check what was acknowledged."""
    settings = cluster.settings(ack_timeout_s=2.0)
    async with await EventLog.connect(settings, name="bench-setup") as setup:
        await setup.ensure_streams()
    log = await EventLog.connect(settings, name="bench-writer")
    writer = Writer(log)
    writing = asyncio.create_task(writer.run())
    failovers: list[float] = []
    stalls: list[int] = []
    try:
        await asyncio.sleep(1.0)
        for kill in range(kills):
            leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.kill, leader)
            acked = await next_ack(cluster, writer, leader, killed_at, kill)
            if acked is None:  # no election: the killed node was started again
                stalls.append(kill + 1)
                await asyncio.to_thread(cluster.wait_stream_current, "JOBS", 60.0)
                continue
            failovers.append(acked - killed_at)
            new_leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
            print(
                f"  kill {kill + 1}: n{leader + 1} (JOBS leader) SIGKILLed; next acknowledged append "
                f"after {failovers[-1]:.2f}s, new leader n{new_leader + 1}; "
                f"{len(writer.acked):,} acknowledged so far",
                flush=True,
            )
            await asyncio.sleep(1.0)  # writing goes on with two nodes
            await asyncio.to_thread(cluster.start_node, leader)
            await asyncio.to_thread(cluster.wait_stream_current, "JOBS", 60.0)
    finally:
        writer.stop()
        await asyncio.wait_for(writing, 60)
    await asyncio.to_thread(cluster.wait_stream_current, "JOBS", 60.0)
    stored = Counter[str]()
    async for record in log.replay("JOBS"):
        stored[record.msg_id] += 1
    await log.close()
    lost = [event_id for event_id in writer.acked if event_id not in stored]
    per_node = [await node_messages(url) for url in cluster.urls]
    return {
        "kills": kills,
        "failover_s": round(statistics.median(failovers), 2),
        "failover_all_s": [round(f, 2) for f in failovers],
        "stalled_kills": stalls,
        "acked": len(writer.acked),
        "acked_lost": len(lost),
        "duplicates": sum(count - 1 for count in stored.values() if count > 1),
        "stored": sum(stored.values()),
        "retried_appends": writer.failed_attempts,
        "node_messages": per_node,
    }


async def node_messages(url: str) -> int:
    """How many messages JOBS holds, as the node at ``url`` reports it (asked through it alone)."""
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, name="bench-count")
    try:
        info = await nc.jetstream(timeout=10.0).stream_info("JOBS")
        return int(info.state.messages)
    finally:
        await nc.close()


async def run(quick: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {"bench": "cluster", "quick": quick}
    count, reps, kills = (5_000, 2, 3) if quick else (20_000, 3, 10)
    workers, jobs = (2_000, 2_000) if quick else (10_000, 20_000)
    beat_s = 10.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="resontech-bench-cluster-") as root:
        with NatsCluster(Path(root) / "appends") as cluster:
            print(f"appends: {count:,} job events x {reps}, R1 (one server) and R3 (3 nodes)", flush=True)
            figures.update(await append_figures(cluster, count, reps))
        with NatsCluster(Path(root) / "kills") as cluster:
            print(f"leader kills: {kills} SIGKILLs of the JOBS leader under a continuous writer", flush=True)
            figures.update(await leader_kills(cluster, kills))
        with NatsCluster(Path(root) / "placement") as cluster:
            print(f"placement on R3: {workers:,} workers, {jobs:,} jobs", flush=True)
            placed = await placement_run(cluster.url, workers, jobs, replicas=3)
            figures.update(
                r3_placements_per_s=round(placed["placements_per_s"]),
                r3_placed_and_started_per_s=round(placed["placed_and_started_per_s"]),
                r3_placement_waited=placed["waited"],
            )
        with NatsCluster(Path(root) / "heartbeats") as cluster:
            print(f"heartbeat ingest on R3: {workers:,} workers at 1 Hz for {beat_s:g}s", flush=True)
            beats = await ingest_at(cluster.url, 3, workers, beat_s)
            figures.update(
                r3_registry_lag_p99_s=round(beats["lag_p99_s"], 3),
                r3_registry_lag_p50_s=round(beats["lag_p50_s"], 3),
                r3_heartbeats_acked_per_s=round(beats["beats_acked_per_s"]),
                heartbeat_workers=workers,
            )
            figures["nats_peak_rss_mb"] = round(max(process_peak_rss_mb(n.pid or 0) for n in cluster.nodes))
    figures["peak_rss_mb"] = round(self_peak_rss_mb())
    return {**figures, **machine()}


def summary(f: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [
        ("figure", "ours", "baseline (same run)", "target"),
        (
            "appends/s, R3 (3 nodes), group commit",
            f"{f['r3_append_eps']:,}",
            f"R1 one server {f['r1_append_eps']:,}/s: r3_append_ratio {f['r3_append_ratio']}; "
            f"R3 one by one {f['r3_one_by_one_append_eps']:,}/s",
            "report",
        ),
        (
            "JOBS leader SIGKILL -> next acknowledged append (s), median",
            f"{f['failover_s']}",
            f"{f['kills']} kills: {f['failover_all_s']}; no election within {STALL_S:g}s after kill "
            f"{f['stalled_kills'] or 'none'}",
            "< 10",
        ),
        (
            "acknowledged appends lost / stored twice",
            f"{f['acked_lost']} / {f['duplicates']}",
            f"of {f['acked']:,} acknowledged ({f['stored']:,} read back, {f['retried_appends']:,} retries; "
            f"each node holds {'/'.join(f'{n:,}' for n in f['node_messages'])})",
            "0 / 0",
        ),
        (
            "durable placements/s on R3",
            f"{f['r3_placements_per_s']:,}",
            f"placed and started {f['r3_placed_and_started_per_s']:,}/s",
            "report",
        ),
        (
            "registry lag p99 (s), heartbeats on R3",
            f"{f['r3_registry_lag_p99_s']}",
            f"p50 {f['r3_registry_lag_p50_s']} s; {f['r3_heartbeats_acked_per_s']:,} beats/s acknowledged "
            f"of {f['heartbeat_workers']:,}/s offered",
            "< 1",
        ),
    ]
    return table(rows) + f"\npeak RSS: bench process {f['peak_rss_mb']} MB, a node {f['nats_peak_rss_mb']} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 kills and smaller sizes, about a minute")
    args = parser.parse_args()

    async def guarded() -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(args.quick)

    figures = uvloop.run(guarded())
    print()
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
