"""The dispatcher's rounds: applying a work's objects, reading its pods into claims, metering, and
putting the cluster right after a restart (:mod:`ops.dispatcher.service` says when each runs).

The rules a round applies:

* apply: a work's objects are rendered from every assignment of it held, and applied together
  (server-side apply: nothing is created twice); an assignment that cannot be rendered is rejected;
  one the cluster refuses is logged with the reason and tried again after a back-off (1 s, doubling to
  :data:`MAX_BACKOFF_MS`), and fails after ``refused_rounds`` refusals; one the cluster did not answer
  for waits for the next round;
* poll: what waits is applied first; then every work's pods are listed, and every held assignment's
  pod (the newest its controller made) and its new log lines are read, all at once, each read with a
  time-out of its own, and each pod's claims made as soon as its log is in: a log that cannot be read
  is no new lines for that pod (logged once, not asked again for :data:`UNREADABLE_WAIT_MS`), a
  read still running after :data:`READ_WAIT_S` is left to end in a later round (no round waits on a
  kubelet that never answers), and a pod on a node that is not Ready is not asked; an assignment
  whose object exists but whose pod does not yet, and that never started, is left for the next
  round; one that ended is forgotten;
* meter: a usage tick per held assignment whose pod ran, claimed as its node-worker; none before;
* forget: a last tick (if the pod ran) before the final claims, then the assignment is no longer held,
  and its own objects are deleted, applied or not (a refusal may leave part of them): its Job, or its
  Deployment and Service. The namespace goes ``linger_ms`` after its work's last held assignment
  went, unless one of the work comes back first: a shard re-placed at a new epoch, a gang restarted,
  comes back within seconds, and deleting the namespace meanwhile would refuse it for as long as a
  dead node's pod holds the namespace terminating;
* reconcile (after a restart): what the kernel no longer assigns to the cluster's workers is forgotten
  with no claim and its objects deleted; namespaces of no current assignment are deleted; an applied
  assignment whose objects vanished is reported lost and forgotten.

A :class:`Rounds` is built from what it uses (the cluster, the held assignments, the claims appender,
the nodes' addresses, the lock, the clock); the dispatcher wires it. A round holds that lock but while
it reads logs, so a command is never handled in the middle of an apply or of a pod's claims, and never
waits on a kubelet.

One module past 500 lines on purpose: apply, poll, meter, forget and reconcile all act on the same
held assignments under the same lock, and their order within a round is the point; what can stand
alone already does (pod states, log resumption, reporting, rendering).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from agent.reports import Meter
from core import reports
from core.clock import now_ms
from core.errors import NotFound, ResontechError
from core.reports import Append, rejected, start_failed
from ops.dispatcher import names
from ops.dispatcher.cluster import LOG_TAIL_BYTES, ClusterRefused, Json, Namespace
from ops.dispatcher.context import RenderContext
from ops.dispatcher.endpoints import node_port, replica_address, replica_name
from ops.dispatcher.logs import resume_from, split_lines, text_of, unread
from ops.dispatcher.manifests import endpoint_manifests, job_manifests, work_namespace
from ops.dispatcher.names import ManifestError
from ops.dispatcher.pods import Dispatch
from ops.dispatcher.podstate import PodState
from ops.dispatcher.reconcile import Held, reconcile
from ops.dispatcher.reporting import WORKLOAD_CONTAINER, belongs, report
from ops.dispatcher.shards import job_name
from ops.dispatcher.state import HISTORY_LINES, HeldAssignments, Tracked

log = logging.getLogger("resontech.dispatcher")
MAX_LOG_READS = 16
"""Reads of one pod's log per round (64 KiB each): what is left is read in the next round."""
MANAGED = f"app.kubernetes.io/managed-by={names.MANAGED_BY}"
ENDED = ("Succeeded", "Failed")
CONTROLLERS = {"job": ("batch/v1", "Job"), "endpoint": ("apps/v1", "Deployment")}
Work = tuple[str, str, str]
"""``(tenant, work_id, kind)``."""
Read = tuple[Tracked, PodState | None, list[str]]
"""An assignment, its pod and the lines of the pod's log read this round."""
Claim = Callable[[str, list[Append]], Awaitable[bool]]
"""Claims ``(canonical subject, event, id)`` on the intake as a node-worker (retried until stored)."""
REFUSED_ROUNDS = 30
"""Times an apply the cluster refuses is tried before the assignment fails."""
MAX_BACKOFF_MS = 8_000
"""The longest wait between two applies the cluster refused (from 1 s, doubling): 30 refusals take
about 3.5 minutes, the time a namespace may stay terminating while a dead node's pod goes."""
READ_WAIT_S = 1.0
"""How long a round waits for its pods' log reads before it leaves the slow ones running."""
UNREADABLE_WAIT_MS = 30_000
"""How long a pod whose log could not be read is left unasked (its round would wait on the read)."""
LINGER_MS = 60_000
"""How long a namespace outlives its work's last held assignment."""


