"""A Kubernetes cluster's dispatcher with its own NATS user, against a real nats-server with accounts
on (the secured stack: the gateway, the sync of the server's users and the intake run for real) and
kmock as the cluster: the operator enrolls the cluster, the dispatcher enrolls and registers its
nodes through the intake, beats for them and asks the kernel about them, and can do nothing else:
not speak for another cluster's node or a provider's agent, not read a stream, not store a kernel
event, not ask about another cluster. A provider's agent cannot enroll nodes or ask either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import nats
import pytest

from core.errors import LogUnavailable
from core.log import EventLog
from core.natsauth import AGENT_JS_API_PREFIX, cluster_question, dispatcher_permissions, dispatcher_user
from core.streams import heartbeat_subject, intake_subject, provider_subject
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.credentials import DispatcherCredentials
from ops.dispatcher.fleet import worker_id_for
from ops.dispatcher.service import Dispatcher, Timing
from ops.enrollment import enroll_cluster, revoke_cluster
from projections import PROVIDERS, REGISTRY
from projections.providers import dispatcher_id
from schemas.providers import AgentEnrolled, ClusterFacts
from schemas.workers import Heartbeat
from tests.support import wait_records
from tests.support.claims import enroll_mallory, quarantined, wait_for_state
from tests.support.secured import Stack, raw_agent, violation

if TYPE_CHECKING:
    from tests.support.kube import Kube

pytest_plugins = ("tests.support.kube",)
FAST = Timing(poll_s=0.2, heartbeat_s=1.0, metering_s=1.0, nodes_s=0.3, linger_s=0.5)
TIMEOUT_S = 60.0


def test_a_dispatchers_permissions_are_its_nodes_agent_permissions_and_its_own_two() -> None:
    from core.natsauth import agent_permissions

    nodes = ("kernel-lab-gpu-a", "kernel-lab-gpu-b")
    perms = dispatcher_permissions("kernel-lab", "prov", nodes)
    own = {"intake.kernel-lab.provider.prov.agent_enrolled", "kernel.cluster.kernel-lab"}
    assert set(perms.publish) == own | {s for n in nodes for s in agent_permissions(n).publish}
    assert perms.subscribe == ("_INBOX_kernel-lab.>",)
    assert set(dispatcher_permissions("kernel-lab", "prov", ()).publish) == own  # before any node enrolls


async def synced(stack: Stack) -> None:
    """Wait until the server's users reflect every PROVIDERS event stored so far (these tests append
    to the log directly, which the gateway's projection may not have read yet)."""
    await stack.sync.wait_synced(await stack.log.last_seq("PROVIDERS"))


async def _enrolled_cluster(stack: Stack, cluster: str = "lab") -> DispatcherCredentials:
    provider, _ = await stack.provider()
    made = await enroll_cluster(stack.log, cluster, provider=provider, region="eu-north")
    assert made.password is not None
    await synced(stack)
    return DispatcherCredentials(
        cluster=cluster,
        provider=provider,
        region="eu-north",
        nats_user=dispatcher_user(cluster),
        nats_password=made.password,
    )


@contextlib.asynccontextmanager
async def raw_dispatcher(
    creds: DispatcherCredentials, stack: Stack
) -> AsyncIterator[tuple[nats.NATS, list[str]]]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    settings = creds.connection(stack.log.settings)
    nc = await nats.connect(
        settings.nats_url,
        user=settings.nats_user,
        password=settings.nats_password,
        inbox_prefix=settings.nats_inbox_prefix or "_INBOX",
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def test_a_dispatcher_with_its_own_user_enrolls_registers_and_beats_for_its_nodes(
    stack: Stack, kube: Kube, tmp_path: Path
) -> None:
    creds = await _enrolled_cluster(stack)
    for n, name in enumerate(("gpu-a", "gpu-b")):
        await kube.add_gpu_node(name, f"10.0.0.{n + 1}")
    own = await EventLog.connect(creds.connection(stack.log.settings), name="dispatcher-lab")
    cluster = Cluster.from_kubeconfig(kube.kubeconfig)
    dispatcher = Dispatcher(
        cluster, own, creds.identity("test"), RenderContext(), tmp_path / "state", timing=FAST, own_user=True
    )
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    nodes = {worker_id_for("lab", n) for n in ("gpu-a", "gpu-b")}
    try:
        await asyncio.wait_for(dispatcher.registered.wait(), TIMEOUT_S)
        registry = await wait_for_state(
            stack.log, REGISTRY, lambda s: nodes <= set(s.workers) and s, "both nodes registered"
        )
        for node in nodes:  # the cluster's terms, never the nodes' labels
            registered = registry.workers[node].registration
            assert (registered.provider, registered.region, registered.sandbox) == (
                creds.provider,
                "eu-north",
                "kubernetes",
            )
        await wait_records(
            stack.log,
            "HEARTBEATS",
            lambda rs: {r.subject for r in rs} >= {heartbeat_subject(n) for n in nodes},
            "both nodes' heartbeats",
            TIMEOUT_S,
        )
        # the intake enrolled them, under the cluster's token: the sync gave the dispatcher their subjects
        providers = await wait_for_state(
            stack.log, PROVIDERS, lambda s: nodes <= set(s.enrolled) and s, "enrolled"
        )
        agents = providers.providers[creds.provider].agents
        assert {agents[n].token_id for n in nodes} == {
            providers.providers[creds.provider].clusters["lab"].token_id
        }
        assert all(agents[n].nats_password_bcrypt == "" for n in nodes)  # no credentials of their own
        # a restarted dispatcher asks the kernel, which answers about this cluster only
        answer = msgspec.json.decode(await own.ask(cluster_question(dispatcher_id("lab"))), type=ClusterFacts)
        assert sorted(answer.enrolled) == sorted(nodes) and answer.error == ""
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)
        cluster.close()
        await own.close()


