"""What tests of the sandbox share: the probe program (:data:`PROBE`, run as a workload, reports what it
finds), the ``/etc`` entries a workload may see, and readers of what a probe or a process shows."""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.sandbox import ETC

PROBE = Path(__file__).parent / "probe.py"
"""The probe program: a workload that reports every file or secret it can reach that it should not."""


ETC_SEEN = [f"/etc/{name}" for name in ETC]
"""The ``/etc`` entries a workload may see; the probe reports any other file there."""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def read_proc(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()
