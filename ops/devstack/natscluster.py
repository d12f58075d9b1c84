"""A JetStream cluster of local ``nats-server`` nodes on loopback: for the dev stack and for tests.

Each node is a :class:`~ops.devstack.natsserver.NatsServer` with its own store dir, client port,
monitoring port and route port, all picked once and kept across restarts of that node, so a node
restarted on its own store rejoins as the same peer. Routes need a password generated per cluster;
JetStream fsyncs every write (``sync_interval: always``), as in production.

A clustered JetStream has no meta leader until a majority of its nodes run, so a node cannot be
"ready" on its own: :meth:`NatsCluster.start` launches every node, then waits for each.

Node ``i`` (0-based, as every method takes it) is called ``<prefix><i + 1>``: its ``server_name``,
its store dir ``<root>/<prefix><i + 1>`` and its files beside it (``.conf``, ``.pid``, ``.log`` and
with auth ``.agents.conf``: every node has its own agents file, kept by its own ``nats-auth``).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js.api import StreamInfo

from core.natsauth import JS_API, KERNEL_USER
from core.settings import Settings
from ops.devstack.errors import DevStackError
from ops.devstack.natsserver import ClusterConfig, NatsAuth, NatsServer
from ops.ports import free_port
from ops.process import ServerStartError, run_async

T = TypeVar("T")

ROUTE_USER = "route"
POLL_S = 0.1


class NatsCluster:
    """``size`` nats-server nodes forming one JetStream cluster on ``host``.

    Args:
        root: the directory of the nodes' store dirs and files (created at the first start).
        size: how many nodes (default 3; at least 3, so that one may fail).
        host: the address every node listens on (default loopback).
        name: the cluster's name (default ``resontech``).
        client_ports: each node's client port; default (or 0 in a slot): a free port.
        auth: the accounts of :mod:`core.natsauth` on every node: the same kernel user everywhere,
            and each node its own agents file (``auth.agents_file`` is ignored).
        node_prefix: node ``i`` is named ``<node_prefix><i + 1>`` (default ``n``: n1, n2, n3).
        log_dir: where ``<node name>.log`` goes (default ``root``).
        max_memory: each node's JetStream memory store limit (default ``256MB``).
        max_file: each node's JetStream file store limit (default ``20GB``).
        route_password: the routes' password (default: generated).

    Raises:
        ValueError: fewer than 3 nodes, or ``client_ports`` of the wrong length.
    """

    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        host: str = "127.0.0.1",
        name: str = "resontech",
        client_ports: Sequence[int] | None = None,
        auth: NatsAuth | None = None,
        node_prefix: str = "n",
        log_dir: Path | None = None,
        max_memory: str = "256MB",
        max_file: str = "20GB",
        route_password: str | None = None,
    ) -> None:
        if size < 3:
            raise ValueError(f"a cluster needs at least 3 nodes, not {size}")
        wanted = list(client_ports) if client_ports is not None else [0] * size
        if len(wanted) != size:
            raise ValueError(f"{len(wanted)} client ports for {size} nodes")
        self.root = Path(root).absolute()
        self.name = name
        self.auth = auth
        self.route_password = route_password or secrets.token_hex(16)
        ports = _distinct_free_ports(host, 3 * size, taken=[p for p in wanted if p])
        route_ports = ports[:size]
        monitor_ports = ports[size : 2 * size]
        clients = [wanted[i] or ports[2 * size + i] for i in range(size)]
        routes = tuple(f"nats-route://{host}:{port}" for port in route_ports)
        logs = Path(log_dir).absolute() if log_dir else self.root
        self.nodes: list[NatsServer] = []
        for i in range(size):
            node_name = f"{node_prefix}{i + 1}"
            self.nodes.append(
                NatsServer(
                    self.root / node_name,
                    host=host,
                    port=clients[i],
                    monitor_port=monitor_ports[i],
                    max_memory=max_memory,
                    max_file=max_file,
                    config_dir=self.root,
                    log_file=logs / f"{node_name}.log",
                    # no agents_file: each node gets its own, <store dir name>.agents.conf
                    auth=None if auth is None else NatsAuth(kernel_password=auth.kernel_password),
                    server_name=node_name,
                    cluster=ClusterConfig(
                        name=name,
                        host=host,
                        port=route_ports[i],
                        routes=routes,
                        user=ROUTE_USER,
                        password=self.route_password,
                    ),
                )
            )

    # -- where and who ---------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every node's client URL, in node order."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """The client URLs comma-joined: what ``RESONTECH_NATS_URL`` takes."""
        return ",".join(self.urls)

    @property
    def kernel_credentials(self) -> dict[str, str]:
        """``nats.connect`` keyword arguments of the kernel's user (empty without auth)."""
        if self.auth is None:
            return {}
        return {"user": KERNEL_USER, "password": self.auth.kernel_password}

    def settings(self, **overrides: Any) -> Settings:
        """:class:`Settings` for the whole cluster: every URL, R3 streams, the kernel's user."""
        values: dict[str, Any] = {"nats_url": self.url, "stream_replicas": 3}
        if self.auth is not None:
            values |= {"nats_user": KERNEL_USER, "nats_password": self.auth.kernel_password}
        return Settings(**(values | overrides))

    def index(self, server_name: str) -> int:
        """The index of the node called ``server_name``.

        Raises:
            KeyError: no node has that name.
        """
        for i, node in enumerate(self.nodes):
            if node.name == server_name:
                return i
        raise KeyError(server_name)

    # -- processes -------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Start every node that is not running and return once JetStream answers on each and
        every stream already in the stores has a leader again.

        The second wait matters after a restart of the whole cluster: each stream's raft group
        elects its leader only some seconds after the meta leader exists, and until then the
        stream's API calls (creating or updating it, :meth:`core.log.EventLog.ensure_streams`)
        time out.

        Raises:
            PortInUse: a port is taken.
            ServerStartError: a node exited, was not ready, or a stream had no leader within
                ``timeout`` seconds. The nodes this call launched are killed again.
        """
        launched: list[NatsServer] = []
        try:
            for node in self.nodes:
                if not node.running:
                    node.launch()
                    launched.append(node)
            deadline = time.monotonic() + timeout
            for node in launched:
                node.wait_ready(max(0.1, deadline - time.monotonic()))
            if launched:
                self._wait_streams_led(deadline)
        except BaseException:
            for node in launched:
                node.kill()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node gracefully (SIGTERM, all at once), SIGKILL after ``timeout`` seconds."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(timeout), self.nodes))

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``, as a crash would."""
        self.nodes[i].kill()

    def start_node(self, i: int, timeout: float = 30.0) -> None:
        """Start node ``i`` again on its store dir and ports; returns once JetStream answers on it
        (which needs a majority of the nodes running)."""
        self.nodes[i].start(timeout)

    def restart_node(self, i: int, timeout: float = 30.0) -> None:
        """Stop node ``i`` gracefully (if running), then :meth:`start_node` it."""
        self.nodes[i].stop()
        self.start_node(i, timeout)

    def reload(self, i: int | None = None, timeout: float = 10.0) -> None:
        """Make node ``i`` (default: every running node) re-read its configuration
        (:meth:`NatsServer.reload`)."""
        for node in self.nodes if i is None else [self.nodes[i]]:
            node.reload(timeout)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- leaders and replicas --------------------------------------------------------------------

    def stream_leader(self, stream: str, timeout: float = 10.0) -> int:
        """The index of the node leading ``stream`` (JetStream's stream info ``cluster.leader``),
        once it has one.

        Raises:
            DevStackError: no leader within ``timeout`` seconds.
        """

        def leader(info: StreamInfo) -> int | None:
            name = info.cluster.leader if info.cluster else None
            return self.index(name) if name else None

        return self._poll_stream(stream, leader, timeout, f"stream {stream} has no leader")

    def wait_stream_current(self, stream: str, timeout: float = 30.0) -> None:
        """Wait until ``stream`` has a leader and every other replica is online and current.

        Raises:
            DevStackError: not so within ``timeout`` seconds.
        """

        def current(info: StreamInfo) -> bool | None:
            cluster = info.cluster
            if cluster is None or not cluster.leader:
                return None
            peers = cluster.replicas or []
            wanted = (info.config.num_replicas or 1) - 1
            ok = len(peers) == wanted and all(p.current and not p.offline and not p.lag for p in peers)
            return True if ok else None

        self._poll_stream(stream, current, timeout, f"stream {stream} has replicas behind")

    def meta_leader(self, timeout: float = 10.0) -> int:
        """The index of the node leading the JetStream meta group (the monitoring ``/jsz``).

        Raises:
            DevStackError: no running node names a leader within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes:
                name = _meta_leader_seen_by(node) if node.running else None
                if name:
                    return self.index(name)
            if time.monotonic() > deadline:
                raise DevStackError(f"the NATS cluster has no JetStream meta leader after {timeout:g}s")
            time.sleep(POLL_S)

    def _wait_streams_led(self, deadline: float) -> None:
        """Wait until every stream (the meta group's list) has a leader."""
        try:
            names = self._poll(lambda: self._call(_stream_names), deadline, "the streams were not listed")
            for name in names:
                self.stream_leader(name, max(0.1, deadline - time.monotonic()))
        except DevStackError as exc:
            raise ServerStartError(f"the NATS cluster started but {exc.message}") from None

    def _poll(self, request: Callable[[], Awaitable[T]], deadline: float, failure: str) -> T:
        last = "no answer"
        while True:
            try:
                return run_async(request)
            except Exception as exc:  # an election in progress: ask again
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise DevStackError(f"{failure} ({last})")
            time.sleep(POLL_S)

    def _poll_stream(
        self, stream: str, check: Callable[[StreamInfo], T | None], timeout: float, failure: str
    ) -> T:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                found = check(run_async(lambda: self._call(lambda nc: _stream_info(nc, stream))))
            except Exception as exc:  # an election in progress, a node just killed: ask again
                found, last = None, f"{type(exc).__name__}: {exc}"
            else:
                last = "not yet"
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise DevStackError(f"{failure} after {timeout:g}s ({last})")
            time.sleep(POLL_S)

    async def _call(self, request: Callable[[NATS], Awaitable[T]]) -> T:
        """Run one JetStream API request through the first running node that takes a connection."""
        error: Exception = ServerStartError("no node of the NATS cluster is running")
        for node in self.nodes:
            if not node.running:
                continue
            try:
                nc = await nats.connect(
                    node.url,
                    connect_timeout=2,
                    allow_reconnect=False,
                    error_cb=_quiet,
                    name="resontech-cluster-check",
                    **self.kernel_credentials,
                )
            except Exception as exc:
                error = exc
                continue
            try:
                return await request(nc)
            finally:
                await nc.close()
        raise error


async def _quiet(_: Exception) -> None:
    return None


async def _stream_info(nc: NATS, stream: str) -> StreamInfo:
    return await nc.jetstream(timeout=2.0).stream_info(stream)


async def _stream_names(nc: NATS) -> list[str]:
    """Every stream's name, from the meta group (``STREAM.NAMES``: it needs no stream leader)."""
    names: list[str] = []
    while True:
        reply = await nc.request(f"{JS_API}.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), 2.0)
        page = json.loads(reply.data)
        if "error" in page:
            raise DevStackError(f"STREAM.NAMES: {page['error'].get('description', page['error'])}")
        names += page.get("streams") or []
        if not page.get("streams") or len(names) >= page.get("total", 0):
            return names


def _meta_leader_seen_by(node: NatsServer) -> str:
    """The meta leader's name in ``node``'s ``/jsz`` (empty when it knows none or does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{node.host}:{node.monitor_port}/jsz", timeout=2) as response:
            meta = json.load(response).get("meta_cluster") or {}
    except (OSError, ValueError):
        return ""
    return str(meta.get("leader") or "")


def _distinct_free_ports(host: str, count: int, taken: Sequence[int]) -> list[int]:
    """``count`` free ports, distinct from each other and from ``taken``."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in ports and port not in taken:
            ports.append(port)
    return ports
