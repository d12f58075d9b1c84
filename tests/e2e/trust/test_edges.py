"""Addresses, connections and budgets at the kernel's edges, attacked with real credentials.

* A replica's address is judged by where it resolves, not compared as text: an agent registered at
  ``localhost`` (or ``127.1``, ``2130706433``, ``0.0.0.0``, ``[::ffff:127.0.0.1]``...) cannot name
  the kernel's object store as its replica, as production runs the intake (no loopback allowed)
  and as the dev stack runs it (loopback allowed, never a kernel port); and the gateway checks
  again when it connects, whatever the log says.
* Connections have limits: slow headers do not take a served gateway (granian) down.
* Per-agent budgets: one agent's flood of claims is refused past its budget, and an honest agent's
  claims are judged all the same.

The attacker is ``mallory`` (:class:`tests.support.claims.Mallory`), a provider's enrolled agent with
its own NATS user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.addresses import ANY_NETWORK, LOOPBACK_NETWORKS, addresses_refusal, literal_ip, parse_networks
from core.errors import InvalidInput
from core.log import EventLog
from core.settings import Settings
from core.streams import endpoint_subject, worker_subject
from gateway.auth import digest
from gateway.limits import TRY_LATER
from gateway.wsclient import ConnectionClosed, HandshakeError, connect
from ops.ports import free_port
from ops.process import log_tail, spawn, terminate
from ops.services.budgets import CLAIMS, AgentBudgets, Budget, OverBudget
from projections import ENDPOINTS, REGISTRY
from projections.base import state_hash
from projections.runner import rebuild
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerPolicy, WorkerPolicySet
from tests.support import REPO, records, until
from tests.support.claims import Mallory, enroll_mallory, quarantined, wait_for_state
from tests.support.secured import Stack

# -- addresses: pure rules ------------------------------------------------------------------------------

KERNEL = frozenset({(literal_ip("127.0.0.1"), 9000), (literal_ip("10.0.0.5"), 4222)})
LOOPBACK_FORMS = [
    "127.1",
    "2130706433",
    "0x7f000001",
    "0177.0.0.1",
    "::ffff:127.0.0.1",
    "::1",
    "64:ff9b::7f00:1",
]


@pytest.mark.parametrize("host", LOOPBACK_FORMS)
def test_every_spelling_of_loopback_is_loopback(host: str) -> None:
    production = addresses_refusal(host, 8000, None, ANY_NETWORK, KERNEL)  # type: ignore[arg-type]
    assert production is not None and "loopback" in production
    dev = parse_networks(LOOPBACK_NETWORKS)
    at_kernel = addresses_refusal(host, 9000, None, dev, KERNEL)  # type: ignore[arg-type]
    assert at_kernel is not None and ("kernel's own services" in at_kernel or "reserved" in at_kernel)


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("0", "unspecified"),
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("1.2.3.4.5", "not an IP address"),
    ],
)
def test_what_no_replica_network_allows(host: str, why: str) -> None:
    for networks in (ANY_NETWORK, parse_networks("0.0.0.0/0,::/0,127.0.0.0/8")):
        refusal = addresses_refusal(host, 8000, None, networks, KERNEL)  # type: ignore[arg-type]
        assert refusal is not None and why in refusal, (host, refusal)


def test_a_name_is_judged_by_every_address_it_resolved_to() -> None:
    dev = parse_networks(LOOPBACK_NETWORKS)
    assert addresses_refusal("gpu.example", 8000, ("203.0.113.9",), ANY_NETWORK, KERNEL) is None  # type: ignore[arg-type]
    mixed = addresses_refusal("gpu.example", 9000, ("203.0.113.9", "127.0.0.1"), ANY_NETWORK, KERNEL)  # type: ignore[arg-type]
    assert mixed is not None and "127.0.0.1" in mixed
    assert "does not resolve" in (addresses_refusal("gpu.example", 8000, (), dev, KERNEL) or "")  # type: ignore[arg-type]
    assert "was not resolved" in (addresses_refusal("gpu.example", 8000, None, dev, KERNEL) or "")  # type: ignore[arg-type]
    assert addresses_refusal("localhost", 8000, ("127.0.0.1", "::1"), dev, KERNEL) is None  # type: ignore[arg-type]
    only = parse_networks("10.8.0.0/16")
    outside = addresses_refusal("10.9.0.1", 8000, None, only, KERNEL)  # type: ignore[arg-type]
    assert outside is not None and "none of the allowed replica networks" in outside
    assert addresses_refusal("10.8.0.1", 8000, None, only, KERNEL) is None  # type: ignore[arg-type]
    at_nats = addresses_refusal("10.0.0.5", 4222, None, ANY_NETWORK, KERNEL)  # type: ignore[arg-type]
    assert at_nats is not None and "kernel's own services" in at_nats
    with pytest.raises(InvalidInput):
        parse_networks("10.0.0.0/8,not-a-network")


# -- addresses: with mallory's real credentials ---------------------------------------------------------


async def replica_on(stack: Stack, mallory: Mallory, tenant: str, endpoint_id: str) -> str:
    """An endpoint of ``tenant`` whose replica the kernel placed on mallory's worker; its assignment."""
    deployed = EndpointDeployed(name="chat", model="m")
    await stack.log.append(endpoint_subject(tenant, endpoint_id, deployed), deployed)
    replica = Assignment(assignment_id=f"{endpoint_id}-s0-e1", worker_id=mallory.worker_id, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
    await stack.log.append(endpoint_subject(tenant, endpoint_id, placed), placed)
    await wait_for_state(stack.log, ENDPOINTS, lambda s: s.endpoints.get(f"{tenant}/{endpoint_id}"), "placed")
    return replica.assignment_id


async def registered_at(stack: Stack, mallory: Mallory, address: str) -> None:
    """Mallory (re-)registers at ``address``, and the kernel took it."""
    await mallory.register(address=address)
    me = mallory.worker_id
    await wait_for_state(
        stack.log,
        REGISTRY,
        lambda s: me in s.workers and s.workers[me].registration.address == address,
        f"registered at {address}",
    )


async def claim_ready(mallory: Mallory, tenant: str, endpoint_id: str, assignment: str, url: str) -> None:
    ready = EndpointReplicaReady(assignment_id=assignment, epoch=1, address=url)
    await mallory.claim(endpoint_subject(tenant, endpoint_id, ready), ready)


async def endpoints_hash(stack: Stack) -> str:
    state, _ = await rebuild(stack.log, ENDPOINTS)
    return state_hash(state)


def url_of(host: str, port: int | str) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def test_a_replica_at_the_kernels_object_store_is_refused_as_production_runs(stack: Stack) -> None:
    """Production allows no loopback replica: whatever Mallory registers as its host, a replica
    that resolves to loopback, "this host" or a link-local address is refused; one on a provider
    network is taken."""
    stack.intake.replica_networks = ANY_NETWORK  # RESONTECH_REPLICA_NETWORKS unset, as in production
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await registered_at(stack, mallory, "localhost")
    assignment = await replica_on(stack, mallory, tenant, "ep6")
    before = await endpoints_hash(stack)
    store_port = stack.log.settings.s3_endpoint.rsplit(":", 1)[1]
    hosts = [
        "localhost",
        "0.0.0.0",
        "127.1",
        "2130706433",
        "0x7f000001",
        "::ffff:127.0.0.1",
        "169.254.169.254",
    ]
    for n, host in enumerate(hosts, start=1):
        if host != "localhost":
            await registered_at(stack, mallory, host)
        await claim_ready(mallory, tenant, "ep6", assignment, url_of(host, store_port))
        await quarantined(stack.log, mallory.worker_id, n)  # judged before the next registration
    refused = await quarantined(stack.log, mallory.worker_id, len(hosts))
    reasons = [q.reason for q in refused]
    for reason in reasons[:1] + reasons[2:6]:
        assert "is loopback, and no loopback network is an allowed replica network" in reason, reasons
    assert "unspecified" in reasons[1] and "link-local" in reasons[6], reasons
    assert await endpoints_hash(stack) == before  # as if the claims had never been sent
    # the honest form: a replica on a provider's network, on its registered host
    await registered_at(stack, mallory, "203.0.113.7")
    await claim_ready(mallory, tenant, "ep6", assignment, "http://203.0.113.7:8000")
    table = await wait_for_state(
        stack.log, ENDPOINTS, lambda s: s.endpoints[f"{tenant}/ep6"].state == "serving" and s, "serving"
    )
    assert table.endpoints[f"{tenant}/ep6"].replicas["0"].address == "http://203.0.113.7:8000"
    await mallory.log.close()


async def test_the_dev_stack_allows_loopback_replicas_but_never_a_kernel_port(stack: Stack) -> None:
    """The dev stack (and this harness) allows ``127.0.0.0/8`` and ``::1``: its own agents serve
    there; the kernel's ports stay refused however the host is spelled."""
    tenant, _ = await stack.tenant("victim")
    mallory = await enroll_mallory(stack)
    await registered_at(stack, mallory, "localhost")
    assignment = await replica_on(stack, mallory, tenant, "ep7")
    before = await endpoints_hash(stack)
    store_port = stack.log.settings.s3_endpoint.rsplit(":", 1)[1]
    nats_port = stack.server.url.rsplit(":", 1)[1]
    claims = [("localhost", store_port), ("localhost", nats_port), ("127.1", store_port), ("::1", nats_port)]
    for n, (host, port) in enumerate(claims, start=1):
        await registered_at(stack, mallory, host)
        await claim_ready(mallory, tenant, "ep7", assignment, url_of(host, port))
        await quarantined(stack.log, mallory.worker_id, n)
    refused = await quarantined(stack.log, mallory.worker_id, len(claims))
    assert all("is one of the kernel's own services" in q.reason for q in refused), refused
    assert await endpoints_hash(stack) == before
    await registered_at(stack, mallory, "localhost")
    await claim_ready(mallory, tenant, "ep7", assignment, "http://localhost:8123")
    await wait_for_state(
        stack.log, ENDPOINTS, lambda s: s.endpoints[f"{tenant}/ep7"].state == "serving", "serving"
    )
    await mallory.log.close()


async def test_the_gateway_checks_a_replicas_address_again_when_it_connects(stack: Stack) -> None:
    """Whatever the log says (an address accepted before this rule, a name that resolves elsewhere
    since), the gateway sends no tenant's request to the kernel's own services."""
    tenant, admin = await stack.tenant("victim")
    store_port = stack.log.settings.s3_endpoint.rsplit(":", 1)[1]
    for n, address in enumerate([f"http://127.1:{store_port}", f"http://localhost:{store_port}"]):
        deployed = await stack.post("/v1/endpoints", admin, {"name": f"chat{n}", "model": "m"})
        assert deployed.status_code == 201, deployed.text
        endpoint_id = str(deployed.json()["endpoint_id"])
        replica = Assignment(assignment_id=f"{endpoint_id}-s0-e1", worker_id="w-any", slot=0, epoch=1)
        placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
        ready = EndpointReplicaReady(assignment_id=replica.assignment_id, epoch=1, address=address)
        for event in (placed, ready):  # as the kernel itself, not through the intake
            await stack.kernel.append(
                endpoint_subject(tenant, endpoint_id, event), event, visible_in=ENDPOINTS
            )
        body: dict[str, Any] = {"model": f"chat{n}", "messages": [{"role": "user", "content": "hi"}]}
        answer = await stack.post("/v1/chat/completions", admin, body)
        assert answer.status_code == 503, (address, answer.status_code, answer.text)
        assert answer.json()["error"]["code"] == "no_replica", answer.text


# -- per-agent budgets ----------------------------------------------------------------------------------


def test_a_budget_refuses_past_its_burst_and_tells_once_a_window() -> None:
    budgets = AgentBudgets(Budget(per_s=10.0, burst=5.0), Budget(per_s=0.1, burst=1.0), window_s=10.0)
    assert all(budgets.take("w-m", False, 100.0) is None for _ in range(5))  # the burst
    first = budgets.take("w-m", False, 100.0)
    assert first is not None and first.reason is not None and "over its budget of 10 claims" in first.reason
    assert all(budgets.take("w-m", False, 100.0) == OverBudget(None) for _ in range(50))  # dropped, counted
    assert budgets.dropped == 50
    assert budgets.take("w-h", False, 100.0) is None  # another agent's own budget
    assert budgets.take("w-m", False, 100.5) is None  # refilled by store time: 5 claims
    assert budgets.take("w-v", True, 0.0) is None
    refused = budgets.take("w-v", True, 0.0)
    assert refused is not None and refused.reason is not None and "verification answers" in refused.reason


async def test_one_agents_flood_of_claims_is_refused_past_its_budget_and_others_are_judged(
    stack: Stack,
) -> None:
    """Mallory floods the intake with claims it may make (each would be appended); past its budget
    they are refused (one quarantined with the reason per window, the rest dropped and counted),
    and an honest agent's claims sent meanwhile are all judged and taken."""
    mallory = await enroll_mallory(stack)
    me = mallory.worker_id
    await registered_at(stack, mallory, "10.66.0.7")
    enrolled, state_dir = await stack.enroll("honest")
    honest = Mallory(stack, enrolled, await stack.as_agent(enrolled, state_dir))
    flood = 3 * int(CLAIMS.burst)
    policy = WorkerPolicySet(policy=WorkerPolicy(max_concurrent=1))

    async def flooding() -> None:
        for _ in range(flood // 250):  # as fast as its connection takes them
            await asyncio.gather(*(mallory.claim(worker_subject(me, policy), policy) for _ in range(250)))

    flooded = asyncio.create_task(flooding())
    await honest.register(hostname="honest-host", address="10.66.0.8")
    own = WorkerPolicySet(policy=WorkerPolicy(max_concurrent=3))
    await honest.claim(worker_subject(honest.worker_id, own), own)
    await flooded
    judged = flood + 3  # and mallory's registration, the honest agent's two
    await until(
        lambda: stack.intake.accepted + stack.intake.refused + stack.intake.dropped >= judged,
        "every claim judged",
    )
    registry = await wait_for_state(
        stack.log,
        REGISTRY,
        lambda s: (w := s.workers.get(honest.worker_id)) and w.policy.max_concurrent == 3 and s,
        "the honest agent's policy",
    )
    assert registry.workers[honest.worker_id].registration.address == "10.66.0.8"
    everyone = await stack.log.quarantined(limit=10_000)
    assert not [q for q in everyone if q.sender == honest.worker_id]
    refused = [q for q in everyone if q.sender == me]
    assert refused and all(
        f"over its budget of {CLAIMS.per_s:g} claims a second" in q.reason for q in refused
    )
    stored = await records(stack.log, "WORKERS", f"worker.{me}.policy_set")
    assert len(stored) >= CLAIMS.burst  # the burst is taken whole
    assert len(stored) + len(refused) + stack.intake.dropped == flood  # and the rest refused
    await mallory.log.close()
    await honest.log.close()


# -- connections have limits: a served gateway (granian) ---------------------------------------------

SLOW = 1_100
"""Connections holding unfinished request heads: more than granian's old 1,024 served at once."""
HEADER_TIMEOUT_S = 5.0
"""The gateway's default header read timeout (``RESONTECH_GATEWAY_HEADER_TIMEOUT_S``)."""


@contextlib.asynccontextmanager
async def served_gateway(settings: Settings, root: Path, **extra: str) -> AsyncIterator[tuple[str, str]]:
    """``resontech gateway`` (granian, real sockets, loopback only) on ``settings``' streams, until the
    block ends; its URL and operator key."""
    operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(
        RESONTECH_NATS_URL=settings.nats_url,
        RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
        RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
        RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
        RESONTECH_DATA_DIR=str(root),
        RESONTECH_GATEWAY_HOST="127.0.0.1",
        RESONTECH_GATEWAY_PORT=str(port),
        RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(operator_key),
        PYTHONPATH=str(REPO),
        **extra,
    )
    log_file = root / f"gateway-{port}.log"
    proc = spawn([sys.executable, "-m", "ops.cli", "gateway"], log_file, env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            for _ in range(600):
                assert proc.poll() is None, log_tail(log_file, 20)
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/v1/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield url, operator_key
    finally:
        await asyncio.to_thread(terminate, proc, 10.0)


async def closed_by_server(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether the server closes this connection (EOF or reset) within ``within_s``."""
    try:
        async with asyncio.timeout(within_s):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


async def test_slow_headers_do_not_take_the_gateway_down(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    """1,100 connections that never finish their request head: ``/v1/health`` still answers at
    once, and the server closes each of them after its header timeout."""
    async with served_gateway(settings, tmp_path) as (url, _):
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(SLOW):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET /v1/health HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")  # and never the rest
                slow.append((reader, writer))
            async with httpx.AsyncClient(base_url=url, timeout=HEADER_TIMEOUT_S) as client:
                assert (await client.get("/v1/health")).status_code == 200
            # each is closed once its header timeout passes (granian's old default was 30 s)
            closed = await asyncio.gather(*(closed_by_server(r, 4 * HEADER_TIMEOUT_S) for r, _ in slow))
            assert all(closed), f"{closed.count(False)} of {SLOW} slow connections still open"
        finally:
            for _, writer in slow:
                writer.close()


async def test_requests_and_feeds_are_capped_per_client_and_per_key(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    """Requests holding their bodies back fill one client's cap: the next is answered 429 at once,
    and they are ended after the body timeout; one key's feeds past its cap are refused."""
    caps = {
        "RESONTECH_GATEWAY_MAX_REQUESTS_PER_CLIENT": "40",
        "RESONTECH_GATEWAY_BODY_TIMEOUT_S": "2",
        "RESONTECH_GATEWAY_MAX_FEEDS_PER_KEY": "2",
    }
    async with served_gateway(settings, tmp_path, **caps) as (url, operator_key):
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            try:
                for _ in range(40):
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(
                        b"POST /v1/tenants HTTP/1.1\r\nHost: gateway\r\nContent-Length: 1000\r\n"
                        + f"Authorization: Bearer {operator_key}\r\n\r\n{{".encode()
                    )  # the body never comes: its handler waits for it
                    held.append((reader, writer))
                for _ in range(100):  # once the server has read their heads, they hold the cap
                    over = await client.get("/v1/health")
                    if over.status_code != 200:
                        break
                    await asyncio.sleep(0.05)
                assert over.status_code == 429, over.text
                assert over.json()["error"]["code"] == "too_many_connections"
                ended = await asyncio.gather(*(closed_by_server(r, 10.0) for r, _ in held))
                assert all(ended)
                assert (await client.get("/v1/health")).status_code == 200
            finally:
                for _, writer in held:
                    writer.close()
            created = await client.post(
                "/v1/tenants",
                json={"tenant": "acme", "display_name": "Acme"},
                headers={"Authorization": f"Bearer {operator_key}"},
            )
            assert created.status_code == 201, created.text
            key = created.json()["admin_key"]["key"]
        feed_url = url.replace("http://", "ws://") + "/v1/feed"
        header = {"Authorization": f"Bearer {key}"}
        feeds = [await connect(feed_url, header), await connect(feed_url, header)]
        with pytest.raises(HandshakeError):
            await connect(feed_url, header)
        by_message = await connect(feed_url)  # a browser's: the key in its first message
        await by_message.send(json.dumps({"kind": "auth", "key": key}))
        with pytest.raises(ConnectionClosed) as refused:
            while True:
                await by_message.recv()
        assert refused.value.code == TRY_LATER
        await feeds[0].close()
        again = None
        for _ in range(100):  # once the server has seen the close
            with contextlib.suppress(HandshakeError):
                again = await connect(feed_url, header)
                break
            await asyncio.sleep(0.05)
        assert again is not None
        for feed in (feeds[1], again):
            await feed.close()
