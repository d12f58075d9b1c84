"""``resontech dispatcher run``: the options of the service and how it starts.

    resontech dispatcher run --cluster gpu-east --provider acme-gpu \\
        [--kubeconfig ~/.kube/config [--context NAME] | --in-cluster] \\
        [--pool shared|managed|private --owner-tenant T] [--region R] [--vouch] \\
        [--image IMG] [--object-store URL [--object-store-cidr CIDR]] [--state-dir DIR]

It connects to NATS with the kernel's settings (``RESONTECH_NATS_*``), as the kernel's other services
do, and keeps its state in ``<data dir>/dispatcher/<cluster>`` unless told otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from agent.identity import StateDirLock
from core.errors import ConfigError
from core.settings import Settings, version
from core.streams import token
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import Identity
from ops.dispatcher.render import add_context_arguments, context_from
from ops.dispatcher.service import Dispatcher, Timing, serve
from ops.process import service_connection

log = logging.getLogger("resontech.dispatcher")
POOLS = ("shared", "managed", "private")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``resontech dispatcher run``."""
    opt = parser.add_argument
    opt("--cluster", required=True, help="the cluster's name: the first part of its workers' ids")
    opt("--provider", required=True, help="the provider whose nodes these are")
    opt("--pool", choices=POOLS, default="shared", help="the pool of every node (default shared)")
    opt("--owner-tenant", help="the owner tenant of a managed or private pool")
    opt("--region", default="", help="the region of every node")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", type=Path, help="a kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    opt("--context", help="the kubeconfig context (default: its current one)")
    opt("--state-dir", type=Path, help="default: <data dir>/dispatcher/<cluster>")
    opt("--vouch", action="store_true", help="vouch for every node as the operator (no verification Job)")
    opt("--poll-s", type=float, default=1.0, help="seconds between rounds (default 1)")
    opt(
        "--heartbeat-s",
        type=float,
        default=10.0,
        help="seconds between heartbeats (default 10; lost after 3)",
    )
    opt("--metering-s", type=float, default=10.0, help="seconds between usage ticks (default 10)")
    add_context_arguments(parser)


def dispatcher_of(args: argparse.Namespace, settings: Settings) -> tuple[Cluster, Identity, Path, Timing]:
    """The cluster, identity, state dir and timing the options name.

    Raises:
        ConfigError: an option is wrong (the message says which).
    """
    token(args.cluster, "--cluster")
    token(args.provider, "--provider")
    if (args.pool == "shared") != (args.owner_tenant is None):
        raise ConfigError("--owner-tenant is needed with --pool managed or private, and only then")
    for name in ("poll_s", "heartbeat_s", "metering_s"):
        if not 0.05 <= getattr(args, name) <= 3600:
            raise ConfigError(f"--{name.replace('_', '-')} must be between 0.05 and 3600 seconds")
    identity = Identity(
        cluster=args.cluster,
        provider=args.provider,
        pool=args.pool,
        region=args.region,
        owner_tenant=args.owner_tenant,
        version=version(),
    )
    cluster = (
        Cluster.in_cluster()
        if args.in_cluster
        else Cluster.from_kubeconfig(args.kubeconfig, context=args.context)
    )
    state_dir = args.state_dir or Path(settings.data_dir) / "dispatcher" / args.cluster
    timing = Timing(poll_s=args.poll_s, heartbeat_s=args.heartbeat_s, metering_s=args.metering_s)
    return cluster, identity, state_dir, timing


async def run(args: argparse.Namespace, settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve the cluster the options name until SIGTERM or SIGINT (or ``stop``).

    Raises:
        ConfigError: an option is wrong, or another dispatcher holds the state dir.
    """
    ctx = context_from(args)
    cluster, identity, state_dir, timing = dispatcher_of(args, settings)
    state_dir.mkdir(parents=True, exist_ok=True)
    with state_lock(state_dir):
        await _serve(args, settings, stop, (cluster, identity, state_dir, timing), ctx)


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Hold the state dir: two dispatchers of one cluster would both apply and both report."""
    lock = StateDirLock(state_dir)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


async def _serve(
    args: argparse.Namespace,
    settings: Settings,
    stop: asyncio.Event | None,
    made: tuple[Cluster, Identity, Path, Timing],
    ctx: RenderContext,
) -> None:
    cluster, identity, state_dir, timing = made
    async with service_connection(settings, f"resontech-dispatcher-{args.cluster}", stop) as (
        event_log,
        stopped,
    ):
        dispatcher = Dispatcher(cluster, event_log, identity, ctx, state_dir, vouch=args.vouch, timing=timing)
        log.info("dispatcher of cluster %s: state in %s", args.cluster, state_dir)
        await serve(dispatcher, stopped)
