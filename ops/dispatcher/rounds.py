"""The dispatcher's rounds: applying a work's objects, reading its pods into claims, metering, and
putting the cluster right after a restart (:mod:`ops.dispatcher.service` says when each runs).

Every round runs under the dispatcher's lock, so a command is never handled in the middle of one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from agent.reports import Meter
from core import reports
from core.clock import now_ms
from core.errors import NotFound
from core.reports import Append
from ops.dispatcher import names
from ops.dispatcher.cluster import Json
from ops.dispatcher.endpoints import node_port, replica_address, replica_name
from ops.dispatcher.logs import split_lines, text_of, unread
from ops.dispatcher.manifests import endpoint_manifests, job_manifests, work_namespace
from ops.dispatcher.pods import Dispatch
from ops.dispatcher.podstate import PodState
from ops.dispatcher.reconcile import Held, reconcile
from ops.dispatcher.reporting import WORKLOAD_CONTAINER, belongs, report
from ops.dispatcher.shards import job_name
from ops.dispatcher.state import HISTORY_LINES, Tracked

if TYPE_CHECKING:
    from ops.dispatcher.service import Dispatcher

log = logging.getLogger("resontech.dispatcher")
LOG_LINES = 1000
"""Lines of a pod's log read per round (at most 64 KiB of them)."""
MANAGED = f"app.kubernetes.io/managed-by={names.MANAGED_BY}"
CONTROLLERS = {"job": ("batch/v1", "Job"), "endpoint": ("apps/v1", "Deployment")}
Work = tuple[str, str, str]
"""``(tenant, work_id, kind)``."""


