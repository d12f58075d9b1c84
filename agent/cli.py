"""The ``resontech agent`` command: its flags and what it runs (wired in :mod:`ops.cli`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from core.settings import Settings, read_env_file

if TYPE_CHECKING:
    from agent.settings import AgentSettings


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the agent's flags; each overrides its ``RESONTECH_AGENT_*`` variable."""
    p.add_argument("--name", help="local agent name (default: the host name); names the state dir")
    p.add_argument("--provider", help="provider that owns this host and is paid for it (default local)")
    p.add_argument("--region", help="region label, for geo affinity")
    p.add_argument("--address", help="address other hosts reach this one at (default: the route to NATS)")
    p.add_argument(
        "--topology",
        metavar="LEVEL=NAME,...",
        help="network domains of this host, e.g. rack=r12,block=b3 (levels: clique, switch, rack, block, "
        "zone); NVML's NVLink domain is the clique",
    )
    p.add_argument("--pool", choices=("shared", "managed", "private"), help="runtime pool (default shared)")
    p.add_argument("--owner-tenant", help="organisation a managed or private worker belongs to")
    p.add_argument("--policy", dest="policy_file", metavar="FILE", help="provider policy file (YAML or TOML)")
    p.add_argument("--heartbeat", dest="heartbeat_interval_s", type=float, metavar="S", help="seconds (1.0)")
    p.add_argument("--metering", dest="metering_interval_s", type=float, metavar="S", help="seconds (10.0)")
    p.add_argument("--stop-grace", dest="stop_grace_s", type=float, metavar="S", help="SIGTERM->SIGKILL (10)")
    p.add_argument("--state-dir", help="state directory (default <data dir>/agents/<name>)")
    p.add_argument("--work-dir", help="per-assignment working dirs (default <state dir>.work, beside it)")
    p.add_argument(
        "--devices", dest="device_source", choices=("nvml", "simulated"), help="GPU source (default nvml)"
    )
    p.add_argument("--simulate", type=int, metavar="N", help="LOAD TESTS ONLY: host N simulated workers")
    p.add_argument(
        "--enroll-token",
        metavar="TOKEN",
        help="enroll with a provider's one-time token (rte_...) and run with this host's own NATS "
        "credentials; ignored once the state dir holds an enrollment",
    )
    p.add_argument(
        "--gateway",
        metavar="URL",
        help="the gateway to enroll with, or several comma-separated (default RESONTECH_GATEWAY_URL)",
    )
    p.add_argument(
        "--unsandboxed",
        action="store_const",
        const=True,
        help="LOCAL DEVELOPMENT ONLY: run workloads without the sandbox; the worker then takes only "
        "its owner's work (needs --pool private or managed and --owner-tenant)",
    )
    p.add_argument(
        "--warm-engines",
        type=int,
        metavar="N",
        help="vLLM engines kept started ahead of CPU replicas, for cold starts in seconds (default 1; "
        "0: none; only on a host without GPUs that has vLLM)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check that this host can sandbox workloads (bubblewrap, user namespaces, cgroups) and exit",
    )


_FIELDS = (
    "name",
    "provider",
    "region",
    "address",
    "pool",
    "owner_tenant",
    "policy_file",
    "heartbeat_interval_s",
    "metering_interval_s",
    "stop_grace_s",
    "state_dir",
    "work_dir",
    "device_source",
    "unsandboxed",
    "warm_engines",
)


async def run(args: argparse.Namespace, core: Settings, data_dir: Path) -> int:
    """Run one agent (or a simulated fleet) until SIGTERM or SIGINT; return the exit status."""
    from agent.settings import load_agent_settings

    settings = load_agent_settings(data_dir, {name: getattr(args, name, None) for name in _FIELDS})
    if getattr(args, "check", False):
        return check(settings)
    if args.simulate is not None and args.simulate <= 0:
        raise ConfigError(f"--simulate must be a positive number of workers, got {args.simulate}")
    if args.simulate:
        await _simulate(args.simulate, settings.heartbeat_interval_s, core)
    else:
        settings, core = await _enrolled(args, settings, core, data_dir)
        await run_agent(settings, core)
    return 0


def check(settings: AgentSettings) -> int:
    """``resontech agent --check``: say how this host would run workloads; 0 if it can sandbox them."""
    from agent.host import host_sandbox

    sandbox, problem = host_sandbox(settings)
    print(f"sandbox:  {sandbox.isolation if problem is None else 'unavailable'}")
    if sandbox.bwrap:
        print(f"bwrap:    {sandbox.bwrap}")
    limits = sandbox.cgroups.kind if sandbox.cgroups else "rlimits (no writable cgroup)"
    per_workload = f"{sandbox.processes} processes, {sandbox.open_files} open files, memory per assignment"
    print(f"limits:   {limits}; {per_workload}")
    print("read-only:", ", ".join(str(p) for p in sandbox.read_only))
    if problem is not None:
        print(f"problem:  {problem}")
        print("this host refuses tenant work until it is fixed (see README: 'A provider's host')")
        return 1
    print("ok: workloads run sandboxed")
    return 0


async def _enrolled(
    args: argparse.Namespace, settings: AgentSettings, core: Settings, data_dir: Path
) -> tuple[AgentSettings, Settings]:
    """The settings of an enrolled agent (enrolling first with ``--enroll-token``), else as given."""
    from agent import enroll

    state_dir = Path(settings.state_dir)
    enrolled = enroll.load_enrollment(state_dir)
    token = getattr(args, "enroll_token", None)
    if enrolled is not None and token:
        logging.getLogger("resontech.agent").info(
            "already enrolled as worker %s; --enroll-token not used", enrolled.worker_id
        )
    elif token:
        env_file = data_dir / "dev.env"
        from_file = read_env_file(env_file).get("RESONTECH_GATEWAY_URL") if env_file.exists() else None
        gateway = getattr(args, "gateway", None) or os.environ.get("RESONTECH_GATEWAY_URL") or from_file
        if not gateway:
            raise ConfigError(
                "--enroll-token needs the gateway's URL: --gateway URL (or RESONTECH_GATEWAY_URL)"
            )
        enrolled = await enroll.enroll_through(gateway, token, state_dir)
    if enrolled is None:
        return settings, core
    settings, core = enroll.apply(enrolled, settings, core)
    await enroll.wait_until_accepted(core)
    return settings, core


async def run_agent(settings: AgentSettings, core: Settings) -> None:
    """Run one agent: load the policy, choose devices, serve until SIGTERM or SIGINT.

    Raises:
        ConfigError: a malformed policy file or agent setting (one line naming it).
        LogUnavailable: NATS cannot be reached or the agent cannot register.
    """
    from agent.devices import select_devices
    from agent.policy import load_policy
    from agent.service import Agent

    policy = load_policy(Path(settings.policy_file)) if settings.policy_file else None
    devices = select_devices(settings)
    stop = _stop_on_signals()
    try:
        await Agent(settings, core, devices=devices, policy=policy).run(stop)
    finally:
        close = getattr(devices, "close", None)
        if close is not None:
            close()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _simulate(count: int, interval_s: float, core: Settings) -> None:
    from agent.simulated import SimulatedFleet
    from core.log import EventLog

    stop = _stop_on_signals()
    async with await EventLog.connect(core, name="resontech-simulated-fleet") as event_log:
        await SimulatedFleet(event_log, count, interval_s=interval_s).run(stop)