class ClusterPort(Protocol):
    """What the rounds ask of the cluster (:class:`~ops.dispatcher.cluster.Cluster` says how each
    behaves and what it raises)."""

    async def apply(self, manifests: list[Json]) -> object: ...

    async def delete_namespace(self, name: str) -> bool: ...

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...

    async def namespaces(self, label_selector: str) -> list[Namespace]: ...

    async def objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Json]: ...

    async def pods(self, namespace: str | None, label_selector: str = "") -> list[PodState]: ...

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str = "",
        *,
        since: str = "",
        tail_lines: int = 0,
        timestamps: bool = True,
    ) -> str: ...


class Rounds:
    """The rounds of one dispatcher, built from what they use (module docstring for the rules).

    Args:
        cluster: the cluster's API server.
        ctx: the operator's rendering settings.
        held: the assignments held, shared with the dispatcher's command handling; saved after every
            change.
        claim: appends claims on the intake as a node-worker.
        address_of: a node-worker's node address (``None`` or empty: unknown), read-only.
        ready: whether a node-worker's node is Ready (a NotReady node's kubelet is not asked for logs).
        busy: the dispatcher's lock; every round takes it.
        refused_rounds: refusals of an assignment's objects before it fails [:data:`REFUSED_ROUNDS`].
        linger_ms: how long a namespace outlives its work's last held assignment [:data:`LINGER_MS`].
        clock: the time in Unix milliseconds [:func:`core.clock.now_ms`].
    """

    def __init__(
        self,
        *,
        cluster: ClusterPort,
        ctx: RenderContext,
        held: HeldAssignments,
        claim: Claim,
        address_of: Callable[[str], str | None],
        busy: asyncio.Lock,
        ready: Callable[[str], bool] = lambda worker_id: True,
        refused_rounds: int = REFUSED_ROUNDS,
        linger_ms: int = LINGER_MS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.cluster = cluster
        self.ctx = ctx
        self.held = held
        self.claim = claim
        self.address_of = address_of
        self.ready = ready
        self.busy = busy
        self.refused_rounds = refused_rounds
        self.linger_ms = linger_ms
        self.clock = clock
        self._refusals: dict[str, int] = defaultdict(int)
        self._retry_at: dict[Work, int] = {}
        """When a work the cluster refused is applied again (Unix ms)."""
        self._emptied: dict[Work, int] = {}
        """Works whose last held assignment went, and when (their namespaces linger)."""
        self._unreadable: dict[tuple[str, str], int] = {}
        self._reading: dict[str, asyncio.Task[Read]] = {}
        """assignment id -> its pod's log read still running (at most one each)."""
        """Pods (namespace, name) whose log could not be read, and when to try again (Unix ms)."""

    # -- applying --------------------------------------------------------------------------------

    def _of_work(self, tenant: str, work_id: str, kind: str, *, applied: bool | None = None) -> list[Tracked]:
        """The held assignments of one work (only those applied or not, if ``applied`` says)."""
        return [
            t
            for t in self.held.values()
            if (t.cmd.tenant, t.cmd.work_id, t.cmd.work_kind) == (tenant, work_id, kind)
            and (applied is None or t.applied == applied)
        ]

    async def apply(self, tenant: str, work_id: str, kind: str) -> None:
        """Apply the objects of one work's held assignments; an assignment that cannot be rendered is
        rejected, one the cluster keeps refusing fails (not retryable: the same cluster would refuse
        it again), and one the cluster did not answer for waits for the next round.

        Raises:
            ClusterUnreachable: the cluster did not answer (the assignments stay held, not applied).
        """
        work = (tenant, work_id, kind)
        self._retry_at.pop(work, None)
        try:
            await self._apply_work(tenant, work_id, kind)
        except ManifestError as exc:  # rendering is pure: the same command never renders
            for t in self._of_work(tenant, work_id, kind, applied=False):
                log.error("%s rejected: %s", t.cmd.assignment_id, exc.message)
                await self.forget(t, final=[rejected(t.cmd, t.worker_id, exc.message)])
        except ClusterRefused as exc:  # a terminating namespace refuses for a while: count, then fail
            await self._refused(work, exc)

    async def _refused(self, work: Work, exc: ClusterRefused) -> None:
        """Count one more refusal of the work's unapplied assignments: fail those refused
        ``refused_rounds`` times, and try the rest again after a back-off."""
        most = 0
        for t in self._of_work(*work, applied=False):
            self._refusals[t.cmd.assignment_id] += 1
            count = most = max(most, self._refusals[t.cmd.assignment_id])
            if count >= self.refused_rounds:
                log.error("%s not started: refused %d times: %s", t.cmd.assignment_id, count, exc.message)
                failed = start_failed(t.cmd, f"the cluster refused its objects: {exc.message}")
                await self.forget(t, final=[failed])
            else:
                log.warning(
                    "%s refused (%d of %d): %s", t.cmd.assignment_id, count, self.refused_rounds, exc.message
                )
        if most:
            self._retry_at[work] = self.clock() + min(MAX_BACKOFF_MS, 1000 * 2 ** (most - 1))

    async def _apply_work(self, tenant: str, work_id: str, kind: str) -> None:
        """Render the work's held assignments (the newest epoch of each slot) and apply them.

        Raises:
            ManifestError, ClusterRefused, ClusterUnreachable: as rendering and applying raise them.
        """
        held = self._of_work(tenant, work_id, kind)
        if not held:
            return
        dispatches = [Dispatch(t.cmd, t.node) for t in held]
        if kind == "job":
            manifests = job_manifests(dispatches, self.ctx)
        else:
            keys = {t.cmd.assignment_id: t.api_key for t in held}
            manifests = endpoint_manifests(dispatches, self.ctx, api_keys=keys)
        await self.cluster.apply(manifests)
        for t in held:
            if not t.applied:
                t.applied = True
                self._refusals.pop(t.cmd.assignment_id, None)
                log.info("%s applied on node %s", t.cmd.assignment_id, t.node)
        self.held.save()

    # -- forgetting ------------------------------------------------------------------------------

    async def forget(self, tracked: Tracked, *, final: list[Append], tick: bool = True) -> None:
        """Claim ``final`` (after a last usage tick if the pod ran, and ``tick``), stop holding the
        assignment and delete its own objects, applied or not; its work's namespace lingers if it was
        the work's last (module docstring)."""
        cmd = tracked.cmd
        last = self._tick(tracked, self.clock()) if tick else None
        if last or final:
            await self.claim(tracked.worker_id, ([last] if last else []) + final)
        self.held.pop(cmd.assignment_id, None)
        self._refusals.pop(cmd.assignment_id, None)
        self.held.save()
        work = _work(tracked)
        if not self._of_work(*work):
            self._emptied.setdefault(work, self.clock())
        ns = work_namespace(*work, self.ctx)
        api_version, kind = CONTROLLERS[cmd.work_kind]
        name = job_name(cmd.epoch, cmd.slot) if cmd.work_kind == "job" else replica_name(cmd)
        await self.cluster.delete(api_version, kind, ns, name)
        if cmd.work_kind == "endpoint":
            await self.cluster.delete("v1", "Service", ns, name)

    async def _sweep(self) -> None:
        """Delete the namespaces that lingered long enough with no held assignment of their work."""
        now = self.clock()
        for work, since in list(self._emptied.items()):
            if self._of_work(*work):
                del self._emptied[work]
            elif now - since >= self.linger_ms:
                ns = work_namespace(*work, self.ctx)
                await self.cluster.delete_namespace(ns)
                del self._emptied[work]
                log.info("namespace %s deleted: %s holds nothing here any more", ns, work[1])

    # -- polling ---------------------------------------------------------------------------------

    async def poll(self) -> None:
        """One round: apply what waits (unless backing off), delete lingering namespaces and list every
        held work's pods, under the dispatcher's lock; then read the pods' logs without it (a read may
        take its whole time-out, and commands must not wait on it), and take the lock again for each
        pod's claims, as soon as its log is in, skipping an assignment a command let go meanwhile. The
        round waits :data:`READ_WAIT_S` at most: a read still running (a kubelet that accepts and never
        answers) goes on, no second read of that pod starts, and the round in which it ends handles
        its pod, so it delays that pod alone, never the next round of every other pod."""
        async with self.busy:
            now = self.clock()
            for work in {_work(t) for t in self.held.values() if not t.applied}:
                if self._retry_at.get(work, 0) <= now:
                    await self.apply(*work)
            await self._sweep()
            by_work: dict[Work, list[Tracked]] = defaultdict(list)
            for t in self.held.values():
                if t.applied:
                    by_work[_work(t)].append(t)
            listed = await asyncio.gather(*(self._list_work(work, held) for work, held in by_work.items()))
        for found in listed:
            for tracked, pod in found:
                if tracked.cmd.assignment_id not in self._reading:
                    self._reading[tracked.cmd.assignment_id] = asyncio.create_task(
                        self._read_log(tracked, pod)
                    )
        pending = set(self._reading.values())
        deadline = asyncio.get_running_loop().time() + READ_WAIT_S
        while pending:
            wait = max(0.0, deadline - asyncio.get_running_loop().time())
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return  # the rest end in a later round: a read that hangs holds up no other pod
            for read in done:
                self._reading = {a: r for a, r in self._reading.items() if r is not read}
                tracked, pod, new = read.result()
                async with self.busy:
                    if self.held.get(tracked.cmd.assignment_id) is tracked:
                        await self._poll_one(tracked, pod, new)

    async def close(self) -> None:
        """Cancel the log reads still running (the dispatcher stops)."""
        reads, self._reading = list(self._reading.values()), {}
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)

    async def _list_work(self, work: Work, held: list[Tracked]) -> list[tuple[Tracked, PodState | None]]:
        """Each held assignment of the work with its pod (``None``: none), leaving out those whose
        controller has not made the pod yet."""
        ns = work_namespace(*work, self.ctx)
        api_version, kind = CONTROLLERS[work[2]]
        pods, controllers = await asyncio.gather(
            self.cluster.pods(ns, MANAGED), self.cluster.objects(api_version, kind, ns, MANAGED)
        )
        present = _assignment_ids(controllers)
        if work[2] == "endpoint" and any(not t.address for t in held):
            await self._addresses(ns, held)
        found = []
        for tracked in held:
            pod = _pod_of(tracked, pods, self.ctx)
            if pod is None and tracked.cmd.assignment_id in present and not tracked.said.started:
                continue  # its controller has not made the pod yet
            found.append((tracked, pod))
        return found

    async def _read_log(self, tracked: Tracked, pod: PodState | None) -> Read:
        """The assignment, its pod and the lines of the pod's log not read yet, or none: no pod, nothing
        to read yet, a node that is not Ready, or a log that could not be read (a dead node's kubelet:
        logged once, and not asked again for :data:`UNREADABLE_WAIT_MS`)."""
        if pod is None or not _has_log(tracked.cmd.work_kind, pod) or not self.ready(tracked.worker_id):
            return tracked, pod, []
        key, now = (pod.namespace, pod.name), self.clock()
        if self._unreadable.get(key, 0) > now:
            return tracked, pod, []
        try:
            new = await self._new_lines(tracked, pod)
        except NotFound:
            return tracked, pod, []
        except ResontechError as exc:
            if key not in self._unreadable:
                log.warning("log of pod %s/%s not read: %s", pod.namespace, pod.name, exc.message)
            self._unreadable[key] = self.clock() + UNREADABLE_WAIT_MS
            return tracked, pod, []
        self._unreadable.pop(key, None)
        return tracked, pod, new

    async def _new_lines(self, tracked: Tracked, pod: PodState) -> list[str]:
        """Read the log forward from the second of the last line read (:func:`~ops.dispatcher.logs.
        resume_from`), :data:`~ops.dispatcher.cluster.LOG_TAIL_BYTES` at a time, up to
        :data:`MAX_LOG_READS` reads a round: no line is skipped, however fast the pod writes. Only
        when more than a read's worth is stamped within one second is the rest of that second
        skipped for the log's tail, as many lines as half a read holds at the lines' length (the
        API server cuts a tail at the read's limit from its start): logged."""
        container = WORKLOAD_CONTAINER[tracked.cmd.work_kind]
        ended = pod.phase in ENDED
        known, new = list(tracked.history), []
        for _ in range(MAX_LOG_READS):
            since = resume_from(known)
            text = await self.cluster.pod_log(pod.namespace, pod.name, container, since=since)
            whole = len(text.encode()) < LOG_TAIL_BYTES  # the read reached the end of the log
            lines = unread(known, split_lines(text, final=ended and whole))
            new += lines
            known = [*known, *lines][-HISTORY_LINES:]
            if whole:
                break
            if since and resume_from(known) == since:  # a read's worth within one second: jump
                log.warning("log of pod %s/%s: lines of %s skipped", pod.namespace, pod.name, since)
                tail = max(1, LOG_TAIL_BYTES // 2 * max(1, text.count("\n")) // len(text.encode()))
                text = await self.cluster.pod_log(pod.namespace, pod.name, container, tail_lines=tail)
                return [*new, *unread(known, split_lines(text, final=ended))]
        return new

    async def _addresses(self, ns: str, held: list[Tracked]) -> None:
        """Where each replica serves: its node's address and the node port of its Service."""
        services = {
            (s.get("metadata") or {}).get("name"): s
            for s in await self.cluster.objects("v1", "Service", ns, MANAGED)
        }
        for t in held:
            address = self.address_of(t.worker_id)
            port = node_port(services.get(replica_name(t.cmd)) or {})
            if not t.address and address and port is not None:
                t.address = replica_address(address, port)

    async def _poll_one(self, tracked: Tracked, pod: PodState | None, new: list[str]) -> None:
        cmd = tracked.cmd
        lines = [text_of(line) for line in [*tracked.history, *new]]
        done = replace(tracked.said, lines=len(tracked.history))
        claims, done = report(
            cmd,
            pod,
            lines,
            done,
            worker_id=tracked.worker_id,
            ctx=self.ctx,
            api_key=tracked.api_key,
            address=tracked.address,
        )
        if pod is not None and pod.phase != "Pending" and not tracked.metered_ms:
            tracked.metered_ms = self.clock()  # metered from when the dispatcher saw it run
        tracked.said = done
        tracked.history = [*tracked.history, *new][-HISTORY_LINES:]
        if done.ended:
            await self.forget(tracked, final=claims)
            return
        if claims:
            await self.claim(tracked.worker_id, claims)
        self.held.save()

    # -- metering --------------------------------------------------------------------------------

    async def meter(self) -> None:
        """A usage tick for every held assignment whose pod runs, per node-worker."""
        async with self.busy:
            now = self.clock()
            by_worker: dict[str, list[Append]] = defaultdict(list)
            for t in self.held.values():
                tick = self._tick(t, now)
                if tick is not None:
                    by_worker[t.worker_id].append(tick)
            for worker_id, ticks in by_worker.items():
                await self.claim(worker_id, ticks)
            if by_worker:
                self.held.save()

    @staticmethod
    def _tick(tracked: Tracked, now: int) -> Append | None:
        """The tick from the last one to ``now`` (none before the pod ran)."""
        if not tracked.metered_ms:
            return None
        meter = Meter(tracked.cmd, worker_id=tracked.worker_id, start_ms=tracked.metered_ms)
        meter.count = tracked.ticks
        tick = meter.tick(now)
        tracked.metered_ms, tracked.ticks = meter.last_ms, meter.count
        return tick

    # -- after a restart -------------------------------------------------------------------------

    async def reconcile(self, current: Sequence[Held]) -> None:
        """Put the cluster right against ``current``, the kernel's current assignments of the
        cluster's workers (module docstring)."""
        current_ids = {h.assignment_id for h in current}
        for tracked in [t for a, t in self.held.items() if a not in current_ids]:
            log.info("%s is no longer the kernel's: deleted, nothing claimed", tracked.cmd.assignment_id)
            await self.forget(tracked, final=[], tick=False)
        cluster, ctx = self.cluster, self.ctx
        namespaces = await cluster.namespaces(MANAGED)
        present: set[str] = set()
        for api_version, kind in CONTROLLERS.values():
            present |= _assignment_ids(await cluster.objects(api_version, kind, None, MANAGED))
        applied = {a for a, t in self.held.items() if t.applied}
        verdict = reconcile(
            namespaces, current, applied, present, lambda t, w, k: work_namespace(t, w, k, ctx)
        )
        for ns in verdict.delete:
            log.info("namespace %s deleted: its work is over", ns)
            await cluster.delete_namespace(ns)
        for h in verdict.lost:
            tracked = self.held[h.assignment_id]
            lost = reports.lost(
                tracked.cmd,
                "its objects vanished from the cluster",
                reports.tail_of([text_of(line) for line in tracked.history]),
            )
            await self.forget(tracked, final=[lost])
        self._emptied = {
            w: t for w, t in self._emptied.items() if work_namespace(*w, ctx) not in verdict.delete
        }


def _work(t: Tracked) -> Work:
    return t.cmd.tenant, t.cmd.work_id, t.cmd.work_kind


def _assignment_ids(objects: Iterable[Json]) -> set[str]:
    found = set()
    for o in objects:
        annotations = (o.get("metadata") or {}).get("annotations") or {}
        if isinstance(annotations, dict) and isinstance(annotations.get(names.ASSIGNMENT_ID), str):
            found.add(annotations[names.ASSIGNMENT_ID])
    return found


def _pod_of(tracked: Tracked, pods: list[PodState], ctx: RenderContext) -> PodState | None:
    """The assignment's pod (the newest, if its controller made several)."""
    mine = [p for p in pods if belongs(tracked.cmd, p, ctx)]
    return sorted(mine, key=lambda p: p.started_at)[-1] if mine else None


def _has_log(kind: str, pod: PodState) -> bool:
    """Whether the pod's log is read now: a shard's once it runs (its protocol lines), a replica's
    only once it ended (its tail; an engine's lines are never protocol)."""
    if kind == "job":
        return pod.phase != "Pending"
    return pod.phase in ("Succeeded", "Failed") or any(
        c.restarts or c.state == "terminated" for c in pod.containers
    )
