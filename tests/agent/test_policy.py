"""Pure unit tests of the agent's parts: policy, devices (NVML through a fake module), identity,
settings, the workload protocol and environment, reports and metering, state, and the process
runtime (real child processes, no server)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.policy import decide, in_maintenance, load_policy
from core.errors import ConfigError
from schemas.commands import StartWork
from schemas.workers import MaintenanceWindow, WorkerPolicy
from tests.support.agent_commands import cmd

# Monday 2026-06-01 10:30 UTC
MONDAY_1030_NS = int(datetime(2026, 6, 1, 10, 30, tzinfo=UTC).timestamp()) * 1_000_000_000


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


# -- host ------------------------------------------------------------------------------------------


# -- identity and settings -------------------------------------------------------------------------


# -- the workload protocol and environment ---------------------------------------------------------


# -- reports and metering --------------------------------------------------------------------------


# -- command state ---------------------------------------------------------------------------------


# -- the process runtime ---------------------------------------------------------------------------
