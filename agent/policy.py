"""The provider's accept/reject policy: loading the policy file, and the pure decision.

The coordinator filters workers by the same policy (it is registered as ``worker.<id>.policy_set``),
but the agent has the last word: :func:`decide` runs on every ``StartWork``, and a refusal becomes a
``job.rejected`` event with the reason.

A policy file is YAML (``.yaml`` / ``.yml``) or TOML (``.toml``) with the fields of
:class:`schemas.WorkerPolicy`; unknown keys are refused, so a typo never silently disables a rule::

    allowed_tenants: [acme, globex]          # empty or absent: every tenant
    allowed_pools: [shared, managed]         # empty or absent: every pool
    min_price_micros_per_gpu_hour: 900000    # GPU work below this price is refused
    max_concurrent: 2                        # assignments at once
    max_vram_fraction: 0.75                  # of the host's total VRAM
    maintenance:                             # weekly windows, UTC; no new work inside them
      - {weekday: 6, start_minute: 120, end_minute: 240}   # Sunday 02:00-04:00

The command carries the job's pool (``spec.pool``) and the VRAM per GPU it needs (``spec.vram_mb``;
0 means a whole GPU).
"""

from __future__ import annotations

import re
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml

from core.errors import ConfigError
from schemas.commands import StartWork
from schemas.workers import MaintenanceWindow, WorkerPolicy

_POLICY_KEYS = frozenset(f.name for f in msgspec.structs.fields(WorkerPolicy))
_WINDOW_KEYS = frozenset(f.name for f in msgspec.structs.fields(MaintenanceWindow))
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MINUTES_PER_DAY = 1440


