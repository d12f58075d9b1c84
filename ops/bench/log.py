"""Benchmark the event log: our append path and projection rebuild against raw nats-py, same run.

Appends: raw ``js.publish_async`` with pre-encoded payloads and pre-generated ``Nats-Msg-Id``
headers (the client's ceiling for the same messages) against :meth:`EventLog.append_many` given
event objects (it encodes them, generates ids, tracks every acknowledgement with a deadline).

Rebuild: a raw ordered push consumer with a callback that only counts (the client's ceiling for
reading the stream) against :func:`projections.runner.rebuild`, which decodes every event, wraps it
in its envelope and folds it. Two projections: ``liveness`` over HEARTBEATS (the highest-volume
stream: 10,000 workers at 1 Hz) is the headline ``replay_ratio``; the billing ``ledger`` over
METERING (the heaviest reducer: it prices every tick with integer arithmetic, dedupes it and
records its sequence on an invoice line) is reported beside it.

Appends are compared on a server without per-write fsync (so the client, not the disk, is the
bottleneck: that is what the ratio is about), and again on the shipped configuration
(``sync_interval: always``), where the disk sets the pace for both.

Usage: ``python -m ops.bench.log [--quick]``. Repetitions alternate raw and ours; figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import nats
import uvloop

from core.log import EventLog, new_event_id
from core.settings import Settings
from core.streams import heartbeat_subject, metering_subject
from ops.bench.common import emit, machine, median, private_nats, process_peak_rss_mb, self_peak_rss_mb, table
from projections import LEDGER, LIVENESS
from projections.base import Projection
from projections.runner import rebuild
from schemas import GpuTelemetry, Heartbeat, UsageTick, encode

T0_MS = 1_795_000_000_000


def tick(i: int) -> UsageTick:
    """A usage tick, unique per ``i`` (the ledger dedupes on assignment and interval start)."""
    start = T0_MS + i * 10
    return UsageTick(
        work_id=f"job-{i % 997}",
        work_kind="job",
        assignment_id=f"job-{i % 997}-a{i % 4}",
        epoch=1,
        provider=f"prov-{i % 50}",
        gpu_type=("A100", "H100", "RTX4090")[i % 3],
        pool="shared",
        start_ms=start,
        end_ms=start + 10_000,
        gpu_ms=10_000,
        tier="gold",
    )


def subject(i: int) -> str:
    return metering_subject(f"tenant{i % 20}", f"w{i % 500}")


async def raw_append(js: object, first: int, count: int) -> float:
    payloads = [
        (subject(i), encode(tick(i)), {"Nats-Msg-Id": new_event_id()}) for i in range(first, first + count)
    ]
    started = time.perf_counter()
    for subj, data, headers in payloads:
        await js.publish_async(subj, data, headers=headers)  # type: ignore[attr-defined]
    await js.publish_async_completed()  # type: ignore[attr-defined]
    return count / (time.perf_counter() - started)


async def our_append(log: EventLog, first: int, count: int) -> float:
    events = [(subject(i), tick(i)) for i in range(first, first + count)]
    started = time.perf_counter()
    await log.append_many(events)
    return count / (time.perf_counter() - started)


def heartbeat(i: int) -> Heartbeat:
    """A heartbeat of one of 10,000 workers with one GPU's telemetry."""
    gpu = GpuTelemetry(index=0, util_pct=float(i % 100), mem_used_mb=i % 80_000, temp_c=60.0, power_w=300.0)
    return Heartbeat(gpus=[gpu], cpu_pct=12.5, memory_used_mb=64_000, running=[f"job-{i % 997}-a0"])


async def raw_replay(nc: nats.NATS, stream: str, subjects: str, total: int) -> float:
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
    _, last = await rebuild(log, projection)
    elapsed = time.perf_counter() - started
    assert last == total, (last, total)
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


async def run(quick: bool) -> dict[str, object]:
    reps = 3
    batch = 20_000 if quick else 100_000
    target = 100_000 if quick else 500_000
    print("client path (server without per-write fsync, so the client is the bottleneck):", flush=True)
    with private_nats(sync_always=False) as server:
        raw_appends, our_appends = await compare_appends(server.url, batch, reps)
        ticks = 2 * reps * batch
        async with await EventLog.connect(Settings(nats_url=server.url, ack_timeout_s=60.0)) as log:
            if ticks < target:  # each rebuild is measured over at least `target` events
                await log.append_many((subject(i), tick(i)) for i in range(ticks, target))
                ticks = target
            await log.append_many((heartbeat_subject(f"w{i % 10_000}"), heartbeat(i)) for i in range(target))
        raw_beats, our_beats = await compare_replays(server.url, LIVENESS, "hb.>", target, reps)
        raw_ledger, our_ledger = await compare_replays(server.url, LEDGER, "meter.>", ticks, reps)
        server_rss = process_peak_rss_mb(server.pid or 0)
    durable_batch = 2_000 if quick else 5_000
    print(
        "durable (the shipped config: sync_interval always, every acknowledged append is on disk):",
        flush=True,
    )
    with private_nats(sync_always=True) as server:
        durable_raw, durable_ours = await compare_appends(server.url, durable_batch, reps)
    append_eps, raw_append_eps = median(our_appends), median(raw_appends)
    replay_eps, raw_replay_eps = median(our_beats), median(raw_beats)
    ledger_eps, raw_ledger_eps = median(our_ledger), median(raw_ledger)
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
        "ledger_replay_eps": round(ledger_eps),
        "ledger_raw_replay_eps": round(raw_ledger_eps),
        "ledger_replay_ratio": round(ledger_eps / raw_ledger_eps, 2),
        "ledger_replay_events": ticks,
        "durable_append_eps": round(median(durable_ours)),
        "durable_raw_append_eps": round(median(durable_raw)),
        "durable_append_ratio": round(median(durable_ours) / median(durable_raw), 2),
        "peak_rss_mb": round(self_peak_rss_mb()),
        "nats_server_peak_rss_mb": round(server_rss),
        **machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    args = parser.parse_args()
    figures = uvloop.run(run(args.quick))
    print()
    print(
        table(
            [
                ("figure", "ours", "raw nats-py", "ratio", "target"),
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
                    "durable append (events/s)",
                    f"{figures['durable_append_eps']:,}",
                    f"{figures['durable_raw_append_eps']:,}",
                    f"{figures['durable_append_ratio']}",
                    "-",
                ),
            ]
        )
    )
    print(
        f"rebuilds over {figures['replay_events']:,} heartbeats of 10,000 workers (liveness) and "
        f"{figures['ledger_replay_events']:,} usage ticks (ledger); "
        f"peak RSS: bench {figures['peak_rss_mb']} MB, nats-server {figures['nats_server_peak_rss_mb']} MB"
    )
    emit(figures)


if __name__ == "__main__":
    main()
