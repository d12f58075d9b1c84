"""Heartbeat ingest: a simulated fleet beats at 1 Hz while a registry follows live (part of
``python -m ops.bench.schedule``).

10,000 simulated workers heartbeat at 1 Hz from a child process (a tenth of them every 0.1 s, one
``append_many`` per slice, as independent agents' beats spread over the second; the child is
``python -m ops.bench.schedule --fleet N``, running :func:`fleet_child`); a LIVENESS
:class:`projections.runner.ProjectionRunner` follows live in this process. A beat's lag is the time
it is applied minus its server store time. The baseline: one beat of every worker published with raw
nats-py ``js.publish``, awaited in parallel (what the server stores per second,
:func:`ops.bench.raw_appends.raw_beats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.simulated import BEAT_SLICES, SimulatedFleet
from core.log import EventLog
from core.settings import Settings
from ops.bench.agents import REPO, child_env, stop_child
from ops.bench.common import private_nats, process_peak_rss_mb
from ops.bench.quantiles import nearest_rank
from ops.bench.raw_appends import raw_beats
from projections import LIVENESS
from projections.runner import ProjectionRunner


async def fleet_child(url: str, workers: int, seconds: float) -> None:
    """Child process: ``workers`` simulated workers heartbeating at 1 Hz for ``seconds`` (or until
    SIGTERM); prints one JSON line when registered and one with its counts at the end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await EventLog.connect(Settings(nats_url=url, ack_timeout_s=30.0), name="bench-fleet") as log:
        fleet = SimulatedFleet(log, workers, interval_s=1.0, seed=11)
        await fleet.register()
        print(json.dumps({"registered": workers}), flush=True)
        ticks: list[float] = []  # how long one slice's append took
        step = fleet.interval_s / BEAT_SLICES
        started = next_at = loop.time()
        while not stop.is_set() and loop.time() - started < seconds:
            tick = loop.time()
            await fleet.beat(len(ticks) % BEAT_SLICES, BEAT_SLICES)
            ticks.append(loop.time() - tick)
            next_at = max(next_at + step, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), next_at - loop.time())
        elapsed = loop.time() - started
    print(
        json.dumps(
            {
                "sent": fleet.beats_sent,
                "failed": fleet.beats_failed,
                "ticks": len(ticks),
                "tick_p50_s": nearest_rank(ticks, 0.5),
                "tick_max_s": max(ticks, default=0.0),
                "elapsed_s": elapsed,
                "peak_rss_mb": process_peak_rss_mb(os.getpid()),  # ru_maxrss counts the parent at fork
            }
        ),
        flush=True,
    )


def start_child(*argv: str, log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m *argv`` with its stdout piped (for :func:`read_json_line`), stderr to ``log_path``."""
    with log_path.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=err, env=child_env()
        )


async def read_json_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    if not line:
        raise RuntimeError(f"child {proc.args!r} exited with {proc.wait()}")
    result: dict[str, Any] = json.loads(line)
    return result


async def follow_fleet(
    log: EventLog, url: str, workers: int, seconds: float, warmup_s: float, tmp: Path
) -> tuple[list[float], float, dict[str, Any]]:
    """Run the fleet child while a LIVENESS runner follows here: the lag of every beat stored in the
    measured window (``seconds`` after ``warmup_s``), that window's length in seconds, and the
    child's own counts."""
    runner = ProjectionRunner(log, LIVENESS, write_snapshots=False)
    lags: list[float] = []
    window: list[int] = [0, 0]  # store time range measured, ns

    def measure(record: Any) -> None:
        if window[0] <= record.time_ns <= window[1]:
            lags.append((time.time_ns() - record.time_ns) / 1e9)

    runner.listeners.append(measure)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    child = start_child(
        "ops.bench.schedule",
        "--fleet",
        str(workers),
        "--url",
        url,
        "--seconds",
        str(seconds + warmup_s),
        log_path=tmp / "fleet.log",
    )
    try:
        await read_json_line(child, 120)
        window[:] = [
            time.time_ns() + int(warmup_s * 1e9),
            time.time_ns() + int((warmup_s + seconds) * 1e9),
        ]
        fleet = await read_json_line(child, seconds + warmup_s + 120)
        await asyncio.sleep(2.0)  # the runner applies what is still on its way
    finally:
        stop_child(child)
        stop.set()
        await task
    return lags, (window[1] - window[0]) / 1e9, fleet


async def ingest(workers: int, seconds: float, *, sync_always: bool, warmup_s: float = 3.0) -> dict[str, Any]:
    """Heartbeats of ``workers`` at 1 Hz from a child process, a LIVENESS runner following here."""
    label = "durable (sync_interval: always)" if sync_always else "no per-write fsync"
    print(f"heartbeat ingest, {label}: {workers:,} workers at 1 Hz for {seconds:g}s", flush=True)
    with private_nats(sync_always=sync_always) as server:
        result = await ingest_at(server.url, 1, workers, seconds, warmup_s)
        result["nats_rss_mb"] = process_peak_rss_mb(server.pid or 0)
    return result


async def ingest_at(
    url: str, replicas: int, workers: int, seconds: float, warmup_s: float = 3.0
) -> dict[str, Any]:
    """:func:`ingest` on the servers of ``url`` (a cluster's: ``replicas`` 3)."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(nats_url=url, stream_replicas=replicas)
        async with await EventLog.connect(settings, name="bench-ingest") as log:
            await log.ensure_streams()
            lags, measured, fleet = await follow_fleet(log, url, workers, seconds, warmup_s, Path(tmp))
            raw = await raw_beats(url, SimulatedFleet(log, workers, interval_s=1.0, seed=11))
    result = {
        "workers": workers,
        "seconds": measured,
        "beats_acked_per_s": fleet["sent"] / fleet["elapsed_s"],
        "raw_beats_per_s": raw,
        "beats_stored_per_s": len(lags) / measured,
        "beats_failed": fleet["failed"],
        "tick_p50_s": fleet["tick_p50_s"],
        "tick_max_s": fleet["tick_max_s"],
        "lag_p50_s": nearest_rank(lags, 0.5),
        "lag_p99_s": nearest_rank(lags, 0.99),
        "lag_max_s": max(lags, default=0.0),
        "fleet_rss_mb": fleet["peak_rss_mb"],
    }
    print(
        f"  acknowledged {result['beats_acked_per_s']:,.0f} beats/s (1 Hz = {workers:,}/s), "
        f"{result['beats_failed']} failed; one slice ({workers // BEAT_SLICES:,} beats) takes p50 "
        f"{result['tick_p50_s']:.2f}s, max {result['tick_max_s']:.2f}s; registry lag p50 "
        f"{result['lag_p50_s'] * 1000:.0f} ms, p99 {result['lag_p99_s'] * 1000:.0f} ms, "
        f"max {result['lag_max_s'] * 1000:.0f} ms; raw js.publish of {workers:,} beats: {raw:,.0f} beats/s",
        flush=True,
    )
    return result
