"""The service processes of the dev stack: one of each on a single nats-server, two of each on a
cluster (:func:`cluster_services`), so that losing one instance of anything changes nothing.

Why two of each is safe: the coordinators and the intakes append with expected sequences (two
instances never both win) and name themselves on their events (``--name``); the intakes share
the INTAKE stream's durable pull consumer; the projectors fold the same log to the same snapshots;
the gateways are stateless (each meters the tokens it proxied under its own source); the federation
services claim each FL server so that one runs it (``--instance``). ``nats-auth`` is different: it
rewrites a node's agents file and signals that node, so there is one beside each node.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

GATEWAY_PORT_ENV = "RESONTECH_GATEWAY_PORT"


@dataclass(frozen=True)
class ServiceSpec:
    """A service process of the dev stack.

    Attributes:
        name: short name; its output goes to ``logs/<name>.log``.
        argv: the command, e.g. ``[sys.executable, "-m", "ops.cli", "projector"]``.
        enroll: an agent: enrolled through the gateway (provider ``local``) before its first start.
        env: environment over the stack's own (e.g. a second gateway's ``RESONTECH_GATEWAY_PORT``).
    """

    name: str
    argv: list[str] = field(hash=False)
    enroll: bool = False
    env: dict[str, str] = field(default_factory=dict, hash=False)

    def agent_name(self) -> str:
        """The ``--name`` of an agent's command line (it names the agent's state dir)."""
        return self.argv[self.argv.index("--name") + 1]

    def gateway_port(self) -> int | None:
        """The port of a gateway that listens on a port of its own (``env``), else ``None``."""
        port = self.env.get(GATEWAY_PORT_ENV)
        return int(port) if port else None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ops.cli", *args]


def _agent(service: str, name: str) -> ServiceSpec:
    return ServiceSpec(service, _cli("agent", "--name", name), enroll=True)


DEFAULT_SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("gateway", _cli("gateway")),
    ServiceSpec("projector", _cli("projector")),
    ServiceSpec("coordinator", _cli("coordinator")),
    ServiceSpec("federation", _cli("federation")),
    ServiceSpec("nats-auth", _cli("nats-auth")),
    ServiceSpec("intake", _cli("intake")),
    _agent("agent-1", "local-1"),
    _agent("agent-2", "local-2"),
)


def cluster_services(data_dir: Path, nodes: int, second_gateway_port: int) -> tuple[ServiceSpec, ...]:
    """The services of a stack on a NATS cluster of ``nodes`` nodes named ``nats-<n>``.

    Two of every kernel service (``gateway-1`` on the stack's gateway port, ``gateway-2`` on
    ``second_gateway_port``), one ``nats-auth-<n>`` beside each node (its agents file and pid file
    are ``<data dir>/nats-<n>.agents.conf`` / ``.pid``, as :class:`~ops.devstack.natscluster.NatsCluster`
    names them), and the two agents, called ``cluster-1`` and ``cluster-2``: their enrollments are in
    the cluster's log, not in a single server's, so they do not share state dirs with ``local-1/2``.
    """
    specs = [
        ServiceSpec("gateway-1", _cli("gateway")),
        ServiceSpec("gateway-2", _cli("gateway"), env={GATEWAY_PORT_ENV: str(second_gateway_port)}),
    ]
    for n in (1, 2):
        specs += [
            ServiceSpec(f"projector-{n}", _cli("projector")),
            ServiceSpec(f"coordinator-{n}", _cli("coordinator", "--name", f"coordinator-{n}")),
            ServiceSpec(f"federation-{n}", _cli("federation", "--instance", f"federation-{n}")),
        ]
    for n in range(1, nodes + 1):
        files = data_dir / f"nats-{n}"
        specs.append(
            ServiceSpec(
                f"nats-auth-{n}",
                _cli(
                    "nats-auth",
                    "--agents-file",
                    f"{files}.agents.conf",
                    "--pid-file",
                    f"{files}.pid",
                ),
            )
        )
    specs += [ServiceSpec(f"intake-{n}", _cli("intake", "--name", f"intake-{n}")) for n in (1, 2)]
    return (*specs, _agent("agent-1", "cluster-1"), _agent("agent-2", "cluster-2"))
