"""``resontech up`` / ``resontech down``: the local dev stack in one data directory.

``up`` starts nats-server (JetStream, ``sync_interval: always``), the S3-compatible object store,
creates the streams, then starts the services as child processes. Everything lives under the data
directory::

    nats/  nats.conf      JetStream store and its generated config
    nats.agents.conf      the enrolled agents' NATS users (kept by the ``nats-auth`` service)
    nats-<n>/ ...         with ``--cluster N``: node n's store, config, agents file and pid file
    objects/              the object store: one directory per bucket
    logs/<name>.log       one log per process
    s3.secret             the object store secret, generated once and reused
    nats.secret           the kernel's NATS password, generated once and reused
    dev.env               settings for clients: ``source .resontech/dev.env``
    stack.json            what runs (pids), for ``down`` and for refusing a second ``up``

NATS runs with auth (:mod:`core.natsauth`): the services and the CLI connect as the kernel user
(``RESONTECH_NATS_USER`` / ``RESONTECH_NATS_PASSWORD`` in dev.env). The stack's own two agents are
enrolled like any provider's: at the first ``up`` the operator creates the provider ``local`` and one
enrollment token per agent through the gateway, each agent enrolls with its token and from then on
runs with its own confined credentials (kept in its state dir), which the ``nats-auth`` service adds
to the server as soon as the enrollment is in the log. What they claim goes through the intake like
any agent's.

With ``cluster=3`` (``resontech up --cluster 3``) NATS is a 3-node JetStream cluster
(:class:`~ops.devstack.natscluster.NatsCluster`, client ports ``--nats-port`` + 0, 1, 2) whose
streams have 3 replicas, and every kernel service runs twice
(:func:`~ops.devstack.services.cluster_services`): dev.env then lists every NATS URL and both
gateways' URLs.

Start-up is all or nothing: a failure prints one line and stops whatever had started. Stopping
(Ctrl-C, SIGTERM, ``down``) goes services first, then the object store, then NATS, each with
SIGTERM so that nothing acknowledged is lost.

What runs is recorded in ``stack.json`` (:mod:`ops.devstack.stackfile`); the agents' enrollment
through the gateway is :mod:`ops.devstack.enrollment`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from agent.enroll import ENROLLMENT_FILE
from core.addresses import LOOPBACK_NETWORKS
from core.errors import ResontechError
from core.files import write_private
from core.natsauth import KERNEL_USER
from core.settings import Settings
from ops.devstack.enrollment import issue_enrollment_token, wait_for_gateway
from ops.devstack.errors import DevStackError
from ops.devstack.natsserver import NatsAuth
from ops.devstack.objectstore import ObjectStoreServer
from ops.devstack.services import DEFAULT_SERVICES, GATEWAY_PORT_ENV, ServiceSpec, cluster_services
from ops.devstack.stackfile import STACK_FILE, STOP_TIMEOUT_S, live, read_state, stop_recorded, write_state
from ops.devstack.stacknats import CLUSTER_SIZES, StackNats, client_ports
from ops.ports import ensure_port_free, free_port
from ops.process import LocalServer, ensure_writable_dir, log_tail, run_async, spawn, terminate

ENV_FILE = "dev.env"
SECRET_FILE = "s3.secret"
NATS_SECRET_FILE = "nats.secret"
OPERATOR_KEY_FILE = "operator.key"
S3_ACCESS_KEY = "resontech"
CLUSTER_HELP = "run NATS as a JetStream cluster of N nodes (3 or 5) with R3 streams, and every service twice"
__all__ = ["DEFAULT_SERVICES", "ServiceSpec", "cluster_services", "down", "main", "up"]


def up(
    data_dir: Path,
    *,
    nats_port: int = 4222,
    s3_port: int = 9000,
    gateway_port: int = 8080,
    services: Sequence[ServiceSpec] | None = None,
    foreground: bool = True,
    cluster: int = 0,
) -> int:
    """Start the dev stack from ``data_dir``; in the foreground, run it until SIGINT or SIGTERM.

    Signals are only handled when called from the main thread.

    Args:
        data_dir: the stack's directory (created if missing).
        nats_port: NATS client port (0: any free port); with ``cluster``, node n's is this + n - 1.
        s3_port: object store port (0: any free port).
        gateway_port: API gateway port (0: any free port).
        services: the processes to start once the streams exist (default :data:`DEFAULT_SERVICES`;
            with ``cluster``, :func:`cluster_services`: gateway-2 on ``gateway_port + 1``).
        foreground: wait, and stop everything on a signal; if false, return once started and leave
            the processes running for :func:`down`.
        cluster: 0 (default) for one nats-server; 3 or 5: a cluster of that many, R3 streams.

    Returns:
        The exit status: 0 after a clean run, 1 if it could not start, 130 if interrupted while
        starting.
    """
    stack = _Stack(Path(data_dir).absolute(), cluster)
    if services is None:
        services = _default_services(stack.data_dir, cluster, gateway_port)
    with _SignalTrap() as trap:
        try:
            stack.check(nats_port, s3_port, gateway_port, services)
        except ResontechError as exc:
            return _fail(exc.message)
        try:
            stack.start(nats_port, s3_port, gateway_port, services)
        except BaseException as exc:
            trap.raising = False  # a second Ctrl-C must not interrupt the clean-up
            stack.stop()
            if isinstance(exc, KeyboardInterrupt):
                return _fail("interrupted during start-up; everything started was stopped", 130)
            if isinstance(exc, ResontechError):
                return _fail(exc.message)
            if isinstance(exc, Exception):
                return _fail(f"start-up failed: {type(exc).__name__}: {exc}")
            raise
        trap.raising = False  # from here on a signal asks for a clean stop
        stack.mark_ready(supervised=foreground, announce=lambda: stack.announce(foreground))
        if not foreground:
            return 0
        stack.supervise(trap.stop)
        print("stopping the dev stack...", flush=True)
        stack.stop()
        print("stopped", flush=True)
        return 0


def _default_services(data_dir: Path, cluster: int, gateway_port: int) -> Sequence[ServiceSpec]:
    if cluster not in CLUSTER_SIZES:
        return DEFAULT_SERVICES  # none or a wrong size, which check() refuses
    return cluster_services(data_dir, cluster, gateway_port + 1 if gateway_port else free_port())


def down(data_dir: Path, timeout: float = 30.0) -> int:
    """Stop the dev stack recorded in ``data_dir/stack.json``.

    A running foreground ``up`` is asked to stop (it stops everything in order); whatever is left
    (or everything, after a detached ``up``) gets SIGTERM, services first, then SIGKILL after
    10 seconds.

    Args:
        data_dir: the stack's directory.
        timeout: seconds to wait for a foreground ``up`` to finish stopping.

    Returns:
        0 if a stack was stopped, 1 if none was running.
    """
    data_dir = Path(data_dir).absolute()
    outcome = stop_recorded(data_dir, timeout)
    if outcome == "none":
        return _fail(f"no dev stack is running from {_show(data_dir)} (no {STACK_FILE})")
    if outcome == "stale":
        return _fail(f"no dev stack is running from {_show(data_dir)} (removed a stale {STACK_FILE})")
    print(f"stopped the dev stack in {_show(data_dir)}", flush=True)
    return 0


class _Stack:
    """The processes of one dev stack, started in order and stopped in reverse."""

    def __init__(self, data_dir: Path, cluster: int = 0) -> None:
        self.data_dir = data_dir
        self.logs = data_dir / "logs"
        self.size = cluster
        self.nats: StackNats | None = None
        self.s3: ObjectStoreServer | None = None
        self.services: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self._reported: set[str] = set()
        self._wrote_state = False
        self._supervised = True

    def check(self, nats_port: int, s3_port: int, gateway_port: int, services: Sequence[ServiceSpec]) -> None:
        """Refuse early, before anything starts: unwritable dir, a stack already running, ports."""
        if self.size and self.size not in CLUSTER_SIZES:
            raise DevStackError(f"a NATS cluster has 3 or 5 nodes, not {self.size}")
        ensure_writable_dir(self.data_dir, "data dir")
        state = read_state(self.data_dir)
        if state is not None:
            running = live(state)
            if running:
                pids = ", ".join(str(p["pid"]) for p in running)
                raise DevStackError(
                    f"a dev stack is already running from {_show(self.data_dir)} (pids {pids}); "
                    f"stop it with `resontech down --data-dir {_show(self.data_dir)}`"
                )
        for port in client_ports(nats_port, self.size):
            ensure_port_free("127.0.0.1", port, "nats-server (--nats-port)")
        ensure_port_free("127.0.0.1", s3_port, "the object store (--s3-port)")
        ensure_port_free("127.0.0.1", gateway_port, "the gateway (--gateway-port)")
        for spec in services:
            ensure_port_free("127.0.0.1", spec.gateway_port() or 0, spec.name)

    def start(self, nats_port: int, s3_port: int, gateway_port: int, services: Sequence[ServiceSpec]) -> None:
        """Start NATS, the object store, the streams and the services; record them as they start."""
        self._start_servers(nats_port, s3_port)
        assert self.nats is not None and self.s3 is not None
        gateway_port = gateway_port or free_port()
        gateways = [gateway_port, *(port for spec in services if (port := spec.gateway_port()))]
        self.env = {
            "RESONTECH_NATS_URL": self.nats.url,
            **({"RESONTECH_STREAM_REPLICAS": str(self.nats.replicas)} if self.size else {}),
            "RESONTECH_NATS_USER": KERNEL_USER,
            "RESONTECH_NATS_PASSWORD": self._secret(NATS_SECRET_FILE),
            "RESONTECH_S3_ENDPOINT": self.s3.endpoint,
            "RESONTECH_S3_ACCESS_KEY": self.s3.access_key,
            "RESONTECH_S3_SECRET_KEY": self.s3.secret_key,
            "RESONTECH_DATA_DIR": str(self.data_dir),
            "RESONTECH_GATEWAY_URL": ",".join(f"http://127.0.0.1:{port}" for port in gateways),
            "RESONTECH_API_KEY": self._operator_key(),
            # everything here serves on loopback, its own agents' replicas too: allow loopback
            # replicas (never the kernel's own ports); a production deployment lists its replica
            # networks, or none (any address but loopback and the rest core.addresses refuses)
            "RESONTECH_REPLICA_NETWORKS": LOOPBACK_NETWORKS,
        }
        gateway_env = {
            GATEWAY_PORT_ENV: str(gateway_port),
            "RESONTECH_GATEWAY_OPERATOR_KEY_SHA256": hashlib.sha256(
                self.env["RESONTECH_API_KEY"].encode()
            ).hexdigest(),
        }
        child_env = {**os.environ, **self.env, **gateway_env, "PYTHONUNBUFFERED": "1"}
        for spec in services:
            argv = spec.argv + self._enrollment(spec) if spec.enroll else spec.argv
            self.services[spec.name] = spawn(argv, self.logs / f"{spec.name}.log", {**child_env, **spec.env})
            self._record()
        for name, url in self._gateways():  # "ready" promises that every URL in dev.env answers
            with httpx.Client(base_url=url, timeout=10.0) as client:
                wait_for_gateway(client, self.services[name], self.logs / f"{name}.log")

    def _gateways(self) -> list[tuple[str, str]]:
        """The gateway services started, each with its URL (in the order of ``RESONTECH_GATEWAY_URL``)."""
        names = [name for name in self.services if name.startswith("gateway")]
        return list(zip(names, self.env["RESONTECH_GATEWAY_URL"].split(","), strict=False))

    def _start_servers(self, nats_port: int, s3_port: int) -> None:
        """Start NATS (one server or a cluster), the object store, and create the streams."""
        kernel_password = self._secret(NATS_SECRET_FILE)
        auth = NatsAuth(kernel_password=kernel_password)
        self.nats = StackNats(self.data_dir, self.logs, self.size, nats_port, auth)
        self.nats.start()
        self._record()
        self.s3 = ObjectStoreServer(
            self.data_dir / "objects",
            port=s3_port,
            access_key=S3_ACCESS_KEY,
            secret_key=self._secret(SECRET_FILE),
            log_file=self.logs / "s3.log",
        )
        self.s3.start()
        self._record()
        kernel = Settings(
            nats_url=self.nats.url,
            nats_user=KERNEL_USER,
            nats_password=kernel_password,
            stream_replicas=self.nats.replicas,
        )
        try:
            run_async(lambda: _ensure_streams(kernel))
        except ResontechError:
            raise
        except Exception as exc:
            raise DevStackError(f"could not create the streams: {type(exc).__name__}: {exc}") from exc

    def _enrollment(self, spec: ServiceSpec) -> list[str]:
        """The flags an agent's first start enrolls with (none once its state dir holds an enrollment):
        the operator creates provider ``local`` and a token for the agent through the gateway."""
        if (self.data_dir / "agents" / spec.agent_name() / ENROLLMENT_FILE).exists():
            return []
        gateways = self._gateways()
        if not gateways:
            raise DevStackError(f"{spec.name} enrolls through a gateway: start one before it")
        name, url = gateways[0]
        log_file = self.logs / f"{name}.log"
        token = issue_enrollment_token(
            url, self.env["RESONTECH_API_KEY"], spec.agent_name(), self.services[name], log_file
        )
        return ["--enroll-token", token, "--gateway", url]

    def mark_ready(self, supervised: bool, announce: Callable[[], None]) -> None:
        """Write dev.env, ``announce`` what runs where, then mark stack.json ready (unsupervised,
        ``down`` signals each process): whoever waits on "ready" finds the URLs already printed."""
        self._supervised = supervised
        write_private(self.data_dir / ENV_FILE, _env_file_text(self.env))
        announce()
        self._record(ready=True)

    def announce(self, foreground: bool) -> None:
        """Print what runs where and how to use it."""
        assert self.nats is not None and self.s3 is not None
        rows = [*self.nats.rows(), ("object store", self.s3.endpoint, self.s3.log_file)]
        rows += [
            (name, f"{url}  (dashboard /, docs /docs)", self.logs / f"{name}.log")
            for name, url in self._gateways()
        ]
        rows += [
            (name, f"pid {p.pid}", self.logs / f"{name}.log")
            for name, p in self.services.items()
            if not name.startswith("gateway")
        ]
        table = [("component", "address", "log"), *((a, b, _show(c)) for a, b, c in rows)]
        widths = [max(len(row[i]) for row in table) for i in range(2)]
        shown = _show(self.data_dir)
        lines = [f"resontech dev stack in {shown}"]
        lines += [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in table]
        usage = [
            (f"source {_show(self.data_dir / ENV_FILE)}", "settings for clients and the CLI"),
            ("resontech tail 'job.>'", "watch job events"),
            (
                f"resontech down --data-dir {shown}",
                "stop everything" + (" (or Ctrl-C here)" if foreground else ""),
            ),
        ]
        width = max(len(command) for command, _ in usage)
        lines += ["", *(f"  {command:<{width}}  # {why}" for command, why in usage)]
        print("\n".join(lines), flush=True)

    def supervise(self, stop: threading.Event) -> None:
        """Wait until ``stop`` is set, reporting (once) every process that exits meanwhile."""
        while not stop.wait(0.5):
            for name, proc, log_file in self._children():
                code = proc.poll()
                if code is None or name in self._reported:
                    continue
                self._reported.add(name)
                tail = "\n".join(f"    {line}" for line in log_tail(log_file, 10))
                print(
                    f"{name} exited with code {code}; the rest keeps running. Last lines of "
                    f"{_show(log_file)}:\n{tail}",
                    file=sys.stderr,
                    flush=True,
                )

    def stop(self) -> None:
        """Stop services, then the object store, then NATS (each SIGTERM, then SIGKILL)."""
        for proc in reversed(list(self.services.values())):
            terminate(proc, STOP_TIMEOUT_S)
        for server in (self.s3, self.nats):
            if server is not None:
                server.stop(STOP_TIMEOUT_S)
        if self._wrote_state:
            (self.data_dir / STACK_FILE).unlink(missing_ok=True)

    def _children(self) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
        servers: list[tuple[str, LocalServer | None]] = [*(self.nats.servers if self.nats else [])]
        for name, server in [*servers, ("object store", self.s3)]:
            if server is not None and server.process is not None:
                yield name, server.process, server.log_file
        for name, proc in self.services.items():
            yield name, proc, self.logs / f"{name}.log"

    def _record(self, ready: bool = False) -> None:
        """Write stack.json after every start, so that ``down`` finds whatever is running."""
        processes = ((name, proc.pid, log) for name, proc, log in self._children())
        write_state(self.data_dir, ready=ready, supervised=self._supervised, processes=processes)
        self._wrote_state = True

    def _operator_key(self) -> str:
        """The operator's API key, generated at the first start and kept in the data dir."""
        path = self.data_dir / OPERATOR_KEY_FILE
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        key = f"rt_operator0000_{secrets.token_urlsafe(32)}"
        write_private(path, key + "\n")
        return key

    def _secret(self, name: str) -> str:
        path = self.data_dir / name
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        secret = secrets.token_urlsafe(24)
        write_private(path, secret + "\n")
        return secret


