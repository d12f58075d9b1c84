"""What every benchmark shares: a private nats-server, medians, peak RSS, the closing JSON line."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ops.devstack.natsserver import NatsServer


@contextmanager
def private_nats(*, sync_always: bool = True) -> Iterator[NatsServer]:
    """A nats-server on a free loopback port with a temporary store, stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="resontech-bench-") as tmp:
        server = NatsServer(
            Path(tmp) / "store",
            max_file="20GB",
            max_memory="1GB",
            log_file=Path(tmp) / "nats.log",
            sync_always=sync_always,
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


def median(values: list[float]) -> float:
    return statistics.median(values)


def self_peak_rss_mb() -> float:
    """Peak resident set size of this process, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Start this process's peak RSS (``VmHWM``) afresh, so that :func:`process_peak_rss_mb` of our
    own pid measures one phase; ``False`` where the kernel does not allow it (``clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def process_peak_rss_mb(pid: int) -> float:
    """Peak resident set size of another process (``VmHWM``), in MB; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def machine() -> dict[str, Any]:
    """Cores and CPU model, for docs/performance.md."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    )


def emit(figures: dict[str, Any]) -> None:
    """Print the closing JSON line (always the last line of a benchmark's output)."""
    print(json.dumps(figures, sort_keys=False))
