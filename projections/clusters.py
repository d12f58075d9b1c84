"""What the kernel tells a Kubernetes cluster's dispatcher about its own nodes (pure): which of them
are enrolled, under which terms, and the kernel's current assignments of them. The intake answers a
dispatcher's question (``kernel.cluster.<dispatcher>``, :func:`core.natsauth.cluster_question`) with
:func:`cluster_facts`: a dispatcher with its own NATS user reads no stream, so this is how it knows,
after a restart, what the kernel still assigns its nodes (:mod:`ops.dispatcher.reconcile`).
"""

from __future__ import annotations

from collections.abc import Collection

from projections.endpoints import EndpointsState
from projections.providers import ProvidersState, cluster_nodes, dispatching
from projections.schedule import TERMINAL, ScheduleState
from schemas.providers import ClusterFacts, HeldAssignment


def current_assignments(
    schedule: ScheduleState, endpoints: EndpointsState, workers: Collection[str]
) -> list[HeldAssignment]:
    """The kernel's current assignments of ``workers``: the shards of live jobs and the replicas of
    endpoints not deleted, as the schedule and endpoint projections hold them."""
    found = [
        HeldAssignment(
            assignment_id=a.assignment_id,
            tenant=job.tenant,
            work_id=job.job_id,
            kind="job",
            worker_id=a.worker_id,
        )
        for job in schedule.jobs.values()
        if job.state not in TERMINAL
        for a in job.assignments.values()
        if a.worker_id in workers
    ]
    found += [
        HeldAssignment(
            assignment_id=r.assignment_id,
            tenant=endpoint.tenant,
            work_id=endpoint.endpoint_id,
            kind="endpoint",
            worker_id=r.worker_id,
        )
        for endpoint in endpoints.endpoints.values()
        if endpoint.state != "deleted"
        for r in endpoint.replicas.values()
        if r.worker_id in workers
    ]
    return found


def cluster_facts(
    providers: ProvidersState, schedule: ScheduleState, endpoints: EndpointsState, sender: str
) -> ClusterFacts:
    """The answer to ``sender``'s question: its cluster's token, enrolled nodes and their current
    assignments; or why there is none (``sender`` is no live cluster's dispatcher)."""
    found = dispatching(providers, sender)
    if found is None:
        return ClusterFacts(
            error=f"{sender} is no enrolled cluster's dispatcher (or its credentials were revoked)"
        )
    provider, cluster = found
    nodes = cluster_nodes(providers, provider, cluster)
    return ClusterFacts(
        token_id=cluster.token_id,
        enrolled=nodes,
        assignments=current_assignments(schedule, endpoints, frozenset(nodes)),
    )
