"""The agent's typed settings, read once at start-up from ``RESONTECH_AGENT_*`` and CLI flags.

Flags win over the environment. A malformed value stops the agent with one line that names the
setting (:class:`~core.errors.ConfigError`). NATS and object-store settings are not here: they are the
shared :class:`core.settings.Settings` (``RESONTECH_NATS_URL``, ``RESONTECH_NATS_CREDS``...), which
the agent reads with every other process.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from core.clock import MAX_BEAT_INTERVAL_S
from core.errors import ConfigError
from schemas.values import TOPOLOGY_LEVELS, TOPOLOGY_VALUE

PREFIX = "RESONTECH_AGENT_"
DeviceSourceName = Literal["nvml", "simulated"]
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")
_POOLS = ("shared", "managed", "private")


class AgentSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of one agent process.

    Attributes:
        name: the agent's local name (default: the host name, made token-safe); names its state dir.
        state_dir: where the worker id, handled command ids and epochs live
            (default ``<data dir>/agents/<name>``).
        work_dir: per-assignment working directories (default :func:`default_work_dir`: beside the
            state dir, never in it; the two trees may not overlap).
        provider: the provider that owns the host and is paid for it (default ``local``).
        region: a free-form region label used for geo affinity (default empty).
        address: the address other hosts reach this one at, registered for the rendezvous of
            distributed jobs (default empty: the local address of the route to the NATS server).
        pool: ``shared`` (default), ``managed`` or ``private``.
        owner_tenant: the organisation a managed or private worker belongs to (required for them).
        heartbeat_interval_s: seconds between heartbeats (default 1.0).
        metering_interval_s: seconds between usage ticks of a running assignment (default 10.0).
        stop_grace_s: seconds a workload gets between SIGTERM and SIGKILL (default 10.0).
        policy_file: a provider policy file, YAML or TOML (see :mod:`agent.policy`), or ``None``.
        device_source: ``nvml`` (default; zero GPUs when NVML is missing) or ``simulated``
            (load tests only, never chosen implicitly).
        simulated_gpus / simulated_gpu_model / simulated_vram_mb: the simulated devices.
        unsandboxed: LOCAL DEVELOPMENT ONLY: run workloads without the sandbox
            (:mod:`core.sandbox`); the worker then takes only its owner's work, so it needs a
            ``managed`` or ``private`` pool and an owner.
        max_processes / max_open_files: each workload's processes (and threads) and open files
            per process (its memory is the assignment's).
        warm_engines: vLLM engines kept started ahead of the CPU replicas they will serve
            (:mod:`agent.runtimes.warm`; default 1, 0 for none); kept only on a host without GPUs
            that has vLLM.
        topology: the host's network domains as the provider labels them, ``level=name`` pairs
            separated by commas (``rack=r12,block=b3``; levels: ``clique``, ``switch``, ``rack``,
            ``block``, ``zone``). NVML's NVLink domain, when it has one, is the ``clique``.
    """

    name: str
    state_dir: str
    work_dir: str
    provider: str = "local"
    region: str = ""
    address: str = ""
    pool: Literal["shared", "managed", "private"] = "shared"
    owner_tenant: str | None = None
    heartbeat_interval_s: float = 1.0
    metering_interval_s: float = 10.0
    stop_grace_s: float = 10.0
    policy_file: str | None = None
    device_source: DeviceSourceName = "nvml"
    simulated_gpus: int = 1
    simulated_gpu_model: str = "NVIDIA A100 80GB PCIe"
    simulated_vram_mb: int = 81_920
    unsandboxed: bool = False
    max_processes: int = 4096
    max_open_files: int = 65_536
    warm_engines: int = 1
    topology: str = ""


_FIELDS = {f.name: f for f in msgspec.structs.fields(AgentSettings)}


