"""A 3-node JetStream cluster in network namespaces, partitioned while it is written to.

Run it inside namespaces of its own (what ``tests/lab/test_partition.py`` does)::

    unshare -Urnm --fork --kill-child -- .venv/bin/python -m tests.lab.netlab --workdir /tmp/lab

It builds the network of :mod:`tests.lab.netns`, starts one ``nats-server`` per node namespace (clients
on ``10.77.1.1x:4222``, routes on ``10.77.2.1x:6222``, monitoring on ``10.77.1.1x:8222``,
``sync_interval: always``), creates the kernel's JOBS stream with three replicas through
:class:`core.log.EventLog`, then plays each case of :mod:`tests.lab.partition_cases` in turn and prints
one JSON line: ``{"ok": ..., "error": ..., "cases": [...], "setup_s": ..., "total_s": ...}``. Node
logs and stores stay in the work directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.settings import Settings
from core.streams import STREAMS
from ops.devstack.natsserver import ClusterConfig, NatsServer
from tests.lab.netns import ROUTE_NET, NetLab, NetLabError, Node
from tests.lab.partition_cases import CASES, play_case

CLIENT_PORT = 4222
ROUTE_PORT = 6222
MONITOR_PORT = 8222
CLUSTER_NAME = "lab"
START_TIMEOUT_S = 60.0


class LabNode(NatsServer):
    """One cluster node, run in its own network namespace.

    Args:
        lab: the lab's network.
        node: the node's namespace.
        root: where its store, config and log go (``n<i>``, ``n<i>.conf``, ``n<i>.log``).
    """

    def __init__(self, lab: NetLab, node: Node, root: Path) -> None:
        routes = tuple(f"nats-route://{ROUTE_NET}.{10 + j}:{ROUTE_PORT}" for j in range(lab.size))
        super().__init__(
            root / f"n{node.index}",
            host=node.client_ip,
            port=CLIENT_PORT,
            monitor_port=MONITOR_PORT,
            max_file="2GB",
            server_name=f"n{node.index}",
            cluster=ClusterConfig(CLUSTER_NAME, node.route_ip, ROUTE_PORT, routes),
        )
        self.lab = lab
        self.node = node

    @property
    def monitor_url(self) -> str:
        """The node's HTTP monitoring endpoint (``/jsz`` tells its own view of a stream)."""
        return f"http://{self.host}:{self.monitor_port}"

    def _argv(self) -> list[str]:
        return self.lab.wrap(self.node, super()._argv())

    def _ports(self) -> list[tuple[int, str]]:
        # Its addresses belong to the node's namespace: a bind from the lab's cannot test them, and
        # the namespace is new, so nothing else holds them.
        return []


class LabCluster:
    """The lab's network and its three nodes.

    Args:
        root: the work directory (stores, configs, logs).
        size: the number of nodes.
    """

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.net = NetLab(size)
        self.nodes: list[LabNode] = []

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (``Settings.nats_url``)."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> LabNode:
        """The node with this server name (``n0``...)."""
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        """Build the network and start every node; return once each answers JetStream requests.

        Call from the main thread: a node's process dies with the thread that started it.
        """
        self.net.build()
        self.nodes = [LabNode(self.net, node, self.root) for node in self.net.nodes]
        for node in self.nodes:  # all first: a node is ready only once a majority elected a meta leader
            node.launch()
        for node in self.nodes:
            node.wait_ready(START_TIMEOUT_S)

    def stop(self) -> None:
        """Kill every node and the namespaces (a test's store is not worth a graceful stop)."""
        for node in self.nodes:
            node.kill()
        self.net.close()


async def create_jobs_stream(cluster: LabCluster) -> None:
    """The kernel's JOBS stream (``job.>``, file, 5-minute duplicate window) with three replicas,
    created by the kernel's own code."""
    settings = Settings(nats_url=cluster.url, stream_replicas=3, ack_timeout_s=10.0)
    log = await EventLog.connect(settings, name="lab-admin")
    try:
        await log.ensure_streams([spec for spec in STREAMS if spec.name == "JOBS"])
    finally:
        await log.close()


async def scenario(
    cluster: LabCluster, cases: list[str], min_partition_s: float, results: list[dict[str, Any]]
) -> None:
    """Create the stream, then play the cases one after the other on the same cluster; ``results``
    gains each case's findings as it ends (so a failure keeps those of the cases before it)."""
    await create_jobs_stream(cluster)
    acked: dict[str, int] = {}  # every event id acknowledged so far, with its sequence
    for case in cases:
        results.append(await play_case(cluster, case, acked, min_partition_s))


def main(argv: list[str] | None = None) -> int:
    """Run the lab and print its one JSON line; exit 0 when it ran to the end (whatever it found)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.lab.netlab", description=__doc__.partition("\n")[0]
    )
    parser.add_argument("--workdir", type=Path, default=None, help="stores and logs (default: a temp dir)")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, among {', '.join(CASES)} (default: all)"
    )
    parser.add_argument(
        "--min-partition-s", type=float, default=8.0, help="the shortest partition, in seconds (default 8)"
    )
    args = parser.parse_args(argv)
    cases = [case for case in args.cases.split(",") if case]
    unknown = sorted(set(cases) - set(CASES))  # a case may be named twice: it is played twice
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose among {list(CASES)}")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="netlab-"))
    root.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"ok": False, "error": None, "cases": [], "workdir": str(root)}
    began = time.monotonic()
    cluster = LabCluster(root)
    try:
        cluster.start()
        report["setup_s"] = round(time.monotonic() - began, 2)
        asyncio.run(scenario(cluster, cases, args.min_partition_s, report["cases"]))
        report["ok"] = True
    except NetLabError as exc:  # the network could not be built: one line says why
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(f"netlab: {exc}", file=sys.stderr)
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    finally:
        cluster.stop()
    report["total_s"] = round(time.monotonic() - began, 2)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
