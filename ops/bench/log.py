"""Benchmark the event log: our append path and projection rebuild against raw nats-py, same run.

Appends: raw ``js.publish_async`` with pre-encoded payloads and pre-generated ``Nats-Msg-Id``
headers (the client's ceiling for the same messages) against :meth:`EventLog.append_many` given
event objects (it encodes them, generates ids, tracks every acknowledgement with a deadline).

Rebuild: a raw ordered push consumer with a callback that only counts (the client's ceiling for
reading the stream) against :func:`projections.runner.rebuild` of the billing ledger, which decodes
every usage tick, prices it with integer arithmetic and folds it into invoice lines.

Usage: ``python -m ops.bench.log [--quick]``. Repetitions alternate raw and ours; figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import nats
import uvloop

from core.log import EventLog, new_event_id
from core.settings import Settings
from core.streams import metering_subject
from ops.bench.common import emit, machine, median, private_nats, process_peak_rss_mb, self_peak_rss_mb, table
from projections import LEDGER
from projections.runner import rebuild
from schemas import UsageTick, encode

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


async def raw_replay(nc: nats.NATS, total: int) -> float:
    js = nc.jetstream()
    done = asyncio.Event()
    seen = 0

    async def count(msg: object) -> None:
        nonlocal seen
        seen += 1
        if seen >= total:
            done.set()

    started = time.perf_counter()
    sub = await js.subscribe("meter.>", stream="METERING", cb=count, ordered_consumer=True)
    await done.wait()
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return total / elapsed


async def our_rebuild(log: EventLog, total: int) -> tuple[float, int]:
    started = time.perf_counter()
    state, last = await rebuild(log, LEDGER)
    elapsed = time.perf_counter() - started
    assert last == total, (last, total)
    return total / elapsed, len(state.lines)


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


async def compare_replays(url: str, total: int, reps: int) -> tuple[list[float], list[float], int]:
    """Alternate a raw ordered-consumer read and our ledger rebuild of the whole METERING stream."""
    log = await EventLog.connect(Settings(nats_url=url), name="bench-ours")
    nc = await nats.connect(url, name="bench-raw")
    raw_rates, our_rates = [], []
    lines = 0
    for rep in range(reps):
        raw_rates.append(await raw_replay(nc, total))
        rate, lines = await our_rebuild(log, total)
        our_rates.append(rate)
        print(
            f"  replay rep {rep + 1}: raw {raw_rates[-1]:,.0f}/s  rebuild {our_rates[-1]:,.0f}/s", flush=True
        )
    await nc.close()
    await log.close()
    return raw_rates, our_rates, lines


async def run(quick: bool) -> dict[str, object]:
    reps = 3
    batch = 20_000 if quick else 100_000
    target = 100_000 if quick else 500_000
    print("client path (server without per-write fsync, so the client is the bottleneck):", flush=True)
    with private_nats(sync_always=False) as server:
        raw_appends, our_appends = await compare_appends(server.url, batch, reps)
        total = 2 * reps * batch
        if total < target:  # the rebuild is measured over at least `target` events
            async with await EventLog.connect(Settings(nats_url=server.url, ack_timeout_s=60.0)) as log:
                await log.append_many((subject(i), tick(i)) for i in range(total, target))
            total = target
        raw_replays, our_replays, lines = await compare_replays(server.url, total, reps)
        server_rss = process_peak_rss_mb(server.pid or 0)
    durable_batch = 2_000 if quick else 5_000
    print(
        "durable (the shipped config: sync_interval always, every acknowledged append is on disk):",
        flush=True,
    )
    with private_nats(sync_always=True) as server:
        durable_raw, durable_ours = await compare_appends(server.url, durable_batch, reps)
    append_eps, raw_append_eps = median(our_appends), median(raw_appends)
    replay_eps, raw_replay_eps = median(our_replays), median(raw_replays)
    return {
        "bench": "log",
        "quick": quick,
        "append_eps": round(append_eps),
        "raw_append_eps": round(raw_append_eps),
        "append_ratio": round(append_eps / raw_append_eps, 2),
        "replay_eps": round(replay_eps),
        "raw_replay_eps": round(raw_replay_eps),
        "replay_ratio": round(replay_eps / raw_replay_eps, 2),
        "replay_events": total,
        "ledger_lines": lines,
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
                    "rebuild (events/s)",
                    f"{figures['replay_eps']:,}",
                    f"{figures['raw_replay_eps']:,}",
                    f"{figures['replay_ratio']}",
                    ">= 0.70",
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
        f"rebuild over {figures['replay_events']:,} usage ticks "
        f"into {figures['ledger_lines']:,} invoice lines; "
        f"peak RSS: bench {figures['peak_rss_mb']} MB, nats-server {figures['nats_server_peak_rss_mb']} MB"
    )
    emit(figures)


if __name__ == "__main__":
    main()