def load_policy(path: Path) -> WorkerPolicy:
    """Read and check a policy file.

    Raises:
        ConfigError: the file is unreadable, malformed, has unknown keys or impossible values; the
            one-line message names the file and the problem.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"policy file {path}: {exc.strerror or exc}") from None
    try:
        data = _parse(path, text)
        _check_keys(data)
        policy = msgspec.convert(data, WorkerPolicy)
        _check_values(policy)
    except ValueError as exc:  # msgspec.ValidationError, YAML and TOML errors are ValueErrors too
        raise ConfigError(f"policy file {path}: {_one_line(exc)}") from None
    return policy


def _parse(path: Path, text: str) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        data: Any = tomllib.loads(text)
    elif suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
    else:
        raise ValueError("unknown format: name it .yaml, .yml or .toml")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping of policy fields, got {type(data).__name__}")
    return data


def _check_keys(data: dict[str, Any]) -> None:
    unknown = sorted(str(k) for k in data if k not in _POLICY_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_POLICY_KEYS))}")
    for i, window in enumerate(data.get("maintenance") or []):
        if isinstance(window, dict):
            extra = sorted(str(k) for k in window if k not in _WINDOW_KEYS)
            if extra:
                raise ValueError(f"maintenance[{i}]: unknown key(s) {', '.join(extra)}")


def _check_values(p: WorkerPolicy) -> None:
    if not 0.0 < p.max_vram_fraction <= 1.0:
        raise ValueError(f"max_vram_fraction must be in (0, 1], got {p.max_vram_fraction}")
    if p.min_price_micros_per_gpu_hour is not None and p.min_price_micros_per_gpu_hour < 0:
        raise ValueError("min_price_micros_per_gpu_hour must not be negative")
    if p.max_concurrent is not None and p.max_concurrent < 0:
        raise ValueError("max_concurrent must not be negative")
    for tenant in p.allowed_tenants:
        if not _TOKEN.match(tenant):
            raise ValueError(f"allowed_tenants: {tenant!r} is not a valid tenant id")
    for i, w in enumerate(p.maintenance):
        if not 0 <= w.weekday <= 6:
            raise ValueError(f"maintenance[{i}].weekday must be 0 (Monday) to 6 (Sunday)")
        if not 0 <= w.start_minute < w.end_minute <= MINUTES_PER_DAY:
            raise ValueError(f"maintenance[{i}]: need 0 <= start_minute < end_minute <= 1440")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def in_maintenance(windows: list[MaintenanceWindow], now_ns: int) -> MaintenanceWindow | None:
    """The window that contains ``now_ns`` (Unix nanoseconds, read as UTC), or ``None``."""
    now = datetime.fromtimestamp(now_ns / 1e9, UTC)
    minute = now.hour * 60 + now.minute
    for w in windows:
        if w.weekday == now.weekday() and w.start_minute <= minute < w.end_minute:
            return w
    return None


def decide(
    policy: WorkerPolicy,
    command: StartWork,
    *,
    running: int,
    now_ns: int,
    worker_pool: str = "shared",
    owner_tenant: str | None = None,
    free_gpus: int = 0,
    gpu_vram_mb: int = 0,
    vram_total_mb: int = 0,
    vram_claimed_mb: int = 0,
) -> str | None:
    """Accept or refuse one ``StartWork``. Pure: every input is an argument.

    Args:
        policy: the provider's policy.
        command: the command.
        running: assignments this agent runs now.
        now_ns: the time, Unix nanoseconds (maintenance windows are UTC).
        worker_pool / owner_tenant: the worker's pool and owner; a private worker only takes its
            owner's work.
        free_gpus: GPUs not claimed by a running assignment.
        gpu_vram_mb: VRAM of one GPU (what a GPU claims unless ``spec.vram_mb`` says less).
        vram_total_mb / vram_claimed_mb: the host's total VRAM and what running work claims.

    Returns:
        ``None`` to accept, else the reason for refusing, for ``job.rejected``.
    """
    spec = command.spec
    window = in_maintenance(policy.maintenance, now_ns)
    if window is not None:
        return (
            f"in maintenance window (weekday {window.weekday}, "
            f"minutes {window.start_minute}-{window.end_minute} UTC)"
        )
    if worker_pool == "private" and owner_tenant and command.tenant != owner_tenant:
        return f"private worker of tenant {owner_tenant}"
    if policy.allowed_tenants and command.tenant not in policy.allowed_tenants:
        return f"tenant {command.tenant} not allowed by provider policy"
    job_pool = spec.pool
    if policy.allowed_pools and job_pool is not None and job_pool not in policy.allowed_pools:
        return f"pool {job_pool} not allowed by provider policy"
    minimum = policy.min_price_micros_per_gpu_hour
    if spec.gpus > 0 and minimum is not None and command.price_micros_per_gpu_hour < minimum:
        return f"price {command.price_micros_per_gpu_hour} below the minimum {minimum} micros per GPU-hour"
    if policy.max_concurrent is not None and running >= policy.max_concurrent:
        return f"max concurrent assignments reached ({policy.max_concurrent})"
    if spec.gpus > free_gpus:
        return f"needs {spec.gpus} GPUs, {free_gpus} free"
    requested = requested_vram_mb(command, gpu_vram_mb)
    return _vram_reason(policy, requested, vram_total_mb, vram_claimed_mb)


def _vram_per_gpu(command: StartWork, gpu_vram_mb: int) -> int:
    return command.spec.vram_mb if command.spec.vram_mb > 0 else gpu_vram_mb


def _vram_reason(policy: WorkerPolicy, requested: int, total: int, claimed: int) -> str | None:
    if requested <= 0 or total <= 0:
        return None
    fraction = (claimed + requested) / total
    if fraction > policy.max_vram_fraction + 1e-9:
        return (
            f"VRAM fraction {fraction:.2f} would exceed the provider's maximum {policy.max_vram_fraction:.2f}"
        )
    return None


def requested_vram_mb(command: StartWork, gpu_vram_mb: int) -> int:
    """VRAM an accepted command claims: its GPUs x ``spec.vram_mb`` (default a whole GPU)."""
    return command.spec.gpus * _vram_per_gpu(command, gpu_vram_mb)