def default_name() -> str:
    """The host name, reduced to a safe token (letters, digits, ``-``, ``_``; at most 64)."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return cleaned or "agent"


def default_work_dir(state_dir: Path) -> Path:
    """The default root of the workloads' working directories: ``<state_dir>.work``, beside the
    state dir. Never inside it: a workload's tree holds what tenant code wrote (and links it planted),
    the state dir the agent's NATS credentials and its commands; ``..`` from one never reaches the
    other, and neither is a sub-tree of the other (agent names hold no ``.``, so no agent's state dir
    is called ``<name>.work``)."""
    absolute = state_dir.absolute()
    return absolute.parent / f"{absolute.name or 'agent'}.work"


def load_agent_settings(
    data_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentSettings:
    """Build :class:`AgentSettings` from ``RESONTECH_AGENT_<FIELD>`` variables and ``overrides``.

    Args:
        data_dir: the project's data directory; the default state dir lives under it.
        overrides: values from CLI flags by field name; ``None`` values are ignored.
        env: the environment (default ``os.environ``).

    Raises:
        ConfigError: a value is malformed; the message names the setting.
    """
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    for name, field in _FIELDS.items():
        key = PREFIX + name.upper()
        if env.get(key):
            raw[name] = _convert(key, env[key], field.type)
    for name, value in (overrides or {}).items():
        if value is not None:
            raw[name] = _convert(f"--{name.replace('_', '-')}", value, _FIELDS[name].type)
    raw.setdefault("name", default_name())
    raw.setdefault("state_dir", str(data_dir / "agents" / raw["name"]))
    raw.setdefault("work_dir", str(default_work_dir(Path(raw["state_dir"]))))
    settings = msgspec.convert(raw, AgentSettings)
    _check(settings)
    return settings


def overlap(a: Path, b: Path) -> bool:
    """Whether one of two folders is the other or inside it (compared as absolute, resolved paths)."""
    a, b = a.absolute().resolve(), b.absolute().resolve()
    return a.is_relative_to(b) or b.is_relative_to(a)


def _convert(key: str, value: Any, tp: Any) -> Any:
    try:
        return msgspec.convert(value, tp, strict=False)
    except msgspec.ValidationError:
        raise ConfigError(f"{key}={value!r} is not a valid {_describe(tp)}") from None


def _describe(tp: Any) -> str:
    if getattr(tp, "__origin__", None) is Literal:
        return "choice of " + ", ".join(tp.__args__)
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def topology_of(text: str) -> dict[str, str]:
    """The ``level=name,...`` labels of :attr:`AgentSettings.topology`, by level.

    Raises:
        ConfigError: a pair is not ``level=name`` with a known level and a plain name, or a level
            comes twice.
    """
    labels: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        level, _, name = pair.partition("=")
        if level not in TOPOLOGY_LEVELS or not re.match(TOPOLOGY_VALUE, name) or level in labels:
            raise ConfigError(
                f"{PREFIX}TOPOLOGY {pair[:80]!r}: give level=name pairs, each level once, a level one of "
                f"{', '.join(TOPOLOGY_LEVELS)}, a name of letters, digits, '.', '_', ':' or '-'"
            )
        labels[level] = name
    return labels


def _check(s: AgentSettings) -> None:
    topology_of(s.topology)
    if not _TOKEN.match(s.name):
        raise ConfigError(f"{PREFIX}NAME {s.name!r} must be 1-64 letters, digits, '-' or '_'")
    if not _TOKEN.match(s.provider):
        raise ConfigError(f"{PREFIX}PROVIDER {s.provider!r} must be 1-64 letters, digits, '-' or '_'")
    if s.address and not _ADDRESS.match(s.address):
        raise ConfigError(f"{PREFIX}ADDRESS {s.address!r} must be a host name or an IP address")
    if s.owner_tenant is not None and not _TOKEN.match(s.owner_tenant):
        raise ConfigError(f"{PREFIX}OWNER_TENANT {s.owner_tenant!r} is not a valid tenant id")
    if s.pool in ("managed", "private") and not s.owner_tenant:
        raise ConfigError(f"{PREFIX}OWNER_TENANT is required for a {s.pool} pool worker")
    for name in ("heartbeat_interval_s", "metering_interval_s"):
        if not 0 < getattr(s, name) <= MAX_BEAT_INTERVAL_S:  # a longer beat is refused by the kernel
            raise ConfigError(f"{PREFIX}{name.upper()} must be between 0 and {MAX_BEAT_INTERVAL_S:g} seconds")
    if s.stop_grace_s < 0:
        raise ConfigError(f"{PREFIX}STOP_GRACE_S must not be negative")
    if overlap(Path(s.state_dir), Path(s.work_dir)):  # workloads' trees never hold the agent's state
        raise ConfigError(
            f"{PREFIX}WORK_DIR {s.work_dir!r} and {PREFIX}STATE_DIR {s.state_dir!r} must be separate trees"
        )
    if s.simulated_gpus < 0 or s.simulated_vram_mb <= 0:
        raise ConfigError(f"{PREFIX}SIMULATED_GPUS / SIMULATED_VRAM_MB must be positive")
    if s.unsandboxed and (s.pool == "shared" or not s.owner_tenant):
        raise ConfigError(
            "--unsandboxed runs only its owner's own work: give it --pool private (or managed) and "
            "--owner-tenant"
        )
    if not 16 <= s.max_processes <= 1_000_000 or not 64 <= s.max_open_files <= 1_048_576:
        raise ConfigError(f"{PREFIX}MAX_PROCESSES must be 16-1000000 and {PREFIX}MAX_OPEN_FILES 64-1048576")
    if not 0 <= s.warm_engines <= 16:
        raise ConfigError(f"{PREFIX}WARM_ENGINES must be 0-16")
    if s.pool not in _POOLS:  # unreachable through convert; kept for direct construction
        raise ConfigError(f"{PREFIX}POOL must be one of {', '.join(_POOLS)}")
