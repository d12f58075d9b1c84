"""Benchmark the event log: our append path and projection rebuild against raw nats-py, same run.

Appends: raw ``js.publish_async`` with pre-encoded payloads and pre-generated ``Nats-Msg-Id``
headers (the client's ceiling for the same messages) against :meth:`EventLog.append_many` given
event objects (it encodes them, generates ids, tracks every acknowledgement with a deadline).

Rebuild: a raw ordered push consumer with a callback that only counts (what nats-py's own consumer
costs to read the stream) against :func:`projections.runner.rebuild`, which reads through
:meth:`EventLog.scan`, decodes every event, wraps it in its envelope and folds it. Two projections:
``liveness`` over HEARTBEATS (the highest-volume stream: 10,000 workers at 1 Hz) is the headline
``replay_ratio``; the billing ``ledger`` over METERING (the heaviest reducer: it prices every tick
with integer arithmetic, checks it against its assignment's duplicate mark and records its sequence
in its invoice line's ranges) is rebuilt from 1,000,000 ticks, the audit target (``ledger_rebuild_s``,
< 15 s), with its peak RSS; ``EventLog.scan`` with a callback that only counts is measured on the
same ticks, so that the read path and the fold can be told apart.

The intake (:mod:`ops.bench.intake`): agents' usage ticks through the intake against the direct
append to METERING that it replaced, as fast as each goes (durable and without per-write fsync) and
paced at 1,000 ticks/s (10,000 workers metering every 10 s): each tick's latency to METERING.

The ticks are those of 5,000 assignments metered every 10 s on their own subjects (a tenth of them
an endpoint's replica, whose tokens a gateway counts as well), with a retried tick now and then, over
a month boundary.

Appends are compared on a server without per-write fsync (so the client, not the disk, is the
bottleneck: that is what the ratio is about), and again on the shipped configuration
(``sync_interval: always``), where the disk sets the pace for both.

Usage: ``python -m ops.bench.log [--quick]``. Repetitions alternate raw and ours; figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import nats
import uvloop
from nats.aio.client import Client as NATS

from core.log import EventLog, new_event_id
from core.settings import Settings
from core.streams import heartbeat_subject, metering_subject
from ops.bench import intake
from ops.bench.common import (
    emit,
    machine,
    median,
    private_nats,
    process_peak_rss_mb,
    reset_peak_rss,
    self_peak_rss_mb,
    table,
)
from projections import LEDGER, LIVENESS
from projections.base import Projection, canonical_json
from projections.runner import rebuild
from schemas._base import Event
from schemas.catalog import encode
from schemas.metering import TokensServed, UsageTick
from schemas.values import GpuTelemetry
from schemas.workers import Heartbeat

T0_MS = 1_780_272_000_000 - 1_000_000  # 1,000 s before 2026-06-01T00:00Z: billing spans two months
ASSIGNMENTS = 5_000
TICK_MS = 10_000
LEDGER_TICKS = 1_000_000
QUICK_LEDGER_TICKS = 150_000


def metered(i: int) -> tuple[str, Event]:
    """Message ``i`` of METERING: round ``i // 5,000`` of assignment ``i % 5,000``.

    Assignments come in pairs (the two shards of a job, or two replicas of an endpoint); every
    fifth pair is an endpoint, and the second of its slots carries a gateway's count of the tokens
    the first served (two gateways, taking turns). About one tick in a thousand is a retry of the
    assignment's previous interval instead of its next, which the ledger counts as a duplicate.
    """
    slot, round_ = i % ASSIGNMENTS, i // ASSIGNMENTS
    tenant, worker = f"tenant{slot % 20}", f"w{slot % 500}"
    start = T0_MS + round_ * TICK_MS
    endpoint = slot % 10 >= 8
    work = f"{'ep' if endpoint else 'job'}-{slot // 2}"
    facts: dict[str, Any] = {
        "work_id": work,
        "epoch": 1,
        "provider": f"prov-{slot % 50}",
        "gpu_type": ("A100", "H100", "RTX4090")[(slot // 2) % 3],
        "tier": "gold",
    }
    if slot % 10 == 9:
        replica = f"{work}-s0-e1"
        served = TokensServed(
            assignment_id=replica,
            start_ms=start,
            end_ms=start + TICK_MS,
            tokens=100 + i % 50,
            source=f"gateway-{round_ % 2}",
            **facts,
        )
        return metering_subject(tenant, worker, replica, TokensServed), served
    if i % 997 == 0 and round_:
        start -= TICK_MS  # an agent's retry of the interval before
    assignment = f"{work}-s{slot % 2}-e1"
    usage = UsageTick(
        work_kind="endpoint" if endpoint else "job",
        assignment_id=assignment,
        pool="shared",
        start_ms=start,
        end_ms=start + TICK_MS,
        gpu_ms=TICK_MS,
        **facts,
    )
    return metering_subject(tenant, worker, assignment, UsageTick), usage


async def raw_append(js: object, first: int, count: int) -> float:
    payloads = [
        (subject, encode(event), {"Nats-Msg-Id": new_event_id()})
        for subject, event in map(metered, range(first, first + count))
    ]
    started = time.perf_counter()
    for subj, data, headers in payloads:
        await js.publish_async(subj, data, headers=headers)  # type: ignore[attr-defined]
    await js.publish_async_completed()  # type: ignore[attr-defined]
    return count / (time.perf_counter() - started)


async def our_append(log: EventLog, first: int, count: int) -> float:
    events = [metered(i) for i in range(first, first + count)]
    started = time.perf_counter()
    await log.append_many(events)
    return count / (time.perf_counter() - started)


def heartbeat(i: int) -> Heartbeat:
    """A heartbeat of one of 10,000 workers with one GPU's telemetry."""
    gpu = GpuTelemetry(index=0, util_pct=float(i % 100), mem_used_mb=i % 80_000, temp_c=60.0, power_w=300.0)
    return Heartbeat(gpus=[gpu], cpu_pct=12.5, memory_used_mb=64_000, running=[f"job-{i % 997}-a0"])


