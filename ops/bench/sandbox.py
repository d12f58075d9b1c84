"""Benchmark the workload sandbox: what bubblewrap, the workload's cgroup and its rlimits cost.

Both sides run the same workloads through the same runtime (:class:`agent.runtimes.ProcessRuntime`,
as the agent starts them), in the same run, alternating so that the machine's drift hits both:

* the baseline: unsandboxed (``--unsandboxed``: no bwrap, no cgroup; rlimits only);
* sandboxed: as an agent on this host runs every workload (bwrap with mount, PID, user, IPC and UTS
  namespaces, its cgroup where the host gives one, rlimits).

Figures:

* ``start_ms``: ``start()`` to the workload's first output line, for ``python -c "print('up')"``
  (the interpreter's own start is in both); ``start_ratio`` = sandboxed / baseline (medians);
* ``cpu_s``: the run time of a CPU-bound workload (pure-Python arithmetic and a NumPy matrix product,
  about 2 s here), ``cpu_ratio`` = sandboxed / baseline (medians; target <= 1.05).

Usage: ``python -m ops.bench.sandbox [--quick]``. Default: 30 starts and 5 CPU runs per side;
``--quick``: 10 and 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from agent.runtimes import ProcessRuntime, workload_env
from core.cgroups import detect
from core.sandbox import Sandbox
from ops.bench.common import emit, machine, median, table
from schemas.commands import StartWork, WorkSpec

CPU_BOUND = """
import numpy as np
total = 0
for i in range(14_000_000):
    total += i * i % 7
a = np.random.default_rng(0).random((700, 700))
for _ in range(8):
    a = (a @ a) / 700.0
print(total, float(a.sum()) > 0)
"""


async def run_once(sandbox: Sandbox, code: str, root: Path, name: str) -> tuple[float, float]:
    """Start ``code`` as a workload; (seconds to its first line, seconds to its exit)."""
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", code], memory_mb=2048)
    cmd = StartWork(
        tenant="bench", work_id=name, work_kind="job", assignment_id=name, slot=0, epoch=1, spec=spec
    )
    workdir = root / name
    env = workload_env(cmd, workdir, gpu_indices=[])
    started = time.perf_counter()
    workload = await ProcessRuntime(sandbox).start(spec, workdir, env)
    first = 0.0
    async for _ in workload.lines():
        first = first or time.perf_counter() - started
    code_ = await workload.wait()
    if code_ != 0:
        raise SystemExit(f"workload {name} failed ({code_}): {workload.log_tail()}")
    return first, time.perf_counter() - started


async def main(quick: bool) -> None:
    starts, cpu_runs = (10, 2) if quick else (30, 5)
    sandboxed = Sandbox.for_host(cgroups=detect())
    if sandboxed.bwrap is None:
        raise SystemExit("bwrap is not installed: make system")
    sides = {"baseline": Sandbox(bwrap=None), "sandboxed": sandboxed}
    start_ms: dict[str, list[float]] = {side: [] for side in sides}
    cpu_s: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="rt-bench-sandbox-") as tmp:
        root = Path(tmp)
        limits = sandboxed.cgroups.kind if sandboxed.cgroups else "rlimits"
        print(f"sandbox: bwrap {sandboxed.bwrap}, limits by {limits}")
        print(f"{starts} starts per side ...", flush=True)
        for n in range(starts):
            for side, sandbox in sides.items():
                first, _ = await run_once(sandbox, "print('up')", root, f"s-{side}-{n}")
                start_ms[side].append(first * 1000)
        print(f"{cpu_runs} CPU-bound runs per side ...", flush=True)
        for n in range(cpu_runs):
            for side, sandbox in sides.items():
                _, total = await run_once(sandbox, CPU_BOUND, root, f"c-{side}-{n}")
                cpu_s[side].append(total)
                print(f"  {side:9} run {n + 1}: {total:.2f} s", flush=True)
    figures = {
        "start_ms_baseline": round(median(start_ms["baseline"]), 1),
        "start_ms_sandboxed": round(median(start_ms["sandboxed"]), 1),
        "start_ratio": round(median(start_ms["sandboxed"]) / median(start_ms["baseline"]), 2),
        "cpu_s_baseline": round(median(cpu_s["baseline"]), 2),
        "cpu_s_sandboxed": round(median(cpu_s["sandboxed"]), 2),
        "cpu_ratio": round(median(cpu_s["sandboxed"]) / median(cpu_s["baseline"]), 3),
    }
    print(table([("figure", "value"), *((k, f"{v}") for k, v in figures.items())]))
    emit({"bench": "sandbox", "starts": starts, "cpu_runs": cpu_runs, **figures, **machine()})


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 starts and 2 CPU runs per side")
    asyncio.run(main(parser.parse_args().quick))


if __name__ == "__main__":
    cli()
