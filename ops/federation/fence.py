"""The fence: kills a federation service instance's FL servers once its claims may have lapsed, even
while the service itself cannot act (paused by SIGSTOP, starved, cut off from NATS).

The service writes, after every renewal NATS acknowledged, until when it may serve
(:func:`core.federation_claims.serving_until`) to ``<root>/serving-until``, in seconds on
``CLOCK_BOOTTIME`` (shared by every process of the host, and still running while the host is
suspended). This watchdog, a process of its own in a session of its own, reads it every
:data:`POLL_S`; past that instant it SIGKILLs every FL server process of the instance (its
``RESONTECH_FEDERATION`` tag, and a ``HOME`` that is a job directory of ``root``): the instance's
claims may be taken over a little later (the rest of the lease), and by then nothing of it serves.
A missing or unreadable file means "serve nothing". Once the service is gone (its parent pid
changed) and its deadline has passed, the watchdog exits.

Run as a script by the federation service (``python -I ops/federation/fence.py ROOT PARENT_PID``):
it imports nothing but the standard library, so that it starts fast and stays small.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

LEASE_FILE = "serving-until"
POLL_S = 0.1
TAG = "RESONTECH_FEDERATION"
"""The tag on every FL server process (:data:`ops.federation.server.TAG`; not imported, see above)."""


def now() -> float:
    """The clock the deadline is written in: ``CLOCK_BOOTTIME``, seconds."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def write_serving_until(root: Path, until: float) -> None:
    """Record (atomically) until when the instance of ``root`` may serve."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LEASE_FILE}.tmp"
    tmp.write_text(repr(until))
    tmp.replace(root / LEASE_FILE)


def serving_until(root: Path) -> float:
    """Until when the instance of ``root`` may serve (minus infinity when nothing says)."""
    try:
        return float((root / LEASE_FILE).read_text())
    except (OSError, ValueError):
        return float("-inf")


def server_pids(root: Path) -> list[int]:
    """Every process of an FL server of ``root``: tagged, with ``HOME`` a job directory
    (``root/<tenant>/<job_id>``) of it, and not one of another root's below it."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        home = next((e[5:] for e in environ if e.startswith(b"HOME=")), None)
        tagged = any(e.startswith(TAG.encode() + b"=") for e in environ)
        if tagged and home is not None and Path(os.fsdecode(home)).parent.parent == root:
            found.append(int(name))
    return found


def kill_servers(root: Path) -> list[int]:
    """SIGKILL every FL server process of ``root``; their pids."""
    pids = server_pids(root)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def watch(root: Path, parent: int) -> None:
    """Fence ``root`` while the service ``parent`` runs, then until its last deadline has passed."""
    last = float("-inf")
    while os.getppid() == parent:
        last = serving_until(root)
        if now() >= last:
            _fence(root)
        time.sleep(POLL_S)
    # The service is gone and renews nothing more: its last deadline stands (a next service on the
    # same directory writes its own, which this watchdog must not follow; that service stops this
    # watchdog when it starts).
    time.sleep(max(0.0, min(last, serving_until(root)) - now()))
    _fence(root)


def _fence(root: Path) -> None:
    killed = kill_servers(root)
    if killed:
        print(f"fence: the claims of {root} lapsed: killed {killed}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    watch(Path(sys.argv[1]).resolve(), int(sys.argv[2]))
