"""This federation service instance's claims on federated jobs (:mod:`core.federation_claims`):
following the FEDERATION stream, beating, claiming, recording a provisioning, releasing.

One :class:`ClaimKeeper` per service process (one *incarnation* of the instance: a random id drawn
here). It folds the stream into a :class:`~core.federation_claims.ClaimsView` as it is stored, and
every :data:`~core.federation_claims.BEAT_FRACTION` of its lease it appends one beat (renewing every
claim it holds: one append per instance, whatever the number of jobs) and the claims the decision
function asks for. Every append is made against the view's last sequence over the whole stream; a
conflict means the view is stale: it reads on (until it has what the server has) and decides again.

After each acknowledged append it moves :attr:`ClaimKeeper.serving_until` (and the fence's file,
:mod:`ops.federation.fence`): the instance may serve a job while it holds it and that instant, on
``CLOCK_BOOTTIME``, is ahead (:meth:`ClaimKeeper.may_serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from core.errors import ConcurrencyConflict, ResontechError
from core.federation_claims import (
    BEAT_FRACTION,
    LEASE_S,
    ClaimsView,
    Holder,
    Provisioning,
    Sighting,
    claims_to_make,
    evolve,
    held,
    observe,
    serving_until,
)
from core.log import EventLog
from core.streams import FEDERATION_FILTER, federation_beat_subject, federation_subject
from ops.federation import fence
from schemas._base import Event
from schemas.envelope import Recorded
from schemas.federation import FederationBeat, FederationClaimed, FederationProvisioned, FederationReleased

log = logging.getLogger("resontech.federation")
STREAM = "FEDERATION"
CATCH_UP_S = 10.0
"""How long to wait for the view to reach the stream's end after a conflict."""
APPEND_TRIES = 3
"""Appends tried against a fresh view before giving up until the next beat (two instances beating
at the same moment conflict once; the second try wins)."""


class ClaimLost(ResontechError):
    """A federation must end without touching its job: another instance holds it now (or its
    provisioning could not be recorded yet; the service starts the federation again while it holds
    the claim)."""

    code = "claim_lost"


