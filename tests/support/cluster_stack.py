"""Process plumbing for the fault tests on a 3-node JetStream cluster
(``tests/e2e/faults/test_cluster_faults.py``).

The kernel's services run as real processes (``python -m ops.cli <service>``) on every node's URL
with R3 streams (``RESONTECH_STREAM_REPLICAS=3``: a service started without it would bring every
stream down to one replica when it ensures them), each in its own session so that a test can
``kill -9`` all of it. Agents are :class:`tests.support.AgentProcess` on the same URLs. A
:class:`Submitter` keeps submitting jobs through the API, as a careful client does: every request
with its own ``Idempotency-Key``, a failed one sent again with the same key until it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.js.errors

from core.addresses import LOOPBACK_NETWORKS
from core.log import EventLog
from core.streams import STREAMS
from gateway.auth import digest
from gateway.idempotency import resource_id
from ops.devstack.natscluster import NatsCluster
from ops.devstack.objectstore import ObjectStoreServer
from ops.ports import free_port
from ops.process import log_tail, signal_group, spawn, terminate
from schemas.jobs import JobPlaced, JobSubmitted
from tests.support import REPO, AgentProcess

SERVICE_STOP_S = 15.0
GATEWAY_READY_S = 60.0
RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers after which a careful client sends the same request again, with the same key: "not now"
(as the SDK's :data:`gateway.client.gateways.RETRY_STATUSES`, plus 429). A 500 is a bug, not a retry."""


