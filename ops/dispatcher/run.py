"""``resontech dispatcher enroll|run|revoke``: the options of the service, how it starts, and the
operator's enrollment of a cluster.

    resontech dispatcher enroll --cluster gpu-east --provider acme-gpu \\
        [--pool shared|managed|private --owner-tenant T] [--region R] --out dispatcher.json
    resontech dispatcher run --credentials dispatcher.json \\
        [--kubeconfig ~/.kube/config [--context NAME] | --in-cluster] \\
        [--image IMG] [--object-store URL [--object-store-cidr CIDR]] [--state-dir DIR]
    resontech dispatcher revoke --cluster gpu-east

``enroll`` (the operator, with the kernel's credentials) writes the cluster's own credentials; ``run
--credentials`` connects with them: a NATS user with exactly its nodes' agent permissions
(:mod:`ops.dispatcher.credentials`). Without ``--credentials``, ``run`` takes the identity from
``--cluster --provider [--pool --owner-tenant --region]`` and connects with the kernel's settings
(``RESONTECH_NATS_*``), as the kernel's other services do (development, ``--vouch``). It keeps its
state in ``<data dir>/dispatcher/<cluster>`` unless told otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from agent.identity import StateDirLock
from core.errors import ConfigError, EnrollmentRefused
from core.log import EventLog
from core.natsauth import dispatcher_user
from core.settings import Settings, version
from core.streams import token
from ops.dispatcher import credentials
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import Identity
from ops.dispatcher.render import add_context_arguments, context_from
from ops.dispatcher.service import Dispatcher, Timing, serve
from ops.enrollment import enroll_cluster, revoke_cluster
from ops.process import service_connection

log = logging.getLogger("resontech.dispatcher")
POOLS = ("shared", "managed", "private")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``resontech dispatcher run``."""
    opt = parser.add_argument
    opt("--credentials", type=Path, help="the cluster's own credentials (`resontech dispatcher enroll`)")
    add_identity_arguments(parser, required=False)
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


def add_identity_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The cluster and the terms its nodes enroll under (``enroll``; ``run`` without credentials)."""
    opt = parser.add_argument
    opt("--cluster", required=required, help="the cluster's name: the first part of its workers' ids")
    opt("--provider", required=required, help="the provider whose nodes these are")
    opt("--pool", choices=POOLS, default="shared", help="the pool of every node (default shared)")
    opt("--owner-tenant", help="the owner tenant of a managed or private pool")
    opt("--region", default="", help="the region of every node")


def identity_of(args: argparse.Namespace) -> Identity:
    """The identity ``--cluster --provider --pool --owner-tenant --region`` name.

    Raises:
        ConfigError: one is missing or wrong.
    """
    if not args.cluster or not args.provider:
        raise ConfigError("--cluster and --provider are needed (or --credentials from `dispatcher enroll`)")
    token(args.cluster, "--cluster")
    token(args.provider, "--provider")
    if (args.pool == "shared") != (args.owner_tenant is None):
        raise ConfigError("--owner-tenant is needed with --pool managed or private, and only then")
    return Identity(
        cluster=args.cluster,
        provider=args.provider,
        pool=args.pool,
        region=args.region,
        owner_tenant=args.owner_tenant,
        version=version(),
    )


def dispatcher_of(args: argparse.Namespace, settings: Settings) -> tuple[Cluster, Identity, Path, Timing]:
    """The cluster, identity, state dir and timing the options name.

    Raises:
        ConfigError: an option is wrong (the message says which).
    """
    if args.credentials is not None:
        if args.cluster or args.provider or args.owner_tenant or args.region or args.pool != "shared":
            raise ConfigError("with --credentials, the cluster and its terms come from the file")
        if args.vouch:
            raise ConfigError(
                "--vouch needs the kernel's credentials; with --credentials a Job verifies each node"
            )
        identity = credentials.read(args.credentials).identity(version())
    else:
        identity = identity_of(args)
    for name in ("poll_s", "heartbeat_s", "metering_s"):
        if not 0.05 <= getattr(args, name) <= 3600:
            raise ConfigError(f"--{name.replace('_', '-')} must be between 0.05 and 3600 seconds")
    cluster = (
        Cluster.in_cluster()
        if args.in_cluster
        else Cluster.from_kubeconfig(args.kubeconfig, context=args.context)
    )
    state_dir = args.state_dir or Path(settings.data_dir) / "dispatcher" / identity.cluster
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
    own = args.credentials is not None
    if own:
        settings = credentials.read(args.credentials).connection(settings)
    async with service_connection(settings, f"resontech-dispatcher-{identity.cluster}", stop) as (
        event_log,
        stopped,
    ):
        dispatcher = Dispatcher(
            cluster, event_log, identity, ctx, state_dir, vouch=args.vouch, timing=timing, own_user=own
        )
        user = "its own NATS user" if own else "the kernel's credentials"
        log.info("dispatcher of cluster %s, with %s: state in %s", identity.cluster, user, state_dir)
        await serve(dispatcher, stopped)


async def enroll(args: argparse.Namespace, settings: Settings) -> str:
    """``resontech dispatcher enroll``: record the cluster's enrollment as the operator and write its
    credentials to ``--out``; what to tell the operator.

    Raises:
        ConfigError: an option is wrong, or the kernel refuses the enrollment (the message says why).
    """
    identity = identity_of(args)
    async with await EventLog.connect(settings, name="resontech-dispatcher-enroll") as event_log:
        try:
            made = await enroll_cluster(
                event_log,
                identity.cluster,
                provider=identity.provider,
                pool=identity.pool,
                region=identity.region,
                owner_tenant=identity.owner_tenant,
            )
        except EnrollmentRefused as exc:
            raise ConfigError(exc.message) from None
    assert made.password is not None  # a fresh one: rotate is the default
    written = credentials.DispatcherCredentials(
        cluster=identity.cluster,
        provider=identity.provider,
        pool=identity.pool,
        region=identity.region,
        owner_tenant=identity.owner_tenant,
        nats_user=dispatcher_user(identity.cluster),
        nats_password=made.password,
    )
    credentials.write(args.out, written)
    return (
        f"cluster {identity.cluster} enrolled (provider {identity.provider}, pool {identity.pool}); its "
        f"credentials are in {args.out} (any earlier ones no longer work). Run:\n"
        f"  resontech dispatcher run --credentials {args.out} --kubeconfig ..."
    )


async def revoke(args: argparse.Namespace, settings: Settings) -> str:
    """``resontech dispatcher revoke``: the cluster's credentials stop working; what happened."""
    async with await EventLog.connect(settings, name="resontech-dispatcher-revoke") as event_log:
        revoked = await revoke_cluster(event_log, args.cluster)
    if not revoked:
        raise ConfigError(f"cluster {args.cluster} has no live enrollment")
    return f"cluster {args.cluster}: its dispatcher's credentials are revoked (its nodes fall silent)"
