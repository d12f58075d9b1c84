"""The dev stack's NATS: one ``nats-server``, or with ``resontech up --cluster N`` a JetStream
cluster of N nodes with R3 streams; either way with the kernel's and the agents' accounts.

One server lives in ``<data dir>/nats`` (config ``nats.conf``, agents file ``nats.agents.conf``,
pid file ``nats.pid``, log ``logs/nats.log``); node n of a cluster in ``<data dir>/nats-<n>`` with
``nats-<n>.conf``, ``nats-<n>.agents.conf``, ``nats-<n>.pid`` and ``logs/nats-<n>.log``: the
files ``resontech nats-auth --agents-file ... --pid-file ...`` is pointed at, one beside each node.
"""

from __future__ import annotations

from pathlib import Path

from ops.devstack.natscluster import NatsCluster
from ops.devstack.natsserver import NatsAuth, NatsServer

CLUSTER_SIZES = (3, 5)
CLUSTER_REPLICAS = 3
"""Replicas of every stream on a cluster, whatever its size: R3 is what production runs."""


def client_ports(nats_port: int, size: int) -> list[int]:
    """The client port of each server: ``nats_port`` for one, ``nats_port + n - 1`` for node n
    (all 0, i.e. free ports, when ``nats_port`` is 0)."""
    return [nats_port + n if nats_port else 0 for n in range(size or 1)]


class StackNats:
    """The stack's NATS servers.

    Args:
        data_dir: the stack's directory.
        logs: where the servers' logs go.
        size: 0 for one server, else the number of cluster nodes.
        nats_port: the (first) client port; 0 for free ports.
        auth: the accounts (every node gets the same kernel user and its own agents file).
    """

    def __init__(self, data_dir: Path, logs: Path, size: int, nats_port: int, auth: NatsAuth) -> None:
        self.cluster: NatsCluster | None = None
        self.server: NatsServer | None = None
        if size:
            self.cluster = NatsCluster(
                data_dir,
                size,
                client_ports=client_ports(nats_port, size),
                auth=auth,
                node_prefix="nats-",
                log_dir=logs,
            )
        else:
            self.server = NatsServer(
                data_dir / "nats", port=nats_port, config_dir=data_dir, log_file=logs / "nats.log", auth=auth
            )

    @property
    def url(self) -> str:
        """What ``RESONTECH_NATS_URL`` takes: the server's URL, or every node's comma-separated."""
        return self.cluster.url if self.cluster is not None else self._one().url

    @property
    def replicas(self) -> int:
        """The replicas of every stream (``RESONTECH_STREAM_REPLICAS``)."""
        return CLUSTER_REPLICAS if self.cluster is not None else 1

    @property
    def servers(self) -> list[tuple[str, NatsServer]]:
        """Each server with its name in the stack (``nats``, or ``nats-1`` ... ``nats-N``)."""
        if self.cluster is not None:
            return [(f"nats-{n}", node) for n, node in enumerate(self.cluster.nodes, 1)]
        return [("nats", self._one())]

    def start(self) -> None:
        """Start the server, or every node; return once JetStream answers everywhere."""
        if self.cluster is not None:
            self.cluster.start()
        else:
            self._one().start()

    def stop(self, timeout: float) -> None:
        """Stop gracefully (SIGTERM), SIGKILL after ``timeout`` seconds."""
        if self.cluster is not None:
            self.cluster.stop(timeout)
        else:
            self._one().stop(timeout)

    def rows(self) -> list[tuple[str, str, Path]]:
        """Name, address and log of each server, for the stack's announcement."""
        if self.cluster is None:
            return [("nats", self.url, self._one().log_file)]
        return [
            (name, f"{node.url}  (monitoring http://{node.host}:{node.monitor_port})", node.log_file)
            for name, node in self.servers
        ]

    def _one(self) -> NatsServer:
        assert self.server is not None
        return self.server