async def _ensure_streams(settings: Settings) -> None:
    from core.log import EventLog

    log = await EventLog.connect(settings)
    try:
        await log.ensure_streams()
    finally:
        await log.close()


class _SignalTrap:
    """SIGINT/SIGTERM handling for ``up``: interrupt while starting, request a stop afterwards.

    While :attr:`raising` is true a signal raises KeyboardInterrupt (SIGTERM too, so that a
    terminated ``up`` still cleans up); afterwards it only sets :attr:`stop`. Signal handlers can
    only be installed from the main thread; elsewhere this does nothing.
    """

    def __init__(self) -> None:
        self.raising = True
        self.stop = threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalTrap:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raising:
            raise KeyboardInterrupt
        self.stop.set()


# -- small helpers ---------------------------------------------------------------------------------


def _fail(message: str, code: int = 1) -> int:
    one_line = " ".join(line.strip() for line in message.splitlines())
    print(f"error: {one_line}", file=sys.stderr, flush=True)
    return code


def _show(path: Path) -> str:
    """A path relative to the working directory when it is below it: shorter to read and type."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _env_file_text(env: dict[str, str]) -> str:
    # `export` so that `source dev.env` reaches the programs the shell starts, not just the shell;
    # core.settings.read_env_file accepts the prefix.
    lines = ["# written by `resontech up`: source it to talk to this dev stack"]
    return "\n".join(lines + [f"export {key}={value}" for key, value in env.items()]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ops.devstack [up|down] --data-dir D ...``: the dev stack without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m ops.devstack", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["up", "down"], default="up")
    parser.add_argument("--data-dir", type=Path, default=Path(".resontech"))
    parser.add_argument("--nats-port", type=int, default=4222)
    parser.add_argument("--s3-port", type=int, default=9000)
    parser.add_argument("--gateway-port", type=int, default=8080)
    parser.add_argument(
        "--cluster", type=int, choices=CLUSTER_SIZES, default=0, metavar="N", help=CLUSTER_HELP
    )
    parser.add_argument("--no-services", action="store_true", help="only NATS, the object store, streams")
    parser.add_argument("--detach", action="store_true", help="start, then return; stop with `down`")
    args = parser.parse_args(argv)
    if args.command == "down":
        return down(args.data_dir)
    return up(
        args.data_dir,
        nats_port=args.nats_port,
        s3_port=args.s3_port,
        gateway_port=args.gateway_port,
        services=() if args.no_services else None,
        foreground=not args.detach,
        cluster=args.cluster,
    )


if __name__ == "__main__":
    sys.exit(main())
