"""``resontech dispatcher run``: one Kubernetes cluster as a pool of the kernel's workers.

Life of a dispatcher (docs/dispatcher.md says why each step is so):

1. It reads its state dir (:mod:`ops.dispatcher.state`). With the kernel's credentials it enrolls its
   cluster as the operator (:func:`ops.enrollment.enroll_cluster`, once); with its own NATS user
   (``own_user``) the operator did. It lists the cluster's nodes, claims the enrollment of each new
   one and registers each enrolled one as a worker (:mod:`ops.dispatcher.fleet`). The kernel then asks
   for each new worker's verification job; the dispatcher runs it as a Job on the node and claims its
   report (:mod:`ops.dispatcher.verification`), or, with ``vouch`` (the kernel's credentials only),
   answers by vouching for the node as the operator (``worker.verified``).
2. It reconciles (:mod:`ops.dispatcher.reconcile`) against the kernel's current assignments of its
   workers, which it asks the kernel for (``kernel.cluster.<dispatcher>``, answered by the intake from
   its projections caught up with the log): an assignment it holds that the kernel
   no longer assigns is deleted and nothing is claimed for it; a namespace of its own whose work has
   no current assignment here is deleted; an assignment it holds whose objects vanished is reported
   lost.
3. Then, until stopped, concurrently:

   * every node's commands (``cmd.<worker>``), taken one at a time under one lock and acted on at most
     once (the agent's :func:`agent.commands.admit`): ``start_work`` is recorded, its work's objects
     rendered from every assignment of that work it holds (:mod:`ops.dispatcher.manifests`) and
     applied; an older epoch of the same slot is superseded (its Job or Deployment deleted, never the
     namespace); ``stop_work`` deletes the assignment's objects; a namespace goes a while after its
     work's last assignment here (:mod:`ops.dispatcher.rounds`);
   * a round every ``poll_s``: objects not applied yet are applied again; each work's pods are listed
     and each assignment's pod, with the new lines of its log, becomes claims on the intake
     (:mod:`ops.dispatcher.reporting`); an assignment that ended is metered a last time and
     forgotten;
   * heartbeats for every Ready node (``hb.<worker>``, with the assignments it runs), every
     ``heartbeat_s``; usage ticks of every running pod every ``metering_s``;
   * the node list every ``nodes_s``: new and changed nodes are registered; a cordoned node's worker
     takes no new work (:data:`~ops.dispatcher.fleet.CORDONED`).

4. Stopped, it leaves the cluster as it is: pods do not die with their dispatcher. Its heartbeats
   stop; if it stays away longer than the heartbeat deadline (three intervals: 30 s by default), the
   kernel declares its nodes lost and places their work elsewhere, and the next dispatcher deletes
   what was revoked or cancelled meanwhile, and claims nothing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from agent.commands import admit, command_id, stops, take_commands
from agent.heartbeat import append_reliably
from agent.state import CommandState
from core.errors import ConfigError, EnrollmentRefused, LogUnavailable, ResontechError
from core.log import EventLog
from core.natsauth import cluster_question
from core.reports import Append, rejected
from core.streams import heartbeat_subject, intake_subject, provider_subject, worker_subject
from ops.dispatcher import rounds
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import CORDONED, Fleet, Identity
from ops.dispatcher.reconcile import Held
from ops.dispatcher.state import HeldAssignments, Tracked
from ops.dispatcher.verification import Verifications
from ops.enrollment import enroll_cluster
from projections.providers import dispatcher_id
from schemas.commands import RegistrationRefused, StartWork, StopWork, VerifyWorker
from schemas.envelope import Recorded
from schemas.providers import AgentEnrolled, ClusterFacts
from schemas.workers import Heartbeat, WorkerPolicySet, WorkerRegistered, WorkerVerified

log = logging.getLogger("resontech.dispatcher")
API_KEY_BYTES = 24
QUESTION_S = 10.0
"""How long the dispatcher waits for the kernel's answer about its nodes (the intake catches up first)."""
ENROLL_ROUNDS = 6
JOIN_PAUSE_S = 0.5
"""Node rounds a claimed enrollment may take before the dispatcher says it was refused."""


