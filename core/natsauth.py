"""NATS credentials of enrolled agents: what each agent may publish and receive, and the nats-server
configuration that enforces it.

Design: two NATS accounts on the one server (or cluster).

* ``KERNEL`` holds JetStream and every stream. The kernel's own services (gateway, coordinator,
  projector, the dev stack's agents) connect as a kernel user with full access.
* ``AGENTS`` holds one user per enrolled agent (``agent-<worker_id>``, a bcrypt-hashed random
  password). It has no JetStream of its own: it *imports* from ``KERNEL``, as services, exactly the
  subjects an agent publishes to (its events, heartbeats, metering ticks) and the JetStream API calls
  its command intake makes, under the prefix ``JS.KERNEL.API``. Each user's permissions then narrow
  those imports to the agent's own worker id: its heartbeat subject, its worker events, its metering
  ticks, its own durable consumer on COMMANDS, and replies on its own inbox prefix
  ``_INBOX_<worker_id>``.

Why two accounts rather than permissions in one: NATS checks the subject a client publishes to, not
the reply subject it names, and JetStream publishes its acknowledgement to that reply subject. In a
single account an agent could publish its own heartbeat with the reply subject ``tenant.x.created``
and have the server store the acknowledgement on the TENANTS stream (checked with nats-server 2.15).
Across a service import the server replaces the reply subject with its own, so a reply always comes
back to the agent's account, where no stream listens.

Why user/password and not decentralised JWTs: nats-py signs the server's nonce with the ``nkeys``
package for JWT or nkey users; passwords need no second signing path in every client. Passwords are
256-bit random, shown to the agent once, and stored only as bcrypt hashes (the ``bcrypt`` package;
in the ``AgentEnrolled`` event, from which :mod:`ops.services.natsauth` renders the server's agent users and
reloads the server).

What an agent may publish: its own heartbeats (``hb.<worker_id>``), and claims on the INTAKE stream
under its own worker id (``intake.<worker_id>.<subject>``): its registration, its reports about
assignments, its usage. It cannot publish on any stream the projections fold. The intake service
(:mod:`ops.services.intake`) checks each claim against the kernel's facts and appends the kernel's own event,
or quarantines the claim with its reason and sender: the worker id in the subject is what NATS lets
that user publish, so the sender of a claim is known, and what the claim says is not believed.
An agent may still create its own consumer with other options than the kernel's (never with another
filter: the server refuses a filter that differs from the one in the create subject).

A Kubernetes cluster's dispatcher (:mod:`ops.dispatcher`) is one more user of ``AGENTS``
(``dispatcher-<cluster>``, :func:`dispatcher_permissions`): the agent permissions of every node-worker
of its cluster that is enrolled, listed one by one (a NATS wildcard matches whole tokens, and a node's
id is one token), regenerated as nodes enroll; plus the one claim that enrolls a new node of its
cluster (``intake.<dispatcher>.provider.<provider>.agent_enrolled``, which the intake judges) and its
question about its nodes (``kernel.cluster.<dispatcher>``, answered by the intake). Its replies come on
``_INBOX_<dispatcher>``, an id in the kernel's namespace, so no agent's inbox can be its.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import bcrypt

from core.streams import command_consumer, command_subject, token
from schemas._base import Event
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import (
    JobCheckpointed,
    JobCheckpointPartStored,
    JobFailed,
    JobProgress,
    JobRejected,
    JobShardCompleted,
    JobStarted,
)
from schemas.metering import UsageTick
from schemas.providers import AgentEnrolled
from schemas.workers import WorkerPolicySet, WorkerRegistered, WorkerVerificationReported

KERNEL_ACCOUNT = "KERNEL"
AGENTS_ACCOUNT = "AGENTS"
KERNEL_USER = "kernel"
JS_API = "$JS.API"
CLUSTER_QUESTIONS = "kernel.cluster"
AGENT_JS_API_PREFIX = "JS.KERNEL.API"
"""Where an agent reaches the kernel's JetStream API (``Settings.nats_js_api_prefix``)."""
BCRYPT_COST = 8
"""bcrypt cost of agent passwords: each is 256 random bits, so its strength is its entropy, and the
server checks the hash at every connect."""