class ClaimKeeper:
    """The claims of one incarnation of instance ``instance``.

    Args:
        event_log: the log.
        instance: this instance's name (a subject token).
        live_jobs: returns the keys (``tenant/job_id``) of the federated jobs that need an FL server.
        lease_s: how long this instance may stay silent before another takes its jobs over (default
            :data:`~core.federation_claims.LEASE_S`, 8 s).
        fence_root: the directory whose fence file this keeper moves (``None``: no fence).
    """

    def __init__(
        self,
        event_log: EventLog,
        instance: str,
        live_jobs: Callable[[], Iterable[str]],
        *,
        lease_s: float = LEASE_S,
        fence_root: Path | None = None,
    ) -> None:
        self.log = event_log
        self.instance = instance
        self.incarnation = secrets.token_hex(8)
        self.live_jobs = live_jobs
        self.lease_s = lease_s
        self.fence_root = fence_root
        self.view = ClaimsView()
        self.sightings: dict[str, Sighting] = {}
        self.serving_until = float("-inf")
        """Until when (``CLOCK_BOOTTIME`` seconds) this incarnation may serve what it holds."""
        self.lapses = 0
        """How many times ``serving_until`` passed before a renewal moved it on."""
        self.caught_up = asyncio.Event()
        self.wake = asyncio.Event()
        """Set to beat and claim now rather than at the next beat (a new job is waiting)."""
        self._moved = asyncio.Event()
        self._claiming = True

    # -- what the service asks -------------------------------------------------------------------

    def holder(self, key: str) -> Holder | None:
        """The current claim on job ``key``."""
        return self.view.holders.get(key)

    def holds(self, key: str) -> bool:
        """Whether this incarnation holds job ``key`` (it may not be allowed to serve it right now)."""
        holder = self.view.holders.get(key)
        return holder is not None and holder.incarnation == self.incarnation

    def may_serve(self, key: str) -> bool:
        """Whether this incarnation may run job ``key``'s FL server now: it holds it, and its latest
        renewal is recent enough."""
        return self.holds(key) and fence.now() < self.serving_until

    def held(self) -> set[str]:
        """The jobs this incarnation holds."""
        return held(self.view, self.incarnation)

    def provisioning(self, key: str) -> Provisioning | None:
        """Job ``key``'s federation as a holder provisioned it (``None``: not yet)."""
        return self.view.provisioned.get(key)

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the stream, beat and claim until ``stop`` is set (then give up nothing: see
        :meth:`release`)."""
        watch = await self.log.watch(STREAM, self._fold)
        try:
            await self._catch_up()
            self.sightings = observe(self.view, {}, time.monotonic())
            self.caught_up.set()
            while not stop.is_set():
                started = time.monotonic()
                await self._round()
                self.wake.clear()
                # Beats are spaced from start to start: a slow acknowledgement does not delay the next.
                pause = max(0.0, started + self.lease_s * BEAT_FRACTION - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), pause)
        finally:
            await watch.stop()

    async def _round(self) -> None:
        try:
            await self._beat()
            self.sightings = observe(self.view, self.sightings, time.monotonic())
            live = list(self.live_jobs()) if self._claiming else []
            for claim in claims_to_make(self.view, self.incarnation, live, self.sightings, time.monotonic()):
                tenant, job_id = claim.key.split("/", 1)
                event = FederationClaimed(
                    instance=self.instance,
                    incarnation=self.incarnation,
                    term=claim.term,
                    lease_ms=round(self.lease_s * 1000),
                    took_over_from=claim.took_over_from,
                )
                if not await self._append(federation_subject(tenant, job_id, event), event, tries=1):
                    break  # the view moved: decide again at the next round
                how = f"took it over from {claim.took_over_from}" if claim.took_over_from else "unclaimed"
                log.info("%s claimed %s (term %d; %s)", self.instance, claim.key, claim.term, how)
        except Exception as exc:  # NATS unreachable or slow: serving stops when the lease says so,
            # and the next round tries again; nothing here may end the keeper (and the service)
            log.warning("%s could not renew its claims: %s: %s", self.instance, type(exc).__name__, exc)

    async def _beat(self) -> None:
        beat = FederationBeat(incarnation=self.incarnation, lease_ms=round(self.lease_s * 1000))
        await self._append(federation_beat_subject(self.instance), beat)

    async def release(self, reason: str) -> None:
        """Give up every claim this incarnation holds (its FL servers must be stopped first), so that
        another instance takes the jobs over at once rather than after a lease; claim nothing after."""
        self._claiming = False
        for key in sorted(self.held()):
            holder = self.view.holders[key]
            tenant, job_id = key.split("/", 1)
            event = FederationReleased(
                instance=self.instance, incarnation=self.incarnation, term=holder.term, reason=reason
            )
            with contextlib.suppress(Exception):  # unreleased, it lapses: only slower to take over
                if await self._append(federation_subject(tenant, job_id, event), event, still_held=key):
                    log.info("%s released %s: %s", self.instance, key, reason)

    async def record_provisioned(self, key: str, archive: str, server: str) -> bool:
        """Say on the log that job ``key``'s federation is stored as ``archive`` (clients dial
        ``server``); whether it was appended (False: this incarnation no longer holds the job)."""
        holder = self.view.holders.get(key)
        if holder is None or holder.incarnation != self.incarnation:
            return False
        tenant, job_id = key.split("/", 1)
        event = FederationProvisioned(
            instance=self.instance,
            incarnation=self.incarnation,
            term=holder.term,
            archive=archive,
            server=server,
        )
        return await self._append(federation_subject(tenant, job_id, event), event, still_held=key)

    # -- appending against the view --------------------------------------------------------------

    async def _append(
        self, subject: str, event: Event, *, tries: int = APPEND_TRIES, still_held: str = ""
    ) -> bool:
        """Append ``event`` against the view; whether it was stored. A conflict reads on and tries
        again (while ``still_held``, if given, is still held), up to ``tries`` times."""
        for _ in range(tries):
            if still_held and not self.holds(still_held):
                return False
            sent = fence.now()
            try:
                position = await self.log.append(
                    subject, event, expected_seq=self.view.last_seq, expected_filter=FEDERATION_FILTER
                )
            except ConcurrencyConflict:
                await self._catch_up()
                continue
            self._fold(
                Recorded(stream=STREAM, seq=position.seq, subject=subject, time_ns=0, msg_id="", event=event)
            )
            self._renewed(sent)
            if (took := fence.now() - sent) > self.lease_s * BEAT_FRACTION:  # the fence's margin shrinks
                log.warning(
                    "%s: an append took %.1fs to be acknowledged (lease %gs)",
                    self.instance,
                    took,
                    self.lease_s,
                )
            return True
        return False

    def _renewed(self, sent: float) -> None:
        """An append sent at ``sent`` was stored against the whole stream: serving goes on."""
        if self.serving_until != float("-inf") and sent > self.serving_until:
            self.lapses += 1
            log.warning(
                "%s renewed its claims %.1fs after they lapsed", self.instance, sent - self.serving_until
            )
        self.serving_until = max(self.serving_until, serving_until(sent, self.lease_s))
        if self.fence_root is not None:
            fence.write_serving_until(self.fence_root, self.serving_until)

    def _fold(self, record: Recorded[Event]) -> None:
        self.view = evolve(self.view, record)
        self._moved.set()

    async def _catch_up(self) -> None:
        """Wait until the view has every event the stream held when this was called."""
        last = await self.log.last_seq(STREAM)
        deadline = time.monotonic() + CATCH_UP_S
        while self.view.last_seq < last:
            self._moved.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResontechError(
                    f"the FEDERATION stream did not reach sequence {last} in {CATCH_UP_S:.0f}s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), remaining)