@dataclass(frozen=True)
class Timing:
    """How often the dispatcher does each thing, in seconds."""

    poll_s: float = 1.0
    heartbeat_s: float = 10.0
    """The kernel loses the nodes after three silent intervals: at 10 s, a dispatcher restart of up to
    about 25 s loses nothing, and a dead node is lost 30 s after Kubernetes marks it NotReady (which
    itself takes 40 s of a silent kubelet by default)."""
    metering_s: float = 10.0
    nodes_s: float = 5.0
    refused_rounds: int = rounds.REFUSED_ROUNDS
    """Times an apply the cluster refuses is tried (a namespace still terminating refuses new objects
    for a while) before the assignment fails."""
    linger_s: float = rounds.LINGER_MS / 1000
    """How long a namespace outlives its work's last assignment here (a replacement may come)."""


class Dispatcher:
    """One cluster's dispatcher. ``await Dispatcher(...).run(stop)`` serves until ``stop`` is set.

    Args:
        cluster: the cluster's API server.
        event_log: the kernel's log (the dispatcher connects with the operator's credentials).
        identity: what its nodes register as.
        ctx: the operator's rendering settings.
        state_dir: where it remembers commands and assignments.
        vouch: vouch for every node as the operator (``worker.verified``; the kernel's credentials only).
        own_user: ``event_log`` connects as the cluster's own NATS user (``resontech dispatcher
            enroll``); otherwise with the kernel's credentials, and the dispatcher enrolls its cluster
            itself, as the operator.
    """

    def __init__(
        self,
        cluster: Cluster,
        event_log: EventLog,
        identity: Identity,
        ctx: RenderContext,
        state_dir: Path,
        *,
        vouch: bool = False,
        timing: Timing = Timing(),
        own_user: bool = False,
    ) -> None:
        if vouch and own_user:
            raise ConfigError(
                "--vouch stores worker.verified, which only the kernel's credentials may: with the "
                "cluster's own NATS user, the verification Job verifies each node"
            )
        self.cluster = cluster
        self.own_user = own_user
        self.id = dispatcher_id(identity.cluster)
        self.facts = ClusterFacts()
        """What the kernel said last of the cluster's nodes (:meth:`ask`)."""
        self.enrolling: dict[str, int] = {}
        """worker id -> node rounds since its enrollment was claimed, until the kernel says it is enrolled."""
        self.log = event_log
        self.ctx = ctx
        self.state_dir = state_dir
        self.vouch = vouch
        self.timing = timing
        self.fleet = Fleet(identity)
        self.commands = CommandState.load(state_dir)
        self.held = HeldAssignments(state_dir)
        self.busy = asyncio.Lock()
        self.emit = intake_claims(event_log)
        """Claim items (canonical subject, event, id) on the intake, as a node-worker."""
        self.rounds = rounds.Rounds(
            cluster=cluster,
            ctx=ctx,
            held=self.held,
            claim=self.emit,
            address_of=self.fleet.address_of,
            busy=self.busy,
            ready=self.fleet.ready,
            refused_rounds=timing.refused_rounds,
            linger_ms=round(timing.linger_s * 1000),
        )
        self.verifications = Verifications(cluster, ctx, self.emit)
        self._takers: dict[str, asyncio.Task[None]] = {}
        self.registered = asyncio.Event()

    # -- the service -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Register the nodes, reconcile, then serve until ``stop`` is set (module docstring)."""
        await self._join(stop)
        current = await self.current()
        async with self.busy:
            await self.rounds.reconcile(current)
        self.registered.set()
        self._take_commands()
        loops = [
            self._every(self.timing.poll_s, self.rounds.poll),
            self._every(self.timing.poll_s, self.verifications.poll),
            self._every(self.timing.heartbeat_s, self.beat),
            self._every(self.timing.metering_s, self.rounds.meter),
            self._every(self.timing.nodes_s, self.refresh_nodes),
        ]
        tasks = [asyncio.create_task(loop) for loop in loops]
        try:
            await stop.wait()
        finally:
            async with self.busy:  # never in the middle of a command or a round
                for task in [*tasks, *self._takers.values()]:
                    task.cancel()
            await asyncio.gather(*tasks, *self._takers.values(), return_exceptions=True)
            self._takers.clear()
            await self.rounds.close()

    async def _join(self, stop: asyncio.Event) -> None:
        """Enroll the cluster (with the kernel's credentials), wait for the kernel's first answer
        about it, and enroll and register the nodes listed now, a few rounds at most (a node the
        kernel refuses must not hold up the others' reconciliation)."""
        if not self.own_user:
            i = self.fleet.identity
            await enroll_cluster(
                self.log,
                i.cluster,
                provider=i.provider,
                pool=i.pool,
                region=i.region,
                owner_tenant=i.owner_tenant,
                by=f"dispatcher {i.cluster}",
                rotate=False,
            )
        while not stop.is_set():  # the intake may start after the dispatcher
            try:
                await self.ask()
                break
            except LogUnavailable as exc:
                log.warning("waiting for the kernel to answer about the cluster: %s", exc.message)
                await asyncio.sleep(1.0)
        for _ in range(ENROLL_ROUNDS):
            await self.refresh_nodes()
            waiting = [
                w for w in self.fleet.nodes if w not in self.fleet.registered and w not in self.fleet.refused
            ]
            if not waiting or stop.is_set():
                return
            await asyncio.sleep(JOIN_PAUSE_S)

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` every ``interval_s`` (from start to start: a slow step does not stretch the
        cadence, which heartbeats depend on), never two at once."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except ResontechError as exc:  # the cluster or the log is away: the next round tries again
                log.warning("%s: %s", step.__name__, exc.message)
            except Exception:  # a bug must not stop the dispatcher's other loops
                log.exception("%s failed", step.__name__)
            await asyncio.sleep(max(0.0, started + interval_s - loop.time()))

    async def ask(self) -> ClusterFacts:
        """Ask the kernel (the intake, caught up with the log) which of the cluster's nodes are
        enrolled and what it assigns them (:func:`projections.clusters.cluster_facts`).

        Raises:
            LogUnavailable: no intake answered.
            EnrollmentRefused: the kernel knows no live enrollment of this cluster.
        """
        data = await self.log.ask(cluster_question(self.id), timeout_s=QUESTION_S)
        facts = msgspec.json.decode(data, type=ClusterFacts)
        if facts.error:
            raise EnrollmentRefused(f"{facts.error}: enroll it with `resontech dispatcher enroll`")
        self.facts = facts
        return facts

    async def current(self) -> list[Held]:
        """The kernel's current assignments of the cluster's workers (listed now, or holding an
        assignment here), as the kernel answers now."""
        workers = set(self.fleet.nodes) | {t.worker_id for t in self.held.values()}
        facts = await self.ask()
        return [
            Held(a.assignment_id, a.tenant, a.work_id, a.kind)
            for a in facts.assignments
            if a.worker_id in workers
        ]

    # -- nodes -----------------------------------------------------------------------------------

    async def refresh_nodes(self) -> None:
        """List the nodes; enroll new ones, register new and changed ones, and take their commands."""
        listing = await self.cluster.nodes()
        due = self.fleet.update(listing.items)
        if self.enrolling or any(w not in self.facts.enrolled for w, _ in due):
            await self.ask()
        for worker_id, event in due:
            if worker_id in self.facts.enrolled:
                self.enrolling.pop(worker_id, None)
                await self._register(worker_id, event)
            else:
                await self._enroll(worker_id, event)
        for worker_id, policy_set in self.fleet.policies_due():
            await self._claim_policy(worker_id, policy_set)
        if self.registered.is_set():  # commands wait for reconcile, which deletes verification Jobs
            self._take_commands()

    def _take_commands(self) -> None:
        """Take the commands of every listed, registered node not taken yet."""
        for worker_id in self.fleet.nodes:
            if worker_id not in self._takers and worker_id in self.fleet.registered:
                handle = self._handler(worker_id)
                self._takers[worker_id] = asyncio.create_task(
                    take_commands(self.log, worker_id, self.busy, handle)
                )

    async def _enroll(self, worker_id: str, event: WorkerRegistered) -> None:
        """Claim a new node's enrollment, once; it registers once the kernel says it is enrolled."""
        rounds_waited = self.enrolling.get(worker_id)
        if rounds_waited is None:
            enrolled = AgentEnrolled(
                token_id=self.facts.token_id, worker_id=worker_id, hostname=event.hostname
            )
            subject = provider_subject(self.fleet.identity.provider, enrolled)
            await self.log.append(intake_subject(self.id, subject), enrolled)
            log.info(
                "node %s: enrollment of worker %s claimed", event.labels.get("kubernetes_node"), worker_id
            )
        elif rounds_waited == ENROLL_ROUNDS:
            log.error(
                "node %s: worker %s is still not enrolled; the intake refused its enrollment "
                "(`resontech quarantine` says why)",
                event.labels.get("kubernetes_node"),
                worker_id,
            )
        self.enrolling[worker_id] = (rounds_waited or 0) + 1

    async def _register(self, worker_id: str, event: WorkerRegistered) -> None:
        try:
            await self.log.append(intake_subject(worker_id, worker_subject(worker_id, event)), event)
        except ResontechError as exc:  # with its own user: NATS may not know the new node's subjects yet
            log.info("worker %s: registration not stored yet, next round: %s", worker_id, exc.message)
            return
        self.fleet.registered[worker_id] = event
        log.info("node %s registered as worker %s", event.labels.get("kubernetes_node"), worker_id)

    async def _claim_policy(self, worker_id: str, policy_set: WorkerPolicySet) -> None:
        await self.log.append(intake_subject(worker_id, worker_subject(worker_id, policy_set)), policy_set)
        before = self.fleet.policies.get(worker_id)
        self.fleet.policies[worker_id] = policy_set.policy
        node = self.fleet.node_of(worker_id)
        if policy_set.policy == CORDONED:
            log.info(
                "node %s is cordoned: worker %s takes no new work until it is uncordoned", node, worker_id
            )
        elif before == CORDONED:
            log.info("node %s is uncordoned: worker %s takes work again", node, worker_id)

    async def beat(self) -> None:
        """One heartbeat for every live node, with the assignments it runs."""
        running: dict[str, list[str]] = {}
        for assignment_id, tracked in self.held.items():
            running.setdefault(tracked.worker_id, []).append(assignment_id)
        beats: list[tuple[str, Any]] = [
            (heartbeat_subject(w), Heartbeat(interval_s=self.timing.heartbeat_s, running=running.get(w, [])))
            for w in self.fleet.alive()
        ]
        if beats:
            await self.log.append_many(beats)

    # -- commands --------------------------------------------------------------------------------

    def _handler(self, worker_id: str) -> Callable[[Recorded[Any]], Awaitable[None]]:
        async def handle(record: Recorded[Any]) -> None:
            cmd = record.event
            match cmd:
                case RegistrationRefused():
                    self.fleet.refused[worker_id] = cmd.reason
                    log.error("the kernel refused worker %s: %s", worker_id, cmd.reason)
                case VerifyWorker() if self.vouch:  # the kernel stored the registration: vouch now
                    by = f"operator: dispatcher of cluster {self.fleet.identity.cluster}"
                    vouched = WorkerVerified(by=by)
                    await self.log.append(worker_subject(worker_id, vouched), vouched)
                case VerifyWorker():
                    await self._verify(worker_id, cmd)
                case StartWork() | StopWork():
                    await self._work(worker_id, cmd, command_id(record))

        return handle

    async def _verify(self, worker_id: str, cmd: VerifyWorker) -> None:
        node = self.fleet.nodes.get(worker_id)
        if node is None:
            log.warning("verification %s for worker %s: its node is gone", cmd.challenge_id, worker_id)
            return  # the kernel's challenge expires, as an agent's that went away
        await self.verifications.start(worker_id, node.name, len(node.gpus), cmd)

    async def _work(self, worker_id: str, cmd: StartWork | StopWork, cmd_id: str) -> None:
        here = self.held.get(cmd.assignment_id)
        admission = admit(self.commands, cmd_id, cmd, here=here.cmd if here else None)
        if admission != "run":
            log.info("command %s for %s: %s, skipped", cmd_id, cmd.assignment_id, admission)
        elif isinstance(cmd, StartWork):
            await self.start(worker_id, cmd)
        elif here is not None and stops(cmd, here.cmd):  # another tenant's work is never stopped
            log.info("stopping %s (%s)", cmd.assignment_id, cmd.reason)
            await self.rounds.forget(here, final=[])
        else:
            log.info("stop for %s (epoch %d): not held here", cmd.assignment_id, cmd.epoch)

    async def start(self, worker_id: str, cmd: StartWork) -> None:
        """Hold ``cmd`` on ``worker_id``'s node and apply its work's objects (or refuse it)."""
        node = self.fleet.node_of(worker_id)
        if node is None or worker_id in self.fleet.refused:
            await self.emit(worker_id, [rejected(cmd, worker_id, "its Kubernetes node is gone")])
            return
        older = [t for t in self.held.values() if _superseded_by(t.cmd, cmd)]
        key = secrets.token_urlsafe(API_KEY_BYTES) if cmd.work_kind == "endpoint" else ""
        self.held[cmd.assignment_id] = Tracked(cmd=cmd, worker_id=worker_id, node=node, api_key=key)
        self.save()
        for old in older:  # held first, so that only the old epoch's own objects go, never the namespace
            log.info("%s superseded by %s (epoch %d)", old.cmd.assignment_id, cmd.assignment_id, cmd.epoch)
            await self.rounds.forget(old, final=[])
        await self.rounds.apply(cmd.tenant, cmd.work_id, cmd.work_kind)

    # -- the state dir ---------------------------------------------------------------------------

    def save(self) -> None:
        """Keep the held assignments in the state dir."""
        self.held.save()


def intake_claims(event_log: EventLog) -> rounds.Claim:
    """A :data:`~ops.dispatcher.rounds.Claim` through ``event_log``: items (canonical subject, event,
    id) appended on the intake as the node-worker, retried as an agent's claims are."""

    async def claim(worker_id: str, items: list[Append]) -> bool:
        claims = [(intake_subject(worker_id, subject), event, event_id) for subject, event, event_id in items]
        return await append_reliably(event_log, claims)

    return claim


def _superseded_by(old: StartWork, new: StartWork) -> bool:
    same = (old.tenant, old.work_id, old.work_kind, old.slot) == (
        new.tenant,
        new.work_id,
        new.work_kind,
        new.slot,
    )
    return same and old.epoch < new.epoch and old.assignment_id != new.assignment_id


async def serve(dispatcher: Dispatcher, stop: asyncio.Event) -> None:
    """Run ``dispatcher`` until ``stop``, and close its cluster client after."""
    try:
        await dispatcher.run(stop)
    finally:
        with contextlib.suppress(Exception):
            dispatcher.cluster.close()