AGENT_WORKER_EVENTS: tuple[type[Event], ...] = (WorkerRegistered, WorkerPolicySet, WorkerVerificationReported)
"""What an agent claims about its worker (``agent.service``). Not cordoned/uncordoned/lost/recovered/
verified: those are the kernel's to say, and an agent must not uncordon or verify itself."""
AGENT_JOB_EVENTS: tuple[type[Event], ...] = (
    JobStarted,
    JobRejected,
    JobProgress,
    JobCheckpointed,
    JobCheckpointPartStored,
    JobShardCompleted,
    JobFailed,
)
"""What an agent reports about a job's shard (``agent.reports``)."""
AGENT_ENDPOINT_EVENTS: tuple[type[Event], ...] = (
    EndpointReplicaStarting,
    EndpointReplicaReady,
    EndpointReplicaLost,
)
"""What an agent reports about an endpoint replica (``agent.reports``)."""
AGENT_USAGE_EVENTS: tuple[type[Event], ...] = (UsageTick,)
"""What an agent claims it used (``agent.reports.Meter``): GPU and CPU time, never tokens."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """NATS subjects (with wildcards) a user may publish to and subscribe to; nothing else."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KernelService:
    """A subject the ``KERNEL`` account exports to ``AGENTS``.

    Attributes:
        subject: the subject in ``KERNEL`` (wildcards allowed).
        local: the subject agents publish to (the JetStream API moves under ``JS.KERNEL.API``).
        streamed: the answer is several messages (a pull consumer's batch), not one.
    """

    subject: str
    local: str
    streamed: bool = False


def agent_user(worker_id: str) -> str:
    """The NATS user of an enrolled agent: ``agent-<worker_id>``."""
    return f"agent-{token(worker_id, 'worker id')}"


def dispatcher_user(cluster: str) -> str:
    """The NATS user of a cluster's dispatcher: ``dispatcher-<cluster>``."""
    return f"dispatcher-{token(cluster, 'cluster')}"


def inbox_prefix(worker_id: str) -> str:
    """The reply-subject prefix of an enrolled agent (``Settings.nats_inbox_prefix``)."""
    return f"_INBOX_{token(worker_id, 'worker id')}"


def _agent_event_patterns(worker: str) -> tuple[str, ...]:
    """The subjects an agent publishes events to; ``worker`` is its id, or ``*`` for any: its
    heartbeats, and its claims on the intake under its own id (``intake.<worker>.<subject>``)."""
    claims = (
        *(f"worker.{worker}.{e.event_name()}" for e in AGENT_WORKER_EVENTS),
        *(f"job.*.*.{e.event_name()}" for e in AGENT_JOB_EVENTS),
        *(f"endpoint.*.*.{e.event_name()}" for e in AGENT_ENDPOINT_EVENTS),
        *(f"meter.*.{worker}.*.{e.event_name()}" for e in AGENT_USAGE_EVENTS),
    )
    return (f"hb.{worker}", *(f"intake.{worker}.{claim}" for claim in claims))


def agent_permissions(worker_id: str) -> Permissions:
    """What the agent of ``worker_id`` may do, and nothing more (see the module docstring)."""
    consumer = command_consumer(worker_id)  # checks that the id is one subject token
    api = AGENT_JS_API_PREFIX
    return Permissions(
        publish=(
            *_agent_event_patterns(worker_id),
            f"{api}.CONSUMER.INFO.COMMANDS.{consumer}",
            f"{api}.CONSUMER.CREATE.COMMANDS.{consumer}.{command_subject(worker_id)}",
            f"{api}.CONSUMER.MSG.NEXT.COMMANDS.{consumer}",
            f"$JS.ACK.COMMANDS.{consumer}.>",
        ),
        subscribe=(f"{inbox_prefix(worker_id)}.>",),
    )


def cluster_question(dispatcher: str) -> str:
    """Where a cluster's dispatcher asks the kernel for its nodes' enrollment and assignments
    (``kernel.cluster.<dispatcher id>``; the intake answers, :class:`schemas.providers.ClusterFacts`)."""
    return f"{CLUSTER_QUESTIONS}.{token(dispatcher, 'dispatcher id')}"


def _node_enrollment(dispatcher: str, provider: str) -> str:
    """The claim a dispatcher enrolls a new node-worker with (judged by :mod:`projections.claims`)."""
    return f"intake.{dispatcher}.provider.{provider}.{AgentEnrolled.event_name()}"


def dispatcher_permissions(dispatcher: str, provider: str, nodes: Iterable[str]) -> Permissions:
    """What the dispatcher of a cluster may do: exactly what the agents of its enrolled node-workers
    ``nodes`` may (their heartbeats, claims and commands), plus enrolling new nodes of its provider
    and asking about its nodes, with replies on its own inbox prefix. Nothing of another worker, no
    stream read, no kernel event."""
    own = (_node_enrollment(dispatcher, provider), cluster_question(dispatcher))
    for_nodes = (s for node in nodes for s in agent_permissions(node).publish)
    return Permissions(publish=(*own, *for_nodes), subscribe=(f"{inbox_prefix(dispatcher)}.>",))