async def raw_replay(nc: NATS, stream: str, subjects: str, total: int) -> float:
    js = nc.jetstream()
    done = asyncio.Event()
    seen = 0

    async def count(msg: object) -> None:
        nonlocal seen
        seen += 1
        if seen >= total:
            done.set()

    started = time.perf_counter()
    sub = await js.subscribe(subjects, stream=stream, cb=count, ordered_consumer=True)
    await done.wait()
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return total / elapsed


async def our_rebuild(log: EventLog, projection: Projection[Any], total: int) -> float:
    started = time.perf_counter()
    state, last = await rebuild(log, projection)
    elapsed = time.perf_counter() - started
    assert last == total, (last, total)
    if projection is LEDGER:
        assert sum(line.ticks for line in state.lines.values()) + state.duplicates == total
    return total / elapsed


async def our_scan(log: EventLog, stream: str, total: int) -> float:
    """The read path alone: :meth:`EventLog.scan` with a callback that only counts."""
    seen = 0

    def count(subject: str, seq: int, time_ns: int, msg_id: str, data: bytes) -> None:
        nonlocal seen
        seen += 1

    started = time.perf_counter()
    await log.scan(stream, count)
    elapsed = time.perf_counter() - started
    assert seen == total, (seen, total)
    return total / elapsed


async def compare_appends(url: str, batch: int, reps: int, first: int = 0) -> tuple[list[float], list[float]]:
    """Alternate raw and our appends of ``batch`` events, ``reps`` times each."""
    log = await EventLog.connect(Settings(nats_url=url, ack_timeout_s=60.0), name="bench-ours")
    await log.ensure_streams()
    nc = await nats.connect(url, name="bench-raw")
    js = nc.jetstream(publish_async_max_pending=8192)
    raw_rates, our_rates = [], []
    for rep in range(reps):
        raw_rates.append(await raw_append(js, first + 2 * rep * batch, batch))
        our_rates.append(await our_append(log, first + (2 * rep + 1) * batch, batch))
        print(f"  append rep {rep + 1}: raw {raw_rates[-1]:,.0f}/s  ours {our_rates[-1]:,.0f}/s", flush=True)
    await nc.close()
    await log.close()
    return raw_rates, our_rates


