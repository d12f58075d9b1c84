"""Pure unit tests of the agent's parts: policy, devices (NVML through a fake module), identity,
settings, the workload protocol and environment, reports and metering, state, and the process
runtime (real child processes, no server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent import host, reports
from agent.devices import NO_NVML_MESSAGE, NoGpu, NvmlDevices, SimulatedDevices, select_devices
from agent.identity import StateDirLock, worker_id
from agent.policy import decide, in_maintenance, load_policy
from agent.protocol import CheckpointLine, ProgressLine, ProtocolError, ReadyLine, parse_line
from agent.runtimes import RUNTIMES, StartFailed, workload_env
from agent.runtimes.process import ProcessRuntime, reap_orphans
from agent.settings import AgentSettings, load_agent_settings
from agent.state import CommandState, recovery_record
from core.cgroups import detect
from core.errors import ConfigError
from core.sandbox import Sandbox
from schemas.commands import StartWork, WorkSpec
from schemas.endpoints import EndpointReplicaLost
from schemas.jobs import JobFailed, JobShardCompleted
from schemas.values import Gpu, GpuTelemetry
from schemas.workers import MaintenanceWindow, WorkerPolicy

# Monday 2026-06-01 10:30 UTC
MONDAY_1030_NS = int(datetime(2026, 6, 1, 10, 30, tzinfo=UTC).timestamp()) * 1_000_000_000


def cmd(
    tenant: str = "acme", gpus: int = 0, price: int = 0, options: dict[str, str] | None = None, **kw: Any
) -> StartWork:
    return StartWork(
        tenant=tenant,
        work_id=kw.pop("work_id", "j1"),
        work_kind=kw.pop("work_kind", "job"),
        assignment_id=kw.pop("assignment_id", "a1"),
        slot=kw.pop("slot", 0),
        epoch=kw.pop("epoch", 1),
        spec=WorkSpec(runtime="process", command=["true"], gpus=gpus, options=options or {}, **kw),
        price_micros_per_gpu_hour=price,
    )


# -- policy ----------------------------------------------------------------------------------------


def test_decide_accepts_what_the_policy_allows() -> None:
    policy = WorkerPolicy(allowed_tenants=["acme"], min_price_micros_per_gpu_hour=1000, max_concurrent=2)
    assert decide(policy, cmd(gpus=1, price=1000), running=1, now_ns=MONDAY_1030_NS, free_gpus=1) is None
    assert decide(WorkerPolicy(), cmd(), running=50, now_ns=MONDAY_1030_NS) is None


@pytest.mark.parametrize(
    ("policy", "command", "kw", "reason"),
    [
        (WorkerPolicy(allowed_tenants=["acme"]), cmd("globex"), {}, "tenant globex not allowed"),
        (
            WorkerPolicy(allowed_pools=["private"]),
            cmd(pool="shared"),
            {},
            "pool shared not allowed",
        ),
        (
            WorkerPolicy(min_price_micros_per_gpu_hour=2_000_000),
            cmd(gpus=1, price=1_500_000),
            {"free_gpus": 1},
            "price 1500000 below the minimum 2000000",
        ),
        (WorkerPolicy(max_concurrent=2), cmd(), {"running": 2}, "max concurrent assignments reached (2)"),
        (WorkerPolicy(), cmd(gpus=2), {"free_gpus": 1}, "needs 2 GPUs, 1 free"),
        (
            WorkerPolicy(max_vram_fraction=0.5),
            cmd(gpus=1),
            {"free_gpus": 2, "gpu_vram_mb": 80_000, "vram_total_mb": 160_000, "vram_claimed_mb": 80_000},
            "VRAM fraction 1.00 would exceed the provider's maximum 0.50",
        ),
        (WorkerPolicy(), cmd("globex"), {"worker_pool": "private", "owner_tenant": "acme"}, "private worker"),
    ],
)
def test_decide_refuses_with_a_reason(
    policy: WorkerPolicy, command: StartWork, kw: dict, reason: str
) -> None:
    args = {"running": 0, "now_ns": MONDAY_1030_NS, **kw}
    refusal = decide(policy, command, **args)
    assert refusal is not None and reason in refusal


def test_decide_vram_fraction_uses_the_work_s_hint_and_ignores_cpu_work() -> None:
    policy = WorkerPolicy(max_vram_fraction=0.5)
    room = {"free_gpus": 2, "gpu_vram_mb": 80_000, "vram_total_mb": 160_000, "running": 0}
    hinted = cmd(gpus=1, vram_mb=40000)
    assert decide(policy, hinted, now_ns=MONDAY_1030_NS, vram_claimed_mb=40_000, **room) is None
    assert decide(policy, cmd(), now_ns=MONDAY_1030_NS, vram_claimed_mb=160_000, **room) is None
    # the minimum price is per GPU-hour: it does not apply to CPU work
    assert (
        decide(WorkerPolicy(min_price_micros_per_gpu_hour=10), cmd(), running=0, now_ns=MONDAY_1030_NS)
        is None
    )


def test_maintenance_windows_are_weekly_utc_and_end_exclusive() -> None:
    window = MaintenanceWindow(weekday=0, start_minute=600, end_minute=660)  # Monday 10:00-11:00
    minute = 60 * 1_000_000_000
    assert in_maintenance([window], MONDAY_1030_NS) == window
    assert in_maintenance([window], MONDAY_1030_NS - 30 * minute) == window  # 10:00 is inside
    assert in_maintenance([window], MONDAY_1030_NS + 30 * minute) is None  # 11:00 is not
    assert in_maintenance([window], MONDAY_1030_NS + 24 * 60 * minute) is None  # Tuesday
    refusal = decide(WorkerPolicy(maintenance=[window]), cmd(), running=0, now_ns=MONDAY_1030_NS)
    assert refusal == "in maintenance window (weekday 0, minutes 600-660 UTC)"


def test_load_policy_yaml_and_toml(tmp_path: Path) -> None:
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text(
        "allowed_tenants: [acme]\nallowed_pools: [shared]\nmin_price_micros_per_gpu_hour: 900000\n"
        "max_concurrent: 2\nmax_vram_fraction: 0.75\n"
        "maintenance:\n  - {weekday: 6, start_minute: 120, end_minute: 240}\n"
    )
    toml_file = tmp_path / "p.toml"
    toml_file.write_text(
        'allowed_tenants = ["acme"]\nallowed_pools = ["shared"]\nmin_price_micros_per_gpu_hour = 900000\n'
        "max_concurrent = 2\nmax_vram_fraction = 0.75\n"
        "[[maintenance]]\nweekday = 6\nstart_minute = 120\nend_minute = 240\n"
    )
    expected = WorkerPolicy(
        allowed_tenants=["acme"],
        allowed_pools=["shared"],
        min_price_micros_per_gpu_hour=900_000,
        max_concurrent=2,
        max_vram_fraction=0.75,
        maintenance=[MaintenanceWindow(weekday=6, start_minute=120, end_minute=240)],
    )
    assert load_policy(yaml_file) == expected
    assert load_policy(toml_file) == expected
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    assert load_policy(empty) == WorkerPolicy()


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("p.yaml", "allowed_tenants: [acme\n", "not valid YAML"),
        ("p.yaml", "allowed_tenant: [acme]\n", "unknown key(s) allowed_tenant"),
        (
            "p.yaml",
            "maintenance: [{weekday: 1, start_minute: 1, end_minute: 2, tz: x}]\n",
            "unknown key(s) tz",
        ),
        ("p.yaml", "max_concurrent: lots\n", "Expected `int | null`, got `str`"),
        ("p.yaml", "allowed_pools: [cheap]\n", "allowed_pools"),
        ("p.yaml", "- a list\n", "expected a mapping"),
        ("p.toml", "max_vram_fraction = 1.5\n", "max_vram_fraction must be in (0, 1]"),
        ("p.toml", "max_concurrent = \n", "Invalid value"),
        ("p.yaml", "maintenance: [{weekday: 7, start_minute: 1, end_minute: 2}]\n", "weekday"),
        (
            "p.yaml",
            "maintenance: [{weekday: 1, start_minute: 9, end_minute: 2}]\n",
            "start_minute < end_minute",
        ),
        ("p.json", "{}", "unknown format"),
    ],
)
def test_malformed_policy_is_one_config_error_naming_the_file(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    message = caught.value.message
    assert message.startswith(f"policy file {path}: ") and "\n" not in message
    assert problem in message


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_policy(tmp_path / "nope.yaml")


# -- devices ---------------------------------------------------------------------------------------


class FakeNvml:
    """The parts of the pynvml API the agent uses: GPU 0 supports everything, GPU 1 (a consumer card)
    reports no power, no ECC, no utilisation."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    MIB = 1024 * 1024

    def __init__(self) -> None:
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> Any:
        return b"NVIDIA A100-SXM4-80GB" if h == "h0" else "NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = (81_920 if h == "h0" else 24_564) * self.MIB
        return SimpleNamespace(total=total, free=total - 1024 * self.MIB, used=1024 * self.MIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 64

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        return 312_456  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, h: str, error_type: int, counter: int) -> int:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        assert (error_type, counter) == (1, 0)
        return 2

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"