async def test_a_dispatchers_user_can_do_nothing_but_its_nodes_work(stack: Stack) -> None:
    creds = await _enrolled_cluster(stack)
    other = await _enrolled_cluster(stack, "other")
    mallory = await enroll_mallory(stack)
    me = dispatcher_id("lab")
    node, foreign_node = worker_id_for("lab", "gpu-a"), worker_id_for("other", "gpu-a")
    async with await EventLog.connect(creds.connection(stack.log.settings), name="dispatcher-lab") as own:
        facts = msgspec.json.decode(await own.ask(cluster_question(me)), type=ClusterFacts)
        assert (facts.enrolled, facts.assignments, facts.error) == ([], [], "")
        for worker_id in (
            node,
            foreign_node,
            "w-0123456789ab",
        ):  # its own node; another cluster's; an agent's
            claim = AgentEnrolled(token_id=facts.token_id, worker_id=worker_id)
            await own.append(intake_subject(me, provider_subject(creds.provider, claim)), claim)
        providers = await wait_for_state(stack.log, PROVIDERS, lambda s: node in s.enrolled and s, "its node")
        await synced(stack)
        refused = await quarantined(stack.log, me, 2)
        assert [q.reason.split(" (")[0] for q in refused] == [
            f"worker {foreign_node!r} is not a node of cluster lab",
            "worker 'w-0123456789ab' is not a node of cluster lab",
        ]
        assert foreign_node not in providers.enrolled and "w-0123456789ab" not in providers.enrolled
        position = await own.append(heartbeat_subject(node), Heartbeat(interval_s=1.0))  # its node's, now
        assert position.stream == "HEARTBEATS"
    async with raw_dispatcher(creds, stack) as (nc, errors):
        for subject in (
            heartbeat_subject(foreign_node),  # another cluster's node
            heartbeat_subject(mallory.worker_id),  # a provider's agent
            f"intake.{foreign_node}.worker.{foreign_node}.registered",
            # as another cluster's dispatcher
            f"intake.{dispatcher_id('other')}.provider.{other.provider}.agent_enrolled",
            f"intake.{me}.provider.{other.provider}.agent_enrolled",  # under another provider
            f"worker.{node}.verified",  # a kernel event
            f"{AGENT_JS_API_PREFIX}.STREAM.INFO.JOBS",  # read a stream
            "$JS.API.STREAM.INFO.PROVIDERS",
            cluster_question(dispatcher_id("other")),  # ask about another cluster
        ):
            await nc.publish(subject, b"{}")
            await violation(errors, subject)
        await nc.subscribe(f"_INBOX_{mallory.worker_id}.>")
        await violation(errors, f"_INBOX_{mallory.worker_id}.>")
    # a provider's agent can neither enroll a node nor ask about a cluster
    async with raw_agent(mallory.enrolled) as (nc, errors):
        for subject in (
            f"intake.{mallory.worker_id}.provider.{creds.provider}.agent_enrolled",
            cluster_question(me),
            cluster_question(mallory.worker_id),
        ):
            await nc.publish(subject, b"{}")
            await violation(errors, subject)


async def test_a_revoked_cluster_user_is_refused_and_its_question_unanswered(stack: Stack) -> None:
    creds = await _enrolled_cluster(stack)
    assert await revoke_cluster(stack.log, "lab")
    await synced(stack)
    with pytest.raises(LogUnavailable):
        await EventLog.connect(creds.connection(stack.log.settings), name="revoked")
    # enrolling it again gives new credentials under the same terms; the old password stays refused
    again = await enroll_cluster(stack.log, "lab", provider=creds.provider, region="eu-north")
    await synced(stack)
    with pytest.raises(LogUnavailable):
        await EventLog.connect(creds.connection(stack.log.settings), name="old")
    renewed = msgspec.structs.replace(creds, nats_password=again.password)
    async with await EventLog.connect(renewed.connection(stack.log.settings), name="renewed") as own:
        facts = msgspec.json.decode(await own.ask(cluster_question(dispatcher_id("lab"))), type=ClusterFacts)
        assert facts.error == ""