class Rounds:
    """The rounds of one :class:`~ops.dispatcher.service.Dispatcher` (it holds the state)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher
        self._refusals: dict[str, int] = defaultdict(int)

    # -- applying --------------------------------------------------------------------------------

    def of_work(self, tenant: str, work_id: str, kind: str, *, applied: bool | None = None) -> list[Tracked]:
        """The held assignments of one work (only those applied or not, if ``applied`` says)."""
        return [
            t
            for t in self.d.held.values()
            if (t.cmd.tenant, t.cmd.work_id, t.cmd.work_kind) == (tenant, work_id, kind)
            and (applied is None or t.applied == applied)
        ]

    def refused(self, tracked: Tracked) -> int:
        """Count one more refused apply of ``tracked``; how many so far."""
        self._refusals[tracked.cmd.assignment_id] += 1
        return self._refusals[tracked.cmd.assignment_id]

    async def apply_work(self, tenant: str, work_id: str, kind: str) -> None:
        """Render the work's held assignments (the newest epoch of each slot) and apply them.

        Raises:
            ManifestError, ClusterRefused, ClusterUnreachable: as rendering and applying raise them.
        """
        held = self.of_work(tenant, work_id, kind)
        if not held:
            return
        dispatches = [Dispatch(t.cmd, t.node) for t in held]
        if kind == "job":
            manifests = job_manifests(dispatches, self.d.ctx)
        else:
            keys = {t.cmd.assignment_id: t.api_key for t in held}
            manifests = endpoint_manifests(dispatches, self.d.ctx, api_keys=keys)
        await self.d.cluster.apply(manifests)
        for t in held:
            if not t.applied:
                t.applied = True
                self._refusals.pop(t.cmd.assignment_id, None)
                log.info("%s applied on node %s", t.cmd.assignment_id, t.node)
        self.d.save()

    # -- forgetting ------------------------------------------------------------------------------

    async def forget(self, tracked: Tracked, *, final: list[Append]) -> None:
        """Claim ``final`` (after a last usage tick if the pod ran), stop holding the assignment and
        delete its objects: the namespace with the work's last assignment, else its Job or
        Deployment."""
        cmd = tracked.cmd
        tick = self._tick(tracked, now_ms())
        await self.d.emit(tracked.worker_id, ([tick] if tick else []) + final)
        self.d.held.pop(cmd.assignment_id, None)
        self._refusals.pop(cmd.assignment_id, None)
        self.d.save()
        if not tracked.applied:
            return
        ns = work_namespace(cmd.tenant, cmd.work_id, cmd.work_kind, self.d.ctx)
        if not self.of_work(cmd.tenant, cmd.work_id, cmd.work_kind):
            await self.d.cluster.delete_namespace(ns)
            log.info("namespace %s deleted: %s holds nothing here any more", ns, cmd.work_id)
            return
        api_version, kind = CONTROLLERS[cmd.work_kind]
        name = job_name(cmd.epoch, cmd.slot) if cmd.work_kind == "job" else replica_name(cmd)
        await self.d.cluster.delete(api_version, kind, ns, name)
        if cmd.work_kind == "endpoint":
            await self.d.cluster.delete("v1", "Service", ns, name)

    # -- polling ---------------------------------------------------------------------------------

    async def poll(self) -> None:
        """One round: apply what waits, then read every held work's pods into claims."""
        async with self.d.busy:
            for work in {_work(t) for t in self.d.held.values() if not t.applied}:
                await self.d.apply(*work)
            by_work: dict[Work, list[Tracked]] = defaultdict(list)
            for t in self.d.held.values():
                if t.applied:
                    by_work[_work(t)].append(t)
            for work, held in by_work.items():
                await self._poll_work(work, held)

    async def _poll_work(self, work: Work, held: list[Tracked]) -> None:
        ns = work_namespace(*work, self.d.ctx)
        pods = await self.d.cluster.pods(ns, MANAGED)
        api_version, kind = CONTROLLERS[work[2]]
        present = _assignment_ids(await self.d.cluster.objects(api_version, kind, ns, MANAGED))
        if work[2] == "endpoint" and any(not t.address for t in held):
            await self._addresses(ns, held)
        for tracked in held:
            pod = _pod_of(tracked, pods, self.d)
            if pod is None and tracked.cmd.assignment_id in present and not tracked.said.started:
                continue  # its controller has not made the pod yet
            await self._poll_one(tracked, pod)

    async def _addresses(self, ns: str, held: list[Tracked]) -> None:
        """Where each replica serves: its node's address and the node port of its Service."""
        services = {
            (s.get("metadata") or {}).get("name"): s
            for s in await self.d.cluster.objects("v1", "Service", ns, MANAGED)
        }
        for t in held:
            node = self.d.fleet.nodes.get(t.worker_id)
            port = node_port(services.get(replica_name(t.cmd)) or {})
            if not t.address and node is not None and node.address and port is not None:
                t.address = replica_address(node.address, port)

    async def _poll_one(self, tracked: Tracked, pod: PodState | None) -> None:
        cmd = tracked.cmd
        new: list[str] = []
        if pod is not None and _has_log(cmd.work_kind, pod):
            try:
                text = await self.d.cluster.pod_log_tail(
                    pod.namespace, pod.name, LOG_LINES, WORKLOAD_CONTAINER[cmd.work_kind], timestamps=True
                )
            except NotFound:
                text = ""
            new = unread(tracked.history, split_lines(text, final=pod.phase in ("Succeeded", "Failed")))
        lines = [text_of(line) for line in [*tracked.history, *new]]
        done = replace(tracked.said, lines=len(tracked.history))
        claims, done = report(
            cmd, pod, lines, done, worker_id=tracked.worker_id, ctx=self.d.ctx, api_key=tracked.api_key,
            address=tracked.address,
        )  # fmt: skip
        if pod is not None and pod.phase != "Pending" and not tracked.metered_ms:
            tracked.metered_ms = now_ms()  # metered from when the dispatcher saw it run
        tracked.said = done
        tracked.history = [*tracked.history, *new][-HISTORY_LINES:]
        if done.ended:
            await self.forget(tracked, final=claims)
            return
        if claims:
            await self.d.emit(tracked.worker_id, claims)
        self.d.save()

    # -- metering --------------------------------------------------------------------------------

    async def meter(self) -> None:
        """A usage tick for every held assignment whose pod runs, per node-worker."""
        async with self.d.busy:
            now = now_ms()
            by_worker: dict[str, list[Append]] = defaultdict(list)
            for t in self.d.held.values():
                tick = self._tick(t, now)
                if tick is not None:
                    by_worker[t.worker_id].append(tick)
            for worker_id, ticks in by_worker.items():
                await self.d.emit(worker_id, ticks)
            if by_worker:
                self.d.save()

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

    async def reconcile(self) -> None:
        """Delete the namespaces of work no longer held; report lost what was applied and vanished."""
        cluster, ctx = self.d.cluster, self.d.ctx
        namespaces = await cluster.namespaces(MANAGED)
        present: set[str] = set()
        for api_version, kind in CONTROLLERS.values():
            present |= _assignment_ids(await cluster.objects(api_version, kind, None, MANAGED))
        held = [Held(a, t.cmd.tenant, t.cmd.work_id, t.cmd.work_kind) for a, t in self.d.held.items()]
        applied = {a for a, t in self.d.held.items() if t.applied}
        verdict = reconcile(namespaces, held, applied, present, lambda t, w, k: work_namespace(t, w, k, ctx))
        for ns in verdict.delete:
            log.info("namespace %s deleted: its work is over", ns)
            await cluster.delete_namespace(ns)
        for h in verdict.lost:
            tracked = self.d.held[h.assignment_id]
            tracked.applied = False  # nothing of it is left to delete
            lost = reports.lost(tracked.cmd, "its objects vanished from the cluster", reports.tail_of(
                [text_of(line) for line in tracked.history]))  # fmt: skip
            await self.forget(tracked, final=[lost])


def _work(t: Tracked) -> Work:
    return t.cmd.tenant, t.cmd.work_id, t.cmd.work_kind


def _assignment_ids(objects: Iterable[Json]) -> set[str]:
    found = set()
    for o in objects:
        annotations = (o.get("metadata") or {}).get("annotations") or {}
        if isinstance(annotations, dict) and isinstance(annotations.get(names.ASSIGNMENT_ID), str):
            found.add(annotations[names.ASSIGNMENT_ID])
    return found


def _pod_of(tracked: Tracked, pods: list[PodState], dispatcher: Dispatcher) -> PodState | None:
    """The assignment's pod (the newest, if its controller made several)."""
    mine = [p for p in pods if belongs(tracked.cmd, p, dispatcher.ctx)]
    return sorted(mine, key=lambda p: p.started_at)[-1] if mine else None


def _has_log(kind: str, pod: PodState) -> bool:
    """Whether the pod's log is read now: a shard's once it runs (its protocol lines), a replica's
    only once it ended (its tail; an engine's lines are never protocol)."""
    if kind == "job":
        return pod.phase != "Pending"
    return pod.phase in ("Succeeded", "Failed") or any(
        c.restarts or c.state == "terminated" for c in pod.containers
    )