def test_nvml_devices_read_inventory_telemetry_and_driver_through_the_api() -> None:
    fake = FakeNvml()
    devices = NvmlDevices.open(fake)
    assert devices.inventory() == [
        Gpu(index=0, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81_920, vram_free_mb=80_896, uuid="GPU-h0"),
        Gpu(
            index=1, model="NVIDIA GeForce RTX 4090", vram_total_mb=24_564, vram_free_mb=23_540, uuid="GPU-h1"
        ),
    ]
    assert devices.telemetry() == [
        GpuTelemetry(index=0, util_pct=87.0, mem_used_mb=1024, temp_c=64.0, power_w=312.5, ecc_errors=2),
        GpuTelemetry(index=1, util_pct=None, mem_used_mb=1024, temp_c=64.0, power_w=None, ecc_errors=None),
    ]
    assert devices.driver() == "550.54.15"
    devices.close()
    assert fake.shut_down


def test_nvml_devices_survive_a_failing_device() -> None:
    fake = FakeNvml()

    def lost(h: str) -> Any:
        raise fake.NVMLError("GPU is lost")

    fake.nvmlDeviceGetMemoryInfo = lost  # type: ignore[method-assign]
    devices = NvmlDevices(fake)
    assert [g.vram_total_mb for g in devices.inventory()] == [0, 0]
    assert all(t.mem_used_mb is None for t in devices.telemetry())