async def compare_replays(
    url: str, projection: Projection[Any], subjects: str, total: int, reps: int
) -> tuple[list[float], list[float]]:
    """Alternate a raw ordered-consumer read of the projection's stream and our rebuild of it."""
    log = await EventLog.connect(Settings(nats_url=url), name="bench-ours")
    nc = await nats.connect(url, name="bench-raw")
    raw_rates, our_rates = [], []
    for rep in range(reps):
        raw_rates.append(await raw_replay(nc, projection.stream, subjects, total))
        our_rates.append(await our_rebuild(log, projection, total))
        print(
            f"  {projection.name} rep {rep + 1}: raw {raw_rates[-1]:,.0f}/s  rebuild {our_rates[-1]:,.0f}/s",
            flush=True,
        )
    await nc.close()
    await log.close()
    return raw_rates, our_rates


async def ledger_figures(url: str, ticks: int, reps: int) -> dict[str, Any]:
    """The ledger's rebuild from ``ticks`` ticks: raw ordered consumer, our scan alone and our
    rebuild, alternating; the rebuild's peak RSS and the size of the state it folds to."""
    raw, ours = await compare_replays(url, LEDGER, "meter.>", ticks, reps)
    async with await EventLog.connect(Settings(nats_url=url), name="bench-ours") as log:
        scans = []
        for rep in range(reps):
            scans.append(await our_scan(log, "METERING", ticks))
            print(f"  METERING scan only rep {rep + 1}: {scans[-1]:,.0f}/s", flush=True)
        measured = reset_peak_rss()
        state, _ = await rebuild(log, LEDGER)
        rebuild_rss = process_peak_rss_mb(os.getpid()) if measured else 0.0
    return {
        "ledger_replay_eps": round(median(ours)),
        "ledger_raw_replay_eps": round(median(raw)),
        "ledger_replay_ratio": round(median(ours) / median(raw), 2),
        "ledger_replay_events": ticks,
        "ledger_rebuild_s": round(ticks / median(ours), 2),
        "ledger_raw_replay_s": round(ticks / median(raw), 2),
        "ledger_scan_eps": round(median(scans)),
        "ledger_scan_ratio": round(median(scans) / median(raw), 2),
        "ledger_rebuild_peak_rss_mb": round(rebuild_rss),
        "ledger_state_mb": round(len(canonical_json(state)) / 1e6, 1),
        "ledger_lines": len(state.lines),
        "ledger_marks": len(state.marks),
        "ledger_duplicates": state.duplicates,
    }


async def run(quick: bool) -> dict[str, object]:
    reps = 3
    batch = 20_000 if quick else 100_000
    target = 100_000 if quick else 500_000
    ticks = QUICK_LEDGER_TICKS if quick else LEDGER_TICKS
    print("client path (server without per-write fsync, so the client is the bottleneck):", flush=True)
    with private_nats(sync_always=False) as server:
        raw_appends, our_appends = await compare_appends(server.url, batch, reps)
        appended = 2 * reps * batch
        async with await EventLog.connect(Settings(nats_url=server.url, ack_timeout_s=60.0)) as log:
            for first in range(appended, ticks, 100_000):  # the ledger's ticks: the appended ones and more
                await log.append_many(metered(i) for i in range(first, min(ticks, first + 100_000)))
            await log.append_many((heartbeat_subject(f"w{i % 10_000}"), heartbeat(i)) for i in range(target))
        raw_beats, our_beats = await compare_replays(server.url, LIVENESS, "hb.>", target, reps)
        ledger = await ledger_figures(server.url, max(ticks, appended), reps)
        server_rss = process_peak_rss_mb(server.pid or 0)
    durable_batch = 2_000 if quick else 5_000
    print(
        "durable (the shipped config: sync_interval always, every acknowledged append is on disk):",
        flush=True,
    )
    with private_nats(sync_always=True) as server:
        durable_raw, durable_ours = await compare_appends(server.url, durable_batch, reps)
    print("the intake on the metering path (ops/bench/intake.py):", flush=True)
    intake_figures = await intake.measure(
        *((10_000, 500, 5.0) if quick else (50_000, 1_000, 20.0)), rate=intake.RATE
    )
    append_eps, raw_append_eps = median(our_appends), median(raw_appends)
    replay_eps, raw_replay_eps = median(our_beats), median(raw_beats)
    return {
        "bench": "log",
        "quick": quick,
        "append_eps": round(append_eps),
        "raw_append_eps": round(raw_append_eps),
        "append_ratio": round(append_eps / raw_append_eps, 2),
        "replay_eps": round(replay_eps),
        "raw_replay_eps": round(raw_replay_eps),
        "replay_ratio": round(replay_eps / raw_replay_eps, 2),
        "replay_projection": LIVENESS.name,
        "replay_events": target,
        **ledger,
        "durable_append_eps": round(median(durable_ours)),
        "durable_raw_append_eps": round(median(durable_raw)),
        "durable_append_ratio": round(median(durable_ours) / median(durable_raw), 2),
        "peak_rss_mb": round(self_peak_rss_mb()),
        "nats_server_peak_rss_mb": round(server_rss),
        **intake_figures,
        **machine(),
    }