def kernel_env(
    cluster: NatsCluster, data_dir: Path, object_store: ObjectStoreServer | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a kernel service on ``cluster``: every node's URL, R3 streams, and the
    object store's settings when given; nothing of the test's own ``RESONTECH_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(
        RESONTECH_NATS_URL=cluster.url,
        RESONTECH_STREAM_REPLICAS="3",
        RESONTECH_DATA_DIR=str(data_dir),
        RESONTECH_REPLICA_NETWORKS=LOOPBACK_NETWORKS,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if object_store is not None:
        env.update(
            RESONTECH_S3_ENDPOINT=object_store.endpoint,
            RESONTECH_S3_ACCESS_KEY=object_store.access_key,
            RESONTECH_S3_SECRET_KEY=object_store.secret_key,
        )
    env.update(extra)
    return env


@dataclass
class Service:
    """One kernel service process, in its own session (a gateway's granian workers included)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_file: Path
    url: str = ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """``kill -9`` the whole process group: nothing of it answers or closes cleanly."""
        signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after :data:`SERVICE_STOP_S`)."""
        terminate(self.proc, SERVICE_STOP_S)

    def tail(self, lines: int = 30) -> str:
        """The end of the service's output, for assertion messages."""
        return f"{self.name}: " + "\n".join(log_tail(self.log_file, lines))

    def said(self, text: str) -> bool:
        """Whether ``text`` is in the service's output."""
        return self.log_file.exists() and text in self.log_file.read_text(errors="replace")


class ClusterStack:
    """The services and agents one test starts on ``cluster``; :meth:`close` stops them all.

    Args:
        cluster: the running cluster.
        root: the test's directory (logs, agents' state dirs, the data dir).
        object_store: the S3 server a gateway needs (``None``: no gateway).
    """

    def __init__(
        self, cluster: NatsCluster, root: Path, object_store: ObjectStoreServer | None = None
    ) -> None:
        self.cluster = cluster
        self.root = root
        self.object_store = object_store
        self.operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
        self.services: list[Service] = []
        self.agents: list[AgentProcess] = []

    def service(self, name: str, *argv: str, **env: str) -> Service:
        """Start ``python -m ops.cli <argv>`` with the kernel's environment (plus ``env``)."""
        environment = kernel_env(self.cluster, self.root, self.object_store, **env)
        log_file = self.root / f"{name}.log"
        proc = spawn([sys.executable, "-m", "ops.cli", *argv], log_file, environment, cwd=REPO)
        started = Service(name, proc, log_file)
        self.services.append(started)
        return started

    def intake(self, name: str = "intake") -> Service:
        return self.service(name, "intake", "--name", name)

    def coordinator(self, name: str = "coordinator") -> Service:
        return self.service(name, "coordinator", "--name", name)

    async def gateway(self, name: str = "gateway") -> Service:
        """A served gateway on a free port, once it answers ``/v1/health``."""
        port = free_port()
        served = self.service(
            name,
            "gateway",
            RESONTECH_GATEWAY_PORT=str(port),
            RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(self.operator_key),
        )
        served.url = f"http://127.0.0.1:{port}"
        await until_healthy(served)
        return served

    def agent(self, name: str, *extra: str) -> AgentProcess:
        """An agent process on every node's URL, enrolled first (as the operator), then started."""
        agent = AgentProcess(name, self.root, self.cluster.url, *extra)
        agent.env["RESONTECH_STREAM_REPLICAS"] = "3"
        agent.enroll(self.cluster.settings())
        self.agents.append(agent)
        return agent.start()

    async def tenant(self, gateway: Service) -> tuple[str, str]:
        """A new tenant created through ``gateway`` by the operator: (tenant id, admin key)."""
        tenant = f"t-{secrets.token_hex(4)}"
        async with httpx.AsyncClient(timeout=30.0) as http:
            response = await http.post(
                f"{gateway.url}/v1/tenants",
                json={"tenant": tenant, "display_name": tenant},
                headers={"Authorization": f"Bearer {self.operator_key}"},
            )
        assert response.status_code == 201, response.text
        return tenant, str(response.json()["admin_key"]["key"])

    def tails(self, lines: int = 25) -> str:
        """The end of every agent's and service's output: printed when a test ends, so that pytest
        shows it beside a failure (and keeps it out of the way otherwise)."""
        parts = [s.tail(lines) for s in self.services]
        parts += [f"{a.name}: " + "\n".join(log_tail(a.stderr_path, lines)) for a in self.agents]
        return "\n\n".join(parts)

    def dead(self) -> list[str]:
        """The output of every service that exited without being asked to (for assertion messages)."""
        return [s.tail() for s in self.services if not s.alive]

    def close(self) -> None:
        for agent in self.agents:
            with contextlib.suppress(Exception):
                agent.cleanup()
        for service in reversed(self.services):
            signal_group(service.proc.pid, signal.SIGCONT)
            service.stop()


async def until_healthy(served: Service) -> None:
    """Wait until a gateway answers ``GET /v1/health`` with 200.

    Raises:
        RuntimeError: it exited, or did not answer within :data:`GATEWAY_READY_S`.
    """
    deadline = time.monotonic() + GATEWAY_READY_S
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            if not served.alive:
                raise RuntimeError(f"the gateway exited: {served.tail()}")
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(f"{served.url}/v1/health")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not serve within {GATEWAY_READY_S:g} s: {served.tail()}")
            await asyncio.sleep(0.1)


async def wipe(cluster: NatsCluster) -> None:
    """Delete every stream and the snapshot bucket, so that a test starts from an empty log."""
    nc = await nats.connect(servers=cluster.urls, connect_timeout=5)
    js = nc.jetstream(timeout=20.0)
    try:
        for spec in STREAMS:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(spec.name)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_object_store("snapshots")
    finally:
        await nc.close()


# -- a client that keeps submitting ------------------------------------------------------------------


@dataclass
class Ack:
    """A submission the API answered (201 or 202)."""

    job_id: str
    status: int
    sent_at: float
    acked_at: float
    attempts: int


@dataclass
class Submitter:
    """Submits process jobs through the API without pause until stopped.

    Every submission has its own ``Idempotency-Key``; an attempt that failed (no connection, a reset,
    a timeout, a 5xx or 429) is sent again with the same key, rotating over ``urls``, until it is
    answered 201/202, or its ``retry_s`` deadline passes (then it counts in :attr:`failed`). Any
    other answer (a 4xx) is a failure at once.

    Attributes:
        acked: idempotency key -> what the API answered.
        failed: idempotency key -> the last error of a submission that never got an answer.
        failed_attempts: attempts that failed and were sent again (or given up on).
    """

    urls: Sequence[str]
    api_key: str
    tenant: str
    spec: dict[str, Any]
    prefix: str = "load"
    concurrency: int = 2
    pause_s: float = 0.25
    retry_s: float = 90.0
    timeout_s: float = 20.0
    acked: dict[str, Ack] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    failed_attempts: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _next: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def job_id(self, key: str) -> str:
        """The job id the gateway derives from ``key`` (:mod:`gateway.idempotency`)."""
        return resource_id("job", self.tenant, key)

    @property
    def sent(self) -> list[str]:
        """Every key a submission was started with."""
        return [f"{self.prefix}-{i:05d}" for i in range(self._next)]

    def acked_after(self, t: float) -> list[Ack]:
        """Submissions first sent after ``t`` (monotonic) and answered."""
        return [a for a in self.acked.values() if a.sent_at > t]

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Submit until :meth:`stop`; returns once every submission in flight has ended."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            await asyncio.gather(*(self._loop(http) for _ in range(self.concurrency)))

    async def run_once(self) -> Ack | None:
        """One submission (the next key), sent until answered; its answer (``None``: it failed)."""
        key = f"{self.prefix}-{self._next:05d}"
        self._next += 1
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            await self.submit(http, key)
        return self.acked.get(key)

    async def until_acked(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` submissions were answered."""
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked)} submits answered; {self.failed}"
            await asyncio.sleep(0.05)

    async def _loop(self, http: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            key = f"{self.prefix}-{self._next:05d}"
            self._next += 1
            await self.submit(http, key)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.pause_s)

    async def submit(self, http: httpx.AsyncClient, key: str) -> None:
        """One submission, sent until answered or out of time."""
        body = {**self.spec, "name": key}
        headers = {"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": key}
        sent_at = time.monotonic()
        deadline = sent_at + self.retry_s
        attempt = 0
        while True:
            url = self.urls[attempt % len(self.urls)]
            attempt += 1
            try:
                response = await http.post(f"{url}/v1/jobs", json=body, headers=headers)
            except httpx.TransportError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in (201, 202):
                    job_id = str(response.json()["job_id"])
                    self.acked[key] = Ack(job_id, response.status_code, sent_at, time.monotonic(), attempt)
                    return
                error = f"{response.status_code}: {response.text[:300]}"
                if response.status_code not in RETRY_STATUSES:
                    self.failed[key] = error
                    return
            self.failed_attempts += 1
            self.errors[error.split(":", 1)[0]] += 1
            if time.monotonic() > deadline:
                self.failed[key] = error
                return
            await asyncio.sleep(min(0.1 * attempt, 1.0))


# -- what the log holds -------------------------------------------------------------------------------


async def submitted_per_job(log: EventLog) -> Counter[str]:
    """How many ``job.submitted`` each job id has in JOBS (replayed from the stream)."""
    replay = log.replay("JOBS", subjects="job.*.*.submitted")
    return Counter([r.token(2) async for r in replay if isinstance(r.event, JobSubmitted)])


async def placed_jobs(log: EventLog) -> dict[str, list[JobPlaced]]:
    """Every job's ``job.placed`` events in JOBS, in order, by job id."""
    placed: dict[str, list[JobPlaced]] = {}
    async for r in log.replay("JOBS", subjects="job.*.*.placed"):
        if isinstance(r.event, JobPlaced):
            placed.setdefault(r.token(2), []).append(r.event)
    return placed
