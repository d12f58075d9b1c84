"""The intake service (``resontech intake``): the one door through which agents' words enter the log.

Agents publish claims on the INTAKE stream under their own worker id (``intake.<worker_id>.<subject>``,
:mod:`core.natsauth`): registrations, reports about their assignments, usage. This service pulls
them from the stream's durable consumer ``intake`` in order, judges each against the kernel's facts
(:func:`projections.claims.judge`, pure), and appends the kernel's own event on the canonical subject,
or copies the claim to QUARANTINE with the reason and the sender; then it acknowledges the claim,
which leaves the work queue. Several instances may share the consumer.

* Event ids: an accepted claim is stored as ``intake-<INTAKE sequence>``, so a claim delivered again
  (the service stopped before acknowledging it) is stored once.
* Usage: each assignment's ticks live on a subject of their own, and every tick is appended with the
  expected last sequence of that subject, the sequence and end of the last tick being read once per
  assignment (``get_last``) and then carried from acknowledgement to acknowledgement. A tick that
  overlaps what was billed is refused; two instances racing on one assignment meet a
  :class:`~core.errors.ConcurrencyConflict`, and the loser reads again and judges again.
* Lag: a claim about something the projections do not know yet (a placement appended a moment ago)
  is judged again once every projection has caught up with its stream as of now; only then refused.
* Progress: at most :data:`PROGRESS` reports a second per assignment; an honest agent sends at
  most one a second (:mod:`agent.reports`).
* Budgets: each agent's claims, and its verification answers, are capped per second
  (:mod:`ops.services.budgets`) before anything else is done with them: over budget, one claim a
  window is quarantined with the reason, the rest dropped and counted (:attr:`Intake.dropped`).
* Addresses: a replica's address is judged by what its host is as an IP address; a name is looked
  up here (``getaddrinfo``, in a thread, at most :data:`RESOLVE_S`) just before its claim is judged,
  and the judge gets the addresses as facts; the kernel's own services are resolved once at start
  (:mod:`core.addresses`).
* Questions: a cluster's dispatcher asks which of its nodes are enrolled and what the kernel assigns
  them (``kernel.cluster.<dispatcher>``); the intake answers from its projections, caught up first.
* Verification: every new worker (or one whose GPUs changed) gets a verification job
  (:mod:`ops.services.verifier`, every round); its answer is checked by computing the expected checksum
  (:func:`core.verification.answer`, in a thread) and :func:`core.verification.judge`; the outcome is
  the kernel's ``worker.verified`` or ``worker.verification_failed``.

One module past 500 lines: the rules live elsewhere (:mod:`projections.claims`, the verifier, the
budgets, :mod:`projections.clusters` for a dispatcher's question); what stays here is one batch's
order of judging, appending and acknowledging, which reads best whole, and the one answer that needs
the same caught-up projections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec

from core import addresses, verification
from core.errors import ConcurrencyConflict, ResontechError
from core.log import EventLog, Pulled
from core.natsauth import CLUSTER_QUESTIONS
from core.settings import Settings
from core.streams import command_subject, split_intake, worker_subject
from core.wire import Position
from ops.process import service_connection
from ops.services.budgets import AgentBudgets, Budget, Rate
from ops.services.verifier import Verifier
from projections import ENDPOINTS, PROVIDERS, REGISTRY, SCHEDULE
from projections.claims import Facts, Refused, Verdict, judge
from projections.clusters import cluster_facts
from projections.registry import RegistryState
from projections.runner import ProjectionRunner
from schemas._base import Event
from schemas.catalog import decode
from schemas.commands import RegistrationRefused
from schemas.endpoints import EndpointReplicaReady
from schemas.jobs import JobProgress
from schemas.metering import UsageTick
from schemas.workers import (
    WorkerRegistered,
    WorkerVerificationFailed,
    WorkerVerificationReported,
    WorkerVerified,
)

log = logging.getLogger("resontech.intake")

DURABLE = "intake"
BATCH = 256
PROGRESS = Budget(per_s=5.0, burst=20.0)
"""Progress reports per assignment (an honest agent coalesces its workload's lines to one a second)."""
CATCH_UP_S = 10.0
CLOCK_MARGIN_NS = 1_000_000_000
"""A claim stored this long before the service last caught up is judged without catching up again
(the margin covers the difference between this host's clock and the server's)."""
NOTICE_EVERY_S = 60.0
RETRY_S = 1.0
"""How soon a claim the log could not take (a stream electing its leader) is delivered again."""
BILLED_KEPT = 100_000
"""Assignments whose last billed tick is remembered (the rest are read again when needed)."""
RESOLVE_S = 5.0
"""How long a replica's host name may take to resolve (then it is judged as not resolving)."""


class Intake:
    """One intake instance. ``await Intake(log).run(stop)`` serves until ``stop`` is set.

    Args:
        event_log: the log (kernel credentials).
        name: recorded as ``by`` on the verification events it appends.
        kernel_addresses: ``host:port`` of the kernel's own services, never a replica's address
            (default: the NATS servers and the object store of ``event_log``'s settings).
        replica_networks: where replicas may be (default: ``event_log``'s settings'
            ``replica_networks``; :func:`core.addresses.parse_networks`).

    Attributes:
        accepted / refused: claims appended / quarantined so far.
    """

    def __init__(
        self,
        event_log: EventLog,
        *,
        name: str = "intake",
        kernel_addresses: frozenset[str] | None = None,
        replica_networks: tuple[addresses.IPNetwork, ...] | None = None,
    ) -> None:
        self.log = event_log
        self.name = name
        self.kernel_addresses = kernel_addresses or addresses.kernel_endpoints(event_log.settings)
        self.kernel_services: frozenset[tuple[addresses.IPAddress, int]] = frozenset()  # at start
        self.replica_networks = replica_networks or addresses.parse_networks(
            event_log.settings.replica_networks
        )
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.endpoints = ProjectionRunner(event_log, ENDPOINTS, write_snapshots=False)
        self.registry: ProjectionRunner[RegistryState] = ProjectionRunner(
            event_log, REGISTRY, write_snapshots=False
        )
        self.providers = ProjectionRunner(event_log, PROVIDERS, write_snapshots=False)
        self.accepted = 0
        self.refused = 0
        self.ready = asyncio.Event()
        self._billed: dict[str, tuple[int, int]] = {}  # meter subject -> (last seq, billed until ms)
        self.progress = Rate(PROGRESS, kept=BILLED_KEPT)  # per assignment, by store time
        self._caught_up_ns = 0
        self._applied = 0
        self.verifier = Verifier(event_log, self.registry, name)
        self._told: dict[str, float] = {}  # worker -> when it was last told its registration was refused
        self.budgets = AgentBudgets()

    @property
    def runners(self) -> tuple[ProjectionRunner[Any], ...]:
        return (self.schedule, self.endpoints, self.registry, self.providers)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the projections and judge claims until ``stop`` is set."""
        tasks = [asyncio.create_task(runner.run(stop)) for runner in self.runners]
        try:
            self.kernel_services = await asyncio.to_thread(
                addresses.kernel_services, (f"http://{a}" for a in self.kernel_addresses)
            )
            await asyncio.gather(*(runner.caught_up.wait() for runner in self.runners))
            self._caught_up_ns = time.time_ns() - CLOCK_MARGIN_NS
            self.ready.set()
            log.info("%s caught up; judging claims", self.name)
            tasks.append(
                asyncio.create_task(self.log.answer(f"{CLUSTER_QUESTIONS}.*", self.cluster_question, stop))
            )
            async with contextlib.aclosing(self._batches(stop)) as batches:
                async for batch in batches:
                    await self.handle(batch)
                    await self.verifier.step(time.time_ns())
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task

    async def _batches(self, stop: asyncio.Event) -> AsyncGenerator[list[Pulled], None]:
        pulling = self.log.pull("INTAKE", DURABLE, batch=BATCH, wait_s=0.5)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                nxt = asyncio.ensure_future(anext(pulling))
                await asyncio.wait({nxt, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await nxt
                    break
                yield nxt.result()
        finally:
            stopping.cancel()
            await pulling.aclose()

    async def handle(self, batch: list[Pulled]) -> None:
        """Judge a batch of claims in order and acknowledge each once settled. Appends are pipelined;
        usage ticks of different assignments are judged concurrently, those of one assignment in
        order (each expects the sequence the previous one got)."""
        pending: list[tuple[Pulled, asyncio.Future[Position] | None]] = []
        self._applied = 0  # of ``pending``, those the projections had applied at the last catch-up
        usage: dict[str, list[tuple[Pulled, str, UsageTick]]] = {}
        for claim in batch:
            try:
                if await self._over_budget(claim):
                    pending.append((claim, None))
                    continue
                parsed = await self._parse(claim)
                if parsed is None:
                    pending.append((claim, None))
                    continue
                sender, subject, event = parsed
                if isinstance(event, UsageTick):
                    usage.setdefault(subject, []).append((claim, sender, event))
                    continue
                pending.append((claim, await self._claim(claim, sender, subject, event, pending)))
            except ResontechError as exc:  # the log is unavailable: judged again shortly
                log.warning("claim %s not handled yet: %s", claim.seq, exc.message)
                await claim.retry(RETRY_S)
        await asyncio.gather(*(self._usage_in_order(subject, ticks) for subject, ticks in usage.items()))
        for claim, future in pending:
            if future is not None:
                try:
                    await future
                except ResontechError as exc:
                    log.warning("claim %s not stored yet: %s", claim.seq, exc.message)
                    await claim.retry(RETRY_S)
                    continue
            await claim.ack()

    @property
    def dropped(self) -> int:
        """Claims over their agent's budget dropped uncopied (:mod:`ops.services.budgets`)."""
        return self.budgets.dropped

    async def _over_budget(self, claim: Pulled) -> bool:
        """Charge ``claim`` to its sender's budget; ``True`` once one over it is settled (quarantined
        with the reason, or dropped and counted: the caller acknowledges it)."""
        sender = claim.subject.split(".")[1] if claim.subject.count(".") >= 1 else ""
        over = self.budgets.take(
            sender, claim.subject.endswith(".verification_reported"), claim.time_ns / 1e9
        )
        if over is None:
            return False
        if over.reason is not None:
            await self._refuse(claim, sender, over.reason)
        return True

    async def _parse(self, claim: Pulled) -> tuple[str, str, Event] | None:
        """``(sender, claimed subject, event)``, or ``None`` once a claim the kernel cannot read is
        quarantined."""
        try:
            sender, subject = split_intake(claim.subject)
            return sender, subject, decode(subject.split(".", 1)[0], claim.data)
        except (ResontechError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            sender = claim.subject.split(".")[1] if claim.subject.count(".") >= 1 else ""
            await self._refuse(claim, sender, f"not a claim the kernel reads: {exc}")
            return None

    async def _claim(
        self,
        claim: Pulled,
        sender: str,
        subject: str,
        event: Event,
        pending: list[tuple[Pulled, asyncio.Future[Position] | None]],
    ) -> asyncio.Future[Position] | None:
        """Judge one claim; the future of its canonical append, or ``None`` once it is settled."""
        if isinstance(event, WorkerVerificationReported):
            await _settled(pending)
            await self._verification(claim, sender, subject, event)
            return None
        verdict = await self._judged(claim, sender, event, pending)
        if isinstance(verdict, Refused):
            await self._refuse(claim, sender, verdict.reason)
            if isinstance(event, WorkerRegistered):
                await self._tell_refused(sender, verdict.reason)
            return None
        if isinstance(verdict.event, JobProgress) and not self.progress.take(
            verdict.event.assignment_id, claim.time_ns / 1e9
        ):
            await self._refuse(claim, sender, f"more than {PROGRESS.per_s:g} progress reports a second")
            return None
        self.accepted += 1
        return await self.log.submit(verdict.subject, verdict.event, event_id=f"intake-{claim.seq}")

    async def _usage_in_order(self, subject: str, ticks: list[tuple[Pulled, str, UsageTick]]) -> None:
        for i, (claim, sender, tick) in enumerate(ticks):
            try:
                await self._usage(claim, sender, subject, tick)
            except ResontechError as exc:  # judged again shortly, and so are the later ones
                log.warning("usage claim %s not handled yet: %s", claim.seq, exc.message)
                for later, _, _ in ticks[i:]:
                    await later.retry(RETRY_S)
                return
            await claim.ack()

    async def _judged(
        self,
        claim: Pulled,
        sender: str,
        event: Event,
        pending: list[tuple[Pulled, asyncio.Future[Position] | None]],
        billed_until_ms: int = 0,
    ) -> Verdict:
        resolved = await _resolved(event)
        facts = self._facts(claim, resolved)
        verdict = judge(sender, claim.subject, event, facts, billed_until_ms=billed_until_ms)
        # appended by this batch since the last catch-up: the claim may be about one of them
        unapplied = any(future is not None for _, future in pending[self._applied :])
        if (
            isinstance(verdict, Refused)
            and verdict.unknown
            and (unapplied or claim.time_ns >= self._caught_up_ns)
        ):
            await _settled(pending)
            await self.catch_up()
            self._applied = len(pending)
            facts = self._facts(claim, resolved)
            verdict = judge(sender, claim.subject, event, facts, billed_until_ms=billed_until_ms)
        return verdict

    def _facts(self, claim: Pulled, resolved: dict[str, tuple[str, ...]] | None = None) -> Facts:
        return Facts(
            schedule=self.schedule.state,
            endpoints=self.endpoints.state,
            registry=self.registry.state,
            providers=self.providers.state,
            now_ns=claim.time_ns,
            kernel_addresses=self.kernel_addresses,
            kernel_services=self.kernel_services,
            replica_networks=self.replica_networks,
            resolved=resolved or {},
        )

    async def cluster_question(self, subject: str, _: bytes) -> bytes:
        """A dispatcher's question about its nodes (:func:`projections.clusters.cluster_facts`), answered
        once the projections have caught up with the log: a restarted dispatcher reconciles against
        the kernel as it is now. The asker is the subject's last token, which NATS lets only that
        dispatcher's user publish (:func:`core.natsauth.dispatcher_permissions`)."""
        await self.catch_up()
        sender = subject.rsplit(".", 1)[-1]
        facts = cluster_facts(self.providers.state, self.schedule.state, self.endpoints.state, sender)
        return msgspec.json.encode(facts)

    async def catch_up(self) -> None:
        """Wait until every projection has applied its stream as it is now."""
        started = time.time_ns()
        for runner in self.runners:
            last = await self.log.last_seq(runner.projection.stream)
            with contextlib.suppress(TimeoutError):
                await runner.wait_for(last, CATCH_UP_S)
        self._caught_up_ns = started - CLOCK_MARGIN_NS

    async def _refuse(self, claim: Pulled, sender: str, reason: str) -> None:
        self.refused += 1
        log.warning("refused claim %s from %s on %s: %s", claim.seq, sender, claim.subject, reason)
        await self.log.quarantine_now("INTAKE", claim.seq, claim.subject, claim.data, reason, sender=sender)

    async def _tell_refused(self, worker_id: str, reason: str) -> None:
        """Tell an agent its registration was refused (at most once a minute per worker: the notice
        lands in its own command queue, which a hostile agent must not be able to grow)."""
        now = time.monotonic()
        if now - self._told.get(worker_id, -math.inf) < NOTICE_EVERY_S:
            return
        self._told[worker_id] = now
        with contextlib.suppress(ResontechError):
            await self.log.append(command_subject(worker_id), RegistrationRefused(reason=reason))

    # -- usage -----------------------------------------------------------------------------------

    async def _usage(self, claim: Pulled, sender: str, subject: str, tick: UsageTick) -> None:
        for _ in range(3):
            last_seq, billed_until = await self._billed_of(subject)
            if last_seq and await self._already_stored(subject, claim):
                return
            verdict = await self._judged(claim, sender, tick, [], billed_until)
            if isinstance(verdict, Refused):
                await self._refuse(claim, sender, verdict.reason)
                return
            try:
                position = await self.log.append(
                    verdict.subject, verdict.event, event_id=f"intake-{claim.seq}", expected_seq=last_seq
                )
            except ConcurrencyConflict:  # another instance billed this assignment meanwhile
                self._billed.pop(subject, None)
                continue
            assert isinstance(verdict.event, UsageTick)
            self._remember(subject, position.seq, verdict.event.end_ms)
            self.accepted += 1
            return
        await self._refuse(claim, sender, "the assignment's usage kept changing while it was judged")

    async def _billed_of(self, subject: str) -> tuple[int, int]:
        """``(sequence, end ms)`` of the last tick stored on ``subject`` ((0, 0) for none)."""
        known = self._billed.get(subject)
        if known is not None:
            return known
        last = await self.log.get_last("METERING", subject)
        found = (0, 0) if last is None else (last.seq, int(last.event.end_ms))
        self._remember(subject, *found)
        return found

    async def _already_stored(self, subject: str, claim: Pulled) -> bool:
        """Whether this very claim's tick is the last one stored (delivered again after a restart)."""
        if claim.delivered <= 1:
            return False
        last = await self.log.get_last("METERING", subject)
        return last is not None and last.msg_id == f"intake-{claim.seq}"

    def _remember(self, subject: str, seq: int, end_ms: int) -> None:
        if len(self._billed) >= BILLED_KEPT:
            for key in list(self._billed)[: BILLED_KEPT // 2]:  # the oldest half
                del self._billed[key]
        self._billed.pop(subject, None)
        self._billed[subject] = (seq, end_ms)

    # -- verification ----------------------------------------------------------------------------

    async def _verification(
        self, claim: Pulled, sender: str, subject: str, report: WorkerVerificationReported
    ) -> None:
        if subject != worker_subject(sender, report):
            await self._refuse(claim, sender, f"a worker answers only its own verification: {subject}")
            return
        for _ in range(3):
            worker = self.registry.state.workers.get(sender)
            open_challenge = worker.challenge if worker is not None else None
            if worker is None or open_challenge is None:
                await self._refuse(claim, sender, f"worker {sender} has no open verification challenge")
                return
            challenge = open_challenge.request
            try:
                expected = await asyncio.to_thread(
                    verification.answer, challenge.seed, challenge.size, challenge.rounds
                )
            except ValueError as exc:
                expected = f"unanswerable challenge: {exc}"
            reason = verification.judge(
                challenge,
                requested_ns=open_challenge.requested_ns,
                received_ns=claim.time_ns,
                report=report,
                registered_gpus=worker.registration.gpus,
                expected_checksum=expected,
            )
            outcome: Event = (
                WorkerVerified(
                    challenge_id=challenge.challenge_id,
                    elapsed_ms=report.elapsed_ms,
                    gpu_tflops=report.gpu_tflops,
                    by=self.name,
                )
                if reason is None
                else WorkerVerificationFailed(
                    reason=reason, challenge_id=challenge.challenge_id, by=self.name
                )
            )
            try:
                await self.log.append(
                    worker_subject(sender, outcome),
                    outcome,
                    event_id=f"intake-{claim.seq}",
                    expected_seq=worker.last_seq,
                    expected_filter=f"worker.{sender}.>",
                )
            except ConcurrencyConflict:  # the worker changed meanwhile: judge against what it is now
                await self.catch_up()
                continue
            self.accepted += 1
            log.info(
                "worker %s: %s", sender, "verified" if reason is None else f"verification failed: {reason}"
            )
            return
        await self._refuse(claim, sender, "the worker kept changing while its verification was judged")


async def _resolved(event: Event) -> dict[str, tuple[str, ...]]:
    """What the host name of a replica's address resolves to now (``{}`` for any other claim, an
    address that names an IP address or does not parse: the judge reads those itself)."""
    if not isinstance(event, EndpointReplicaReady):
        return {}
    try:
        host, port = addresses.url_host_port(event.address)
        if addresses.literal_ip(host) is not None:
            return {}
    except ResontechError:
        return {}
    try:
        found = await asyncio.wait_for(asyncio.to_thread(addresses.resolve, host, port), RESOLVE_S)
    except TimeoutError:
        found = ()
    return {host.lower(): found}


async def _settled(pending: list[tuple[Pulled, asyncio.Future[Position] | None]]) -> None:
    """Wait for the appends already submitted (their outcome is handled by :meth:`Intake.handle`)."""
    for _, future in pending:
        if future is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(future)


async def serve(
    settings: Settings,
    *,
    name: str = "intake",
    kernel_addresses: frozenset[str] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run one intake until SIGINT/SIGTERM (or ``stop``)."""
    async with service_connection(settings, name, stop) as (event_log, stopping):
        await Intake(event_log, name=name, kernel_addresses=kernel_addresses).run(stopping)


@contextlib.asynccontextmanager
async def running(settings: Settings, *, name: str = "intake") -> AsyncIterator[Intake]:
    """An intake on a connection of its own, judging claims until the block ends (tests, benches)."""
    own = await EventLog.connect(settings, name=name)
    instance = Intake(own, name=name)
    stop = asyncio.Event()
    task = asyncio.create_task(instance.run(stop))
    try:
        await asyncio.wait(
            {task, asyncio.ensure_future(instance.ready.wait())}, return_when="FIRST_COMPLETED"
        )
        if task.done():
            task.result()
        yield instance
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await own.close()
