"""The host's readings (:mod:`agent.host`) from /proc."""

from __future__ import annotations

from pathlib import Path

from agent import host


def test_host_readings_from_proc(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:  2048000 kB\nMemFree:  100 kB\nMemAvailable:  1024000 kB\n")
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    assert host.memory_total_mb(tmp_path) == 2000
    assert host.memory_used_mb(tmp_path) == 1000
    load = host.CpuLoad(tmp_path)
    (tmp_path / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")  # +100 busy, +100 idle
    assert load.percent() == 50.0
    assert load.percent() == 0.0
    assert host.cpu_count() >= 1
    assert host.memory_total_mb(tmp_path / "missing") == 0