def test_no_nvml_means_zero_gpus_and_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = AgentSettings(name="a", state_dir=str(tmp_path), work_dir=str(tmp_path / "w"))
    with caplog.at_level(logging.INFO, logger="resontech.agent"):
        devices = select_devices(settings)  # the real pynvml: NVMLError_LibraryNotFound on this host
    assert isinstance(devices, NoGpu)
    assert (devices.inventory(), devices.telemetry(), devices.driver()) == ([], [], "")
    assert [r.getMessage() for r in caplog.records] == [NO_NVML_MESSAGE]


def test_simulated_devices_only_when_chosen(tmp_path: Path) -> None:
    settings = AgentSettings(
        name="a",
        state_dir=str(tmp_path),
        work_dir=str(tmp_path),
        device_source="simulated",
        simulated_gpus=2,
        simulated_gpu_model="NVIDIA H100 80GB HBM3",
        simulated_vram_mb=81_559,
    )
    devices = select_devices(settings)
    assert isinstance(devices, SimulatedDevices)
    assert [g.model for g in devices.inventory()] == ["NVIDIA H100 80GB HBM3"] * 2
    assert len(devices.telemetry()) == 2


# -- host ------------------------------------------------------------------------------------------


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


# -- identity and settings -------------------------------------------------------------------------


