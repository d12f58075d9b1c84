"""A served stack for benchmarks: nats-server, the object store and the gateway on granian.

What the gateway and inference benchmarks measure against: the shipped ``sync_interval: always``
NATS, the object store and a real ``resontech gateway`` process on free loopback ports, with the
operator's key, and tenants created through the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core.addresses import LOOPBACK_NETWORKS
from core.settings import Settings
from gateway.auth import digest
from ops.bench.common import private_nats
from ops.devstack.objectstore import ObjectStoreServer
from ops.ports import free_port
from ops.process import log_tail, spawn, terminate

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServedStack:
    """nats-server, the object store and a served gateway, with the operator key."""

    url: str
    operator_key: str
    settings: Settings
    gateway_pid: int

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def gateway_cpu_s(self) -> float:
        """CPU seconds used so far by the gateway's processes (user + system)."""
        total = 0.0
        for pid in [self.gateway_pid, *self.gateway_worker_pids()]:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def gateway_worker_pids(self) -> list[int]:
        """granian's worker processes (children of its main process)."""
        path = Path(f"/proc/{self.gateway_pid}/task/{self.gateway_pid}/children")
        with contextlib.suppress(OSError):
            return [int(pid) for pid in path.read_text().split()]
        return []


@contextlib.asynccontextmanager
async def served_stack(**gateway_env: str) -> AsyncIterator[ServedStack]:
    """Start the stack on free loopback ports (the shipped ``sync_interval: always`` NATS)."""
    operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
    with (
        private_nats(sync_always=True) as nats_server,
        tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp,
    ):
        store = ObjectStoreServer(Path(tmp) / "objects")
        store.start()
        port = free_port()
        settings = Settings(
            nats_url=nats_server.url,
            s3_endpoint=store.endpoint,
            s3_access_key=store.access_key,
            s3_secret_key=store.secret_key,
            ack_timeout_s=30.0,
            replica_networks=LOOPBACK_NETWORKS,  # its agent's replicas serve on loopback, as in the dev stack
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        env.update(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_REPLICA_NETWORKS=settings.replica_networks,
            RESONTECH_GATEWAY_PORT=str(port),
            RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(operator_key),
            PYTHONPATH=str(REPO),
            **gateway_env,
        )
        log_file = Path(tmp) / "gateway.log"
        proc = spawn([sys.executable, "-m", "ops.cli", "gateway"], log_file, env)
        url = f"http://127.0.0.1:{port}"
        try:
            await _wait_served(url, proc, log_file)
            yield ServedStack(url=url, operator_key=operator_key, settings=settings, gateway_pid=proc.pid)
        finally:
            await asyncio.to_thread(terminate, proc, 10.0)
            store.stop()


async def _wait_served(url: str, proc: Any, log_file: Path) -> None:
    deadline = time.monotonic() + 60.0
    async with httpx.AsyncClient(base_url=url) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log_tail(log_file, 10)}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/v1/health")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the gateway did not serve within 60 s: {log_tail(log_file, 10)}")


async def create_tenants(stack: ServedStack, count: int, prefix: str = "bench") -> list[tuple[str, str]]:
    """``count`` tenants through the API: ``(tenant, admin key)``."""
    limit = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=stack.url, timeout=60.0) as client:

        async def one(n: int) -> tuple[str, str]:
            async with limit:
                response = await client.post(
                    "/v1/tenants",
                    json={"tenant": f"{prefix}-{n}", "display_name": f"{prefix} {n}"},
                    headers={"Authorization": f"Bearer {stack.operator_key}"},
                )
            response.raise_for_status()
            return f"{prefix}-{n}", response.json()["admin_key"]["key"]

        return list(await asyncio.gather(*(one(n) for n in range(count))))