def kernel_services() -> tuple[KernelService, ...]:
    """Everything ``KERNEL`` exports to ``AGENTS``: the union of every agent's and dispatcher's
    permissions, with the worker id, dispatcher id and provider as wildcards."""
    events = [KernelService(s, s) for s in (*_agent_event_patterns("*"), _node_enrollment("*", "*"))]
    events.append(KernelService(f"{CLUSTER_QUESTIONS}.*", f"{CLUSTER_QUESTIONS}.*"))
    api = [
        ("CONSUMER.INFO.COMMANDS.*", False),
        ("CONSUMER.CREATE.COMMANDS.*.cmd.*", False),
        ("CONSUMER.MSG.NEXT.COMMANDS.*", True),
    ]
    calls = [KernelService(f"{JS_API}.{s}", f"{AGENT_JS_API_PREFIX}.{s}", streamed) for s, streamed in api]
    return (*events, *calls, KernelService("$JS.ACK.COMMANDS.>", "$JS.ACK.COMMANDS.>"))


def _q(value: str) -> str:
    return json.dumps(value)  # NATS config reads JSON strings; quoted, a '$' is not a variable


def server_accounts(kernel_users: Mapping[str, str], agents_file: str) -> str:
    """The ``accounts { ... }`` block of the server's configuration.

    Args:
        kernel_users: user -> bcrypt hash of its password, for the kernel's services.
        agents_file: the file holding the agents' ``users = [...]``, relative to the configuration
            file (nats-server resolves every include so); :func:`agent_users` renders it, and it is
            rewritten and reloaded while the server runs.
    """
    users = ", ".join(f"{{user: {_q(u)}, password: {_q(h)}}}" for u, h in sorted(kernel_users.items()))
    services = kernel_services()
    exports = [
        f"      {{service: {_q(s.subject)}, accounts: [{AGENTS_ACCOUNT}]"
        + (", response_type: stream" if s.streamed else "")
        + "}"
        for s in services
    ]
    imports = [
        f"      {{service: {{account: {KERNEL_ACCOUNT}, subject: {_q(s.subject)}}}, to: {_q(s.local)}}}"
        for s in services
    ]
    return "\n".join(
        [
            "accounts {",
            f"  {KERNEL_ACCOUNT} {{",
            "    jetstream: enabled",
            f"    users = [{users}]",
            "    exports = [",
            *exports,
            "    ]",
            "  }",
            f"  {AGENTS_ACCOUNT} {{",
            "    imports = [",
            *imports,
            "    ]",
            f"    include {_q(agents_file)}",
            "  }",
            "}",
        ]
    )


@dataclass(frozen=True, slots=True)
class DispatcherUser:
    """A cluster's dispatcher as the server's configuration holds it.

    Attributes:
        nodes: its enrolled node-workers, whose agent permissions it has.
    """

    cluster: str
    dispatcher: str
    provider: str
    password_bcrypt: str
    nodes: tuple[str, ...]


def agent_users(agents: Iterable[tuple[str, str]], dispatchers: Iterable[DispatcherUser] = ()) -> str:
    """The agents file: ``users = [...]`` for ``(worker_id, password bcrypt)`` pairs, each with its
    :func:`agent_permissions`, and for each dispatcher its :func:`dispatcher_permissions`."""
    lines = [
        "# generated by resontech from the PROVIDERS stream (ops/services/natsauth.py); do not edit",
        "users = [",
    ]
    users = [(agent_user(w), bcrypt_hash, agent_permissions(w)) for w, bcrypt_hash in agents]
    users += [
        (
            dispatcher_user(d.cluster),
            d.password_bcrypt,
            dispatcher_permissions(d.dispatcher, d.provider, d.nodes),
        )
        for d in dispatchers
    ]
    for user, password_bcrypt, perms in users:
        publish = ", ".join(_q(s) for s in perms.publish)
        subscribe = ", ".join(_q(s) for s in perms.subscribe)
        lines.append(
            f"  {{user: {_q(user)}, password: {_q(password_bcrypt)}, permissions: {{"
            f"publish: {{allow: [{publish}]}}, subscribe: {{allow: [{subscribe}]}}}}}}"
        )
    return "\n".join([*lines, "]"]) + "\n"


def new_password() -> str:
    """A fresh random password (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def bcrypt_hash(password: str, cost: int = BCRYPT_COST) -> str:
    """The bcrypt hash of ``password`` in the ``$2b$`` form nats-server accepts."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()