def test_worker_id_is_created_once_and_kept(tmp_path: Path) -> None:
    first = worker_id(tmp_path / "state")
    assert first.startswith("w-") and len(first) == 14 and first[2:].isalnum()
    assert worker_id(tmp_path / "state") == first
    assert worker_id(tmp_path / "other") != first
    (tmp_path / "state" / "worker_id").write_text("not a.token\n")
    with pytest.raises(ConfigError, match="is not a valid worker id"):
        worker_id(tmp_path / "state")


def test_state_dir_lock_refuses_a_second_agent(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path)
    lock.acquire()
    # flock locks belong to open files, so a second open file in this process conflicts too
    with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()}"):
        StateDirLock(tmp_path).acquire()
    lock.release()
    StateDirLock(tmp_path).acquire()


def test_agent_settings_env_flags_and_defaults(tmp_path: Path) -> None:
    env = {"RESONTECH_AGENT_NAME": "gpu-1", "RESONTECH_AGENT_HEARTBEAT_INTERVAL_S": "0.5"}
    s = load_agent_settings(tmp_path, {"region": "eu-west", "heartbeat_interval_s": 2.0, "pool": None}, env)
    assert (s.name, s.region, s.heartbeat_interval_s, s.metering_interval_s) == (
        "gpu-1",
        "eu-west",
        2.0,
        10.0,
    )
    assert s.state_dir == str(tmp_path / "agents" / "gpu-1")
    assert s.work_dir == str(tmp_path / "agents" / "gpu-1.work")  # beside the state dir, not in it
    assert (s.pool, s.device_source, s.policy_file) == ("shared", "nvml", None)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RESONTECH_AGENT_HEARTBEAT_INTERVAL_S": "fast"}, "RESONTECH_AGENT_HEARTBEAT_INTERVAL_S='fast'"),
        ({"RESONTECH_AGENT_POOL": "cheap"}, "RESONTECH_AGENT_POOL='cheap' is not a valid choice"),
        ({"RESONTECH_AGENT_DEVICE_SOURCE": "cuda"}, "RESONTECH_AGENT_DEVICE_SOURCE"),
        ({"RESONTECH_AGENT_NAME": "a.b"}, "RESONTECH_AGENT_NAME 'a.b' must be"),
        ({"RESONTECH_AGENT_POOL": "private"}, "OWNER_TENANT is required for a private pool"),
        ({"RESONTECH_AGENT_METERING_INTERVAL_S": "0"}, "METERING_INTERVAL_S must be between"),
    ],
)
def test_bad_agent_settings_name_the_setting(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_agent_settings(tmp_path, {}, {"RESONTECH_AGENT_NAME": "a", **env})
    assert message in caught.value.message and "\n" not in caught.value.message


# -- the workload protocol and environment ---------------------------------------------------------


def test_protocol_lines() -> None:
    assert parse_line('RESONTECH_PROGRESS {"round": 1, "loss": 0.5, "train_epoch": 1, "step": 10}') == (
        ProgressLine(round=1, loss=0.5, train_epoch=1, step=10)
    )
    assert parse_line('RESONTECH_PROGRESS {"metrics": {"acc": 0.9}, "extra": true}') == ProgressLine(
        metrics={"acc": 0.9}
    )
    assert parse_line('RESONTECH_CHECKPOINT {"object_key": "ckpt/r1.pt", "round": 1}\r\n') == CheckpointLine(
        object_key="ckpt/r1.pt", round=1
    )
    assert parse_line('RESONTECH_READY {"address": "http://127.0.0.1:8000"}') == ReadyLine(
        address="http://127.0.0.1:8000"
    )
    assert parse_line("epoch 1 loss 0.5") is None
    assert parse_line("RESONTECH_SOMETHING_ELSE {}") is None
    for bad in (
        "RESONTECH_PROGRESS {not json",
        'RESONTECH_PROGRESS {"loss": "low"}',
        "RESONTECH_CHECKPOINT {}",
        'RESONTECH_CHECKPOINT {"object_key": ""}',
        "RESONTECH_PROGRESS",
    ):
        with pytest.raises(ProtocolError):
            parse_line(bad)


def test_workload_env_is_clean_and_never_holds_credentials(tmp_path: Path) -> None:
    host_env = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "HOME": "/root",
        "RESONTECH_NATS_URL": "nats://secret:4222",
        "RESONTECH_NATS_PASSWORD": "hunter2",
        "RESONTECH_NATS_CREDS": "/etc/agent.creds",
        "RESONTECH_S3_SECRET_KEY": "s3cret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "SSH_AUTH_SOCK": "/tmp/ssh",
    }
    command = cmd(
        env={"BATCH": "32", "RESONTECH_NATS_URL": "nats://evil", "resontech_epoch": "99"},
        assignment_id="a7",
        epoch=3,
        slot=1,
    )
    env = workload_env(command, tmp_path / "a7", gpu_indices=[], host_env=host_env)
    assert env == {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "HOME": str(tmp_path / "a7"),
        "TMPDIR": str(tmp_path / "a7" / "tmp"),
        "PYTHONUNBUFFERED": "1",
        "BATCH": "32",
        "RESONTECH_ASSIGNMENT_ID": "a7",
        "RESONTECH_WORK_ID": "j1",
        "RESONTECH_WORK_KIND": "job",
        "RESONTECH_TENANT": "acme",
        "RESONTECH_SLOT": "1",
        "RESONTECH_EPOCH": "3",
        "RESONTECH_DATA_ROOT": str(tmp_path / "a7" / "data"),
        "RESONTECH_CHECKPOINT_DIR": str(tmp_path / "a7" / "checkpoints"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    gpu_env = workload_env(cmd(gpus=2, resume_from="ckpt/r3.pt"), tmp_path, gpu_indices=[1, 3], host_env={})
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert gpu_env["RESONTECH_RESUME_FROM"] == "ckpt/r3.pt"
    assert gpu_env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


# -- reports and metering --------------------------------------------------------------------------


def test_meter_ticks_are_contiguous_gpu_or_cpu_milliseconds() -> None:
    """The agent claims time only: who pays, who is paid and at which price are the kernel's."""
    cpu = reports.Meter(cmd(cpus=2.0, tier="gold"), worker_id="w-1", start_ms=1_000)
    subject, first, event_id = cpu.tick(11_000)  # type: ignore[misc]
    assert (subject, event_id) == ("meter.acme.w-1.a1.tick", "a1-tick-1")
    assert (first.start_ms, first.end_ms, first.cpu_ms, first.gpu_ms, first.epoch) == (
        1_000,
        11_000,
        20_000,
        0,
        1,
    )
    assert (first.provider, first.gpu_type, first.tier) == ("", "", "unverified")  # nothing of its own
    assert cpu.tick(11_000) is None  # empty interval
    _, second, _ = cpu.tick(12_500)  # type: ignore[misc]
    assert (second.start_ms, second.end_ms, second.cpu_ms) == (11_000, 12_500, 3_000)

    gpu = reports.Meter(cmd(gpus=4, pool="managed"), worker_id="w-1", start_ms=0)
    _, tick, _ = gpu.tick(10_000)  # type: ignore[misc]
    assert (tick.gpu_ms, tick.cpu_ms) == (40_000, 0)


def test_progress_is_coalesced_to_one_report_a_second_per_assignment() -> None:
    coalescer = reports.ProgressCoalescer(interval_s=1.0)
    assert coalescer.offer(ProgressLine(step=1, loss=0.9), 10.0) == ProgressLine(step=1, loss=0.9)
    assert coalescer.offer(ProgressLine(step=2, loss=0.8), 10.1) is None
    for step in range(3, 1000):  # a workload printing a line per step
        assert coalescer.offer(ProgressLine(step=step, metrics={"acc": step / 1000}), 10.5) is None
    assert coalescer.due_in(10.5) == pytest.approx(0.5)
    merged = coalescer.take(11.0)
    assert merged == ProgressLine(step=999, loss=0.8, metrics={"acc": 0.999})  # loss kept from step 2
    assert coalescer.take(11.0) is None and coalescer.due_in(11.0) == 0.0
    many = ProgressLine(metrics={f"m{i}": float(i) for i in range(200)})
    assert len(reports.merge_progress(ProgressLine(), many).metrics) == reports.MAX_METRICS


def test_log_tails_are_cut_to_their_last_bytes() -> None:
    assert reports.cut_tail("short") == "short"
    cut = reports.cut_tail("x" * 100_000 + "the end")
    assert (
        cut.startswith("[...]")
        and cut.endswith("the end")
        and len(cut.encode()) <= reports.LOG_TAIL_BYTES + 6
    )


def test_end_reports() -> None:
    one_shard = cmd()
    done = JobShardCompleted(assignment_id="a1", worker_id="w1", slot=0, epoch=1)
    assert reports.ended(one_shard, "exited", 0, worker_id="w1") == [
        ("job.acme.j1.shard_completed", done, "a1-shard-completed")
    ]
    assert reports.ended(one_shard, "stopped", -15) == []
    assert reports.ended(one_shard, "superseded", -9) == []
    [(subject, failed, _)] = reports.ended(cmd(slot=2, epoch=5), "exited", 3, "tail")
    assert subject == "job.acme.j1.failed"
    assert failed == JobFailed(
        reason="exit status 3", epoch=5, slot=2, log_tail="tail", retryable=False, assignment_id="a1"
    )
    [(_, killed, _)] = reports.ended(cmd(), "exited", -9)
    assert killed.reason == "killed by SIGKILL"
    [(_, stopped, _)] = reports.ended(cmd(), "agent_stopped", -15)
    assert (stopped.reason, stopped.retryable) == ("agent stopped", True)
    [(subject, lost, _)] = reports.ended(cmd(work_kind="endpoint"), "exited", 1, "oops")
    assert subject == "endpoint.acme.j1.replica_lost"
    assert lost == EndpointReplicaLost(assignment_id="a1", epoch=1, reason="exit status 1", log_tail="oops")


def test_reported_lines_become_events_of_the_right_kind() -> None:
    job = cmd(epoch=3, slot=1)
    subject, progress, event_id = reports.reported(job, ProgressLine(loss=0.1, step=5), 2)  # type: ignore[misc]
    assert (subject, event_id) == ("job.acme.j1.progress", "a1-progress-2")
    assert (progress.epoch, progress.slot, progress.loss, progress.step) == (3, 1, 0.1, 5)
    subject, checkpoint, _ = reports.reported(job, CheckpointLine(object_key="k", round=2), 3)  # type: ignore[misc]
    assert (subject, checkpoint.object_key, checkpoint.epoch, checkpoint.slot) == (
        "job.acme.j1.checkpointed",
        "k",
        3,
        1,
    )
    assert reports.reported(job, ReadyLine(address="http://x"), 4) is None
    endpoint = cmd(work_kind="endpoint")
    subject, ready, _ = reports.reported(endpoint, ReadyLine(address="http://x:1"), 1)  # type: ignore[misc]
    assert (subject, ready.address) == ("endpoint.acme.j1.replica_ready", "http://x:1")


# -- command state ---------------------------------------------------------------------------------


def test_command_state_is_bounded_and_persisted(tmp_path: Path) -> None:
    state = CommandState.load(tmp_path, max_handled=3, max_epochs=2)
    for i in range(5):
        state.mark_handled(f"c{i}")
    assert [state.handled(f"c{i}") for i in range(5)] == [False, False, True, True, True]
    assert state.observe("j1", 2) and not state.observe("j1", 1) and state.observe("j1", 2)
    assert state.observe("j2", 1) and state.observe("j3", 1)  # j1 is forgotten beyond two work ids
    state.running["a1"] = cmd()
    state.save()
    again = CommandState.load(tmp_path, max_handled=3, max_epochs=2)
    assert again.handled("c4") and not again.handled("c1")
    assert (again.epoch("j1"), again.epoch("j3")) == (0, 1)
    assert again.running == {"a1": recovery_record(cmd())}  # what its end report needs, no command
    (tmp_path / "commands.json").write_text("{broken")
    with pytest.raises(ConfigError, match=r"commands\.json is unreadable"):
        CommandState.load(tmp_path)


# -- the process runtime ---------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _pids_running(argv: list[str]) -> list[int]:
    """The host's processes whose command line is ``argv``."""
    found = []
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if pid.isdigit() and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
                a.encode() for a in argv
            ]:
                found.append(int(pid))
    return found


async def _run(code: str, workdir: Path, env: dict[str, str] | None = None) -> Any:
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", code])
    return await ProcessRuntime(Sandbox.for_host(cgroups=detect())).start(
        spec, workdir, env or {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
    )


async def test_process_runtime_captures_output_and_exit_status(tmp_path: Path) -> None:
    workload = await _run(
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)", tmp_path / "a"
    )
    lines = [line async for line in workload.lines()]
    assert sorted(lines) == ["err", "out"]
    assert await workload.wait() == 7
    assert set(workload.log_tail(40).splitlines()) == {"out", "err"}
    assert (tmp_path / "a" / "data").is_dir() and not (tmp_path / "a" / "pid").exists()


async def test_process_runtime_cancel_escalates_to_sigkill(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up'); time.sleep(60)"
    workload = await _run(code, tmp_path / "a")
    lines = workload.lines()
    assert await anext(lines) == "up"
    started = time.monotonic()
    assert await workload.cancel(0.3) == -signal.SIGKILL
    assert 0.25 <= time.monotonic() - started < 3


async def test_process_runtime_kills_what_the_workload_left_in_its_group(tmp_path: Path) -> None:
    marker = f"{secrets.randbelow(10**6) + 10**6}"  # the child's pid inside the sandbox means nothing here
    code = f"import subprocess; p = subprocess.Popen(['sleep', '{marker}']); print('left it')"
    workload = await _run(code, tmp_path / "a")
    assert [line async for line in workload.lines()] == ["left it"]
    assert await workload.wait() == 0
    await asyncio.sleep(0.1)
    assert not [pid for pid in _pids_running(["sleep", marker]) if _running(pid)]


async def test_process_runtime_start_failures(tmp_path: Path) -> None:
    runtime = RUNTIMES["process"](Sandbox.for_host())
    with pytest.raises(StartFailed, match="empty command"):
        await runtime.start(WorkSpec(runtime="process"), tmp_path, {})
    with pytest.raises(StartFailed, match="cannot start 'no-such-binary-xyz'"):
        await runtime.start(
            WorkSpec(runtime="process", command=["no-such-binary-xyz"]), tmp_path, {"PATH": "/bin"}
        )


async def test_reap_orphans_kills_only_processes_that_carry_their_assignment(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "RESONTECH_ASSIGNMENT_ID": "a1"}
    ours = await _run("import time; time.sleep(60)", tmp_path / "a1", env)
    stranger = await _run("import time; time.sleep(60)", tmp_path / "a2", {"PATH": os.environ["PATH"]})
    try:
        assert reap_orphans(tmp_path) == ["a1"]
        assert await asyncio.wait_for(ours.wait(), 5) == -signal.SIGKILL
        assert stranger.returncode is None
    finally:
        await stranger.cancel(0.1)
