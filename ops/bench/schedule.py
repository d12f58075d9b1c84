"""Benchmark scheduling: placement throughput, heartbeat ingest, failure detection with real agents.

Three parts, each in its own module, on private servers this program starts and stops:

* placement (:mod:`ops.bench.placement`): 10,000 simulated workers, 20,000 jobs, a real coordinator
  placing them, against the raw appends of the same placements without a decision
  (:mod:`ops.bench.raw_appends`), on a durable server and on one without per-write fsync;
* heartbeat ingest (:mod:`ops.bench.heartbeats`): 10,000 simulated workers beating at 1 Hz from a
  child process while a LIVENESS runner follows live here: the registry's lag, against raw publishes
  of the same beats;
* failure detection (:mod:`ops.bench.failover`): three real agents (:mod:`ops.bench.agents`) and a
  coordinator; the agent running a job is SIGKILLed: time to ``worker.lost`` and to the replacement's
  ``job.placed``;
* topology: the same placements on a fleet without network domains and on one in 200 racks (the
  ratio), and two-shard gangs that must share a rack (their rate and decision time; each such
  decision reads every feasible worker of its lane, :mod:`core.placement.topology`).

This module runs them, names their figures and prints the report.

Usage: ``python -m ops.bench.schedule [--quick]``. ``--quick``: 2,000 workers and 2,000 jobs, 2,000
heartbeating workers for 10 s, 2 trials (the durable steps it has left still wait on the disk).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import uvloop

from ops.bench.common import emit, machine, private_nats, self_peak_rss_mb, table
from ops.bench.failover import failover
from ops.bench.heartbeats import fleet_child, ingest
from ops.bench.placement import placement, placement_run

PEERS = {
    "kube-scheduler": "810 pods/s at 5,000 nodes",
    "Slurm": "500 jobs/s",
    "Nomad": "~20 s to detect a lost node",
    "Kubernetes": "50 s (node-monitor-grace-period)",
}


async def main_async(quick: bool, parts: set[str]) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # clean up on SIGTERM too
    figures: dict[str, Any] = {"bench": "schedule", "quick": quick}
    if "place" in parts:
        figures.update(await placement_figures(quick))
    if "ingest" in parts:
        figures.update(await ingest_figures(quick))
    if "failover" in parts:
        figures.update(await failover_figures(quick))
    if "topology" in parts:
        figures.update(await topology_figures(quick))
    figures["peak_rss_mb"] = round(self_peak_rss_mb())
    return {**figures, **machine()}


async def placement_figures(quick: bool) -> dict[str, Any]:
    """Placement on a durable server and on one without per-write fsync."""
    workers, jobs = (2_000, 2_000) if quick else (10_000, 20_000)
    durable = await placement(workers, jobs, sync_always=True, one_by_one=True)
    fast = await placement(workers, jobs, sync_always=False)
    return dict(
        placements_per_s=round(durable["placements_per_s"]),
        decision_p99_ms=round(durable["decision_p99_ms"], 3),
        decision_p50_ms=round(durable["decision_p50_ms"], 3),
        placed_and_started_per_s=round(durable["placed_and_started_per_s"]),
        raw_placed_and_started_per_s=round(durable["raw_placed_and_started_per_s"]),
        raw_placed_eps=round(durable["raw_placed_eps"]),
        placement_ratio=round(durable["ratio"], 3),
        nofsync_placements_per_s=round(fast["placements_per_s"]),
        nofsync_decision_p99_ms=round(fast["decision_p99_ms"], 3),
        nofsync_placed_and_started_per_s=round(fast["placed_and_started_per_s"]),
        nofsync_raw_placed_and_started_per_s=round(fast["raw_placed_and_started_per_s"]),
        nofsync_raw_placed_eps=round(fast["raw_placed_eps"]),
        nofsync_placement_ratio=round(fast["ratio"], 3),
        placement_workers=workers,
        placement_jobs=jobs,
        placement_waited=durable["waited"],
        placement_conflicts=durable["conflicts"],
        one_by_one_placements_per_s=round(durable["one_by_one_placements_per_s"]),
        one_by_one_placed_and_started_per_s=round(durable["one_by_one_placed_and_started_per_s"]),
        group_commit_ratio=round(
            durable["placements_per_s"] / max(durable["one_by_one_placements_per_s"], 1), 2
        ),
        start_commands_s=round(durable["commands_s"], 2),
    )


async def topology_figures(quick: bool) -> dict[str, Any]:
    """The same placements on a fleet without racks and on one in 200 racks (8 to a block), and
    two-shard gangs that must share a rack, each run on a fresh server without per-write fsync."""
    workers, jobs = (2_000, 2_000) if quick else (10_000, 20_000)
    runs: dict[str, dict[str, Any]] = {}
    for name, racks, in_racks, count in (
        ("flat", 0, False, jobs),
        ("racked", 200, False, jobs),
        ("gangs", 200, True, jobs // 50),
    ):
        with private_nats(sync_always=False) as server:
            runs[name] = await placement_run(server.url, workers, count, racks=racks, gangs=in_racks)
        run = runs[name]
        print(
            f"  topology, {name}: {run['placed']:,} of {count:,} placed, {run['placements_per_s']:,.0f}/s, "
            f"decision p99 {run['decision_p99_ms']:.2f} ms",
            flush=True,
        )
    flat, racked, gangs = runs["flat"], runs["racked"], runs["gangs"]
    return dict(
        topology_workers=workers,
        flat_placements_per_s=round(flat["placements_per_s"]),
        racked_placements_per_s=round(racked["placements_per_s"]),
        racked_ratio=round(racked["placements_per_s"] / max(flat["placements_per_s"], 1), 3),
        rack_gangs=jobs // 50,
        rack_gangs_placed=gangs["placed"],
        rack_gang_placements_per_s=round(gangs["placements_per_s"]),
        rack_gang_decision_p50_ms=round(gangs["decision_p50_ms"], 2),
        rack_gang_decision_p99_ms=round(gangs["decision_p99_ms"], 2),
    )


async def ingest_figures(quick: bool) -> dict[str, Any]:
    """Heartbeat ingest on a durable server, and (not with ``quick``) on one without fsync."""
    beating, seconds = (2_000, 10.0) if quick else (10_000, 30.0)
    durable = await ingest(beating, seconds, sync_always=True)
    figures: dict[str, Any] = dict(
        registry_lag_p99_s=round(durable["lag_p99_s"], 3),
        registry_lag_p50_s=round(durable["lag_p50_s"], 3),
        heartbeat_workers=beating,
        heartbeats_acked_per_s=round(durable["beats_acked_per_s"]),
        raw_heartbeats_per_s=round(durable["raw_beats_per_s"]),
        heartbeat_tick_p50_s=round(durable["tick_p50_s"], 2),
        fleet_peak_rss_mb=round(durable["fleet_rss_mb"]),
    )
    if not quick:  # the client-bound figure; --quick keeps to the shipped config
        fast = await ingest(beating, seconds, sync_always=False)
        figures.update(
            nofsync_registry_lag_p99_s=round(fast["lag_p99_s"], 3),
            nofsync_registry_lag_p50_s=round(fast["lag_p50_s"], 3),
            nofsync_heartbeats_acked_per_s=round(fast["beats_acked_per_s"]),
            nofsync_raw_heartbeats_per_s=round(fast["raw_beats_per_s"]),
            nofsync_heartbeat_tick_p50_s=round(fast["tick_p50_s"], 2),
        )
    return figures


async def failover_figures(quick: bool) -> dict[str, Any]:
    """SIGKILL trials with real agents: 2 with ``quick``, else 5."""
    found = await failover(2 if quick else 5)
    return dict(
        detect_s=round(found["detect_s"], 2),
        replace_s=round(found["replace_s"], 3),
        detect_all_s=found["detect_all_s"],
        replace_all_s=found["replace_all_s"],
        agent_peak_rss_mb=round(found["agent_rss_mb"]),
    )


def summary(f: dict[str, Any]) -> str:
    """The human-readable table: our figure, the baseline or the peers, the target."""
    rows: list[tuple[str, ...]] = [("figure", "ours", "baseline / peers (quoted, not measured)", "target")]
    if "placements_per_s" in f:
        rows += placement_rows(f)
    if "registry_lag_p99_s" in f:
        rows += ingest_rows(f)
    if "detect_s" in f:
        rows += failover_rows(f)
    if "racked_ratio" in f:
        rows += topology_rows(f)
    rss = f"peak RSS: bench process (coordinator, runners) {f['peak_rss_mb']} MB"
    if "fleet_peak_rss_mb" in f:
        rss += f", simulated fleet of {f['heartbeat_workers']:,} {f['fleet_peak_rss_mb']} MB"
    if "agent_peak_rss_mb" in f:
        rss += f", one agent {f['agent_peak_rss_mb']} MB"
    return table(rows) + "\n" + rss


def placement_rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            "durable placements/s",
            f"{f['placements_per_s']:,}",
            f"kube-scheduler {PEERS['kube-scheduler']}, Slurm {PEERS['Slurm']}",
            ">= 3,000",
        ),
        (
            "  the same, appends one by one (group commit off)",
            f"{f['one_by_one_placements_per_s']:,}",
            f"group commit x{f['group_commit_ratio']}; placed and started "
            f"{f['one_by_one_placed_and_started_per_s']:,}/s one by one",
            "-",
        ),
        (
            "  placed and started/s (2 appends each)",
            f"{f['placed_and_started_per_s']:,}",
            f"raw appends, no decision: {f['raw_placed_and_started_per_s']:,}/s "
            f"(ratio {f['placement_ratio']}); job.placed alone {f['raw_placed_eps']:,}/s",
            "-",
        ),
        ("decision p99 (ms)", f"{f['decision_p99_ms']}", f"p50 {f['decision_p50_ms']} ms", "-"),
        (
            "placements/s, no per-write fsync",
            f"{f['nofsync_placements_per_s']:,}",
            f"placed and started {f['nofsync_placed_and_started_per_s']:,}/s; raw "
            f"{f['nofsync_raw_placed_and_started_per_s']:,}/s (ratio {f['nofsync_placement_ratio']})",
            "(client-bound)",
        ),
    ]


def topology_rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    n = f"{f['topology_workers']:,}"
    return [
        (
            f"placements/s, {n} workers in 200 racks (no fsync)",
            f"{f['racked_placements_per_s']:,}",
            f"{f['flat_placements_per_s']:,} without racks (ratio {f['racked_ratio']})",
            ">= 0.9",
        ),
        (
            f"2-shard gangs sharing a rack: placed/s; decision p50 / p99 ({f['rack_gangs_placed']:,} placed)",
            f"{f['rack_gang_placements_per_s']:,}; "
            f"{f['rack_gang_decision_p50_ms']} / {f['rack_gang_decision_p99_ms']} ms",
            "-",
            "report",
        ),
    ]


def ingest_rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        (
            "registry lag p99 (s), durable",
            f"{f['registry_lag_p99_s']}",
            f"p50 {f['registry_lag_p50_s']} s; {f['heartbeats_acked_per_s']:,} beats/s acknowledged "
            f"of {f['heartbeat_workers']:,}/s offered; raw {f['raw_heartbeats_per_s']:,}/s",
            "< 1",
        )
    ]
    if "nofsync_registry_lag_p99_s" in f:
        rows += [
            (
                "registry lag p99 (s), no fsync",
                f"{f['nofsync_registry_lag_p99_s']}",
                f"{f['nofsync_heartbeats_acked_per_s']:,} beats/s acknowledged; "
                f"raw {f['nofsync_raw_heartbeats_per_s']:,}/s",
                "(client-bound)",
            )
        ]
    return rows


def failover_rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            "SIGKILL -> lost (s), median",
            f"{f['detect_s']}",
            f"trials {f['detect_all_s']}; Nomad {PEERS['Nomad']}, Kubernetes {PEERS['Kubernetes']}",
            "<= 3",
        ),
        (
            "lost -> replacement placed (s), median",
            f"{f['replace_s']}",
            f"trials {f['replace_all_s']}",
            "<= 1",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument("--only", default="place,ingest,failover,topology", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", type=int, help=argparse.SUPPRESS)  # the ingest's child process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fleet:
        uvloop.run(fleet_child(args.url, args.fleet, args.seconds))
        return
    figures = uvloop.run(main_async(args.quick, set(args.only.split(","))))
    print()
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