def summary(figures: dict[str, Any]) -> str:
    """The human-readable report: ours against raw nats-py and the targets, then sizes and peak RSS."""
    ticks = figures["ledger_replay_events"]
    rows = [("figure", "ours", "raw nats-py", "ratio", "target"), *log_rows(figures), *intake_rows(figures)]
    sizes = (
        f"rebuilds over {figures['replay_events']:,} heartbeats of 10,000 workers (liveness) and "
        f"{ticks:,} metering ticks of 5,000 assignments (ledger: {figures['ledger_lines']:,} invoice lines, "
        f"{figures['ledger_marks']:,} duplicate marks, {figures['ledger_duplicates']:,} duplicates, state "
        f"{figures['ledger_state_mb']} MB as JSON); peak RSS: bench {figures['peak_rss_mb']} MB, during the "
        f"ledger rebuild {figures['ledger_rebuild_peak_rss_mb']} MB, "
        f"nats-server {figures['nats_server_peak_rss_mb']} MB"
    )
    return table(rows) + "\n" + sizes


def log_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """Appends and rebuilds: the log's own figures."""
    ticks = figures["ledger_replay_events"]
    return [
        (
            "append (events/s)",
            f"{figures['append_eps']:,}",
            f"{figures['raw_append_eps']:,}",
            f"{figures['append_ratio']}",
            ">= 0.80",
        ),
        (
            "liveness rebuild (events/s)",
            f"{figures['replay_eps']:,}",
            f"{figures['raw_replay_eps']:,}",
            f"{figures['replay_ratio']}",
            ">= 0.70",
        ),
        (
            "ledger rebuild (events/s)",
            f"{figures['ledger_replay_eps']:,}",
            f"{figures['ledger_raw_replay_eps']:,}",
            f"{figures['ledger_replay_ratio']}",
            "-",
        ),
        (
            f"ledger rebuild of {ticks:,} ticks (s)",
            f"{figures['ledger_rebuild_s']}",
            f"{figures['ledger_raw_replay_s']}",
            "-",
            "< 15 (1,000,000)",
        ),
        (
            "METERING scan, counting only (events/s)",
            f"{figures['ledger_scan_eps']:,}",
            f"{figures['ledger_raw_replay_eps']:,}",
            f"{figures['ledger_scan_ratio']}",
            "-",
        ),
        (
            "durable append (events/s)",
            f"{figures['durable_append_eps']:,}",
            f"{figures['durable_raw_append_eps']:,}",
            f"{figures['durable_append_ratio']}",
            "-",
        ),
    ]


def intake_rows(figures: dict[str, Any]) -> list[tuple[str, ...]]:
    """Usage ticks through the intake against the direct append (:mod:`ops.bench.intake`)."""
    return [
        (
            "usage ticks through the intake, durable (ticks/s)",
            f"{figures['intake_tick_eps']:,}",
            f"{figures['direct_tick_eps']:,} direct",
            f"{figures['intake_ratio']}",
            "-",
        ),
        (
            "the same without per-write fsync (ticks/s)",
            f"{figures['intake_tick_eps_nofsync']:,}",
            f"{figures['direct_tick_eps_nofsync']:,} direct",
            f"{figures['intake_ratio_nofsync']}",
            "-",
        ),
        (
            f"tick latency at {figures['paced_tick_rate']:g}/s, p50 / p99 (ms)",
            f"{figures['intake_latency_p50_ms']} / {figures['intake_latency_p99_ms']}",
            f"{figures['direct_latency_p50_ms']} / {figures['direct_latency_p99_ms']} direct",
            "-",
            "-",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    args = parser.parse_args()
    figures = uvloop.run(run(args.quick))
    print()
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
