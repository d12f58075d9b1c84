"""The Kubernetes objects of one job or one endpoint, from the kernel's own work commands.

Pure functions from :class:`~schemas.commands.StartWork` (the same ``start_work`` an agent receives,
with the node of the worker it was placed on: :class:`~ops.dispatcher.pods.Dispatch`) to plain dicts,
ready for the ``kubernetes`` client or ``kubectl apply``: no I/O, no client calls, the same output for
the same input (the dispatcher applies them again after a restart, and ``resontech dispatcher render``
prints them).

Every job and every endpoint gets a namespace of its own (:func:`work_namespace`), labelled with its
tenant, work id, kind and epoch and ``app.kubernetes.io/managed-by: resontech-dispatcher``, and in it:

* a ResourceQuota and a LimitRange of exactly what was placed (:mod:`ops.dispatcher.policies`);
* default-deny NetworkPolicies and the few allow rules the work needs (same module);
* a job: a Job of one pod per shard (its assignment), pinned to its worker's node, torchrun's headless
  Service, a federated job's FL server Pod and Service (:mod:`ops.dispatcher.shards`);
* an endpoint: per replica a Deployment of one pod, a Service and its key (:mod:`ops.dispatcher.endpoints`,
  which says why per replica, and why the kernel's autoscaler rather than an HPA);
* the presigned URLs of the inputs in a Secret that only the fetcher init container mounts; no
  object-store credential, no service account token (:mod:`ops.dispatcher.pods`).

Deleting the namespace tears all of it down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ops.dispatcher import names
from ops.dispatcher.context import RenderContext
from ops.dispatcher.endpoints import hub_model, replica_objects
from ops.dispatcher.names import ManifestError
from ops.dispatcher.pods import Dispatch
from ops.dispatcher.policies import PodSize, limit_range, namespace, network_policies, resource_quota
from ops.dispatcher.shards import FL_SERVER, FlServer, fl_server_host, fl_server_objects, shard_jobs

Manifest = dict[str, Any]

__all__ = [
    "Dispatch",
    "FlServer",
    "ManifestError",
    "RenderContext",
    "endpoint_manifests",
    "fl_server_host",
    "job_manifests",
    "work_namespace",
]


def work_namespace(tenant: str, work_id: str, kind: str, ctx: RenderContext) -> str:
    """The namespace of a job (``kind`` ``job``) or an endpoint (``endpoint``)."""
    return names.namespace_name(ctx.namespace_prefix, tenant, work_id, kind)


def _one_work(dispatches: Sequence[Dispatch], kind: str) -> tuple[str, str, int]:
    """The tenant, work id and newest epoch the commands share.

    Raises:
        ManifestError: no command, or commands of different work or of another kind.
    """
    if not dispatches:
        raise ManifestError(f"no {kind} assignment to render")
    first = dispatches[0].command
    for d in dispatches:
        c = d.command
        if (c.tenant, c.work_id, c.work_kind) != (first.tenant, first.work_id, kind):
            raise ManifestError(f"assignment {c.assignment_id!r} is not of {kind} {first.work_id!r}")
    slots = [d.command.slot for d in dispatches]
    if len(set(slots)) != len(slots):
        raise ManifestError("two assignments of one slot: render the current one of each")
    return first.tenant, first.work_id, max(d.command.epoch for d in dispatches)


def _frame(
    tenant: str, work_id: str, kind: str, epoch: int, ctx: RenderContext
) -> tuple[str, dict[str, str], Manifest]:
    ns = work_namespace(tenant, work_id, kind, ctx)
    labels = names.work_labels(tenant, work_id, kind, epoch)
    return ns, labels, namespace(ns, labels, names.work_annotations(tenant, work_id))


def _services(objects: Sequence[Manifest]) -> int:
    return sum(1 for o in objects if o["kind"] == "Service")


def job_manifests(
    shards: Sequence[Dispatch], ctx: RenderContext, *, fl_server: FlServer | None = None
) -> list[Manifest]:
    """Every object of one job: its namespace and fences, its shards' current assignments (one or
    more epochs) and, for a federated job, ``fl_server``.

    Raises:
        ManifestError: the commands cannot be rendered (the message says which and why).
    """
    tenant, work_id, epoch = _one_work(shards, "job")
    ns, labels, ns_object = _frame(tenant, work_id, "job", epoch, ctx)
    objects, sizes = shard_jobs(shards, ns, labels, ctx)
    server_labels = None
    if fl_server is not None:
        server, size = fl_server_objects(fl_server, ns, labels, ctx)
        objects, sizes, server_labels = [*objects, *server], [*sizes, size], {names.ROLE: FL_SERVER}
    fences = _fences(ns, labels, sizes, _services(objects), ctx)
    policies = network_policies(
        ns,
        labels,
        ctx,
        same_namespace=True,
        fl_server=server_labels,
        kernel_fl_port=None if fl_server is not None else _kernel_fl_port(shards),
    )
    return [ns_object, *fences, *policies, *objects]


def _kernel_fl_port(shards: Sequence[Dispatch]) -> int | None:
    """The port of the FL server a federated job's clients dial (``host:port`` in their commands)."""
    for d in shards:
        server = (
            d.command.spec.options.get("server", "") if d.command.spec.runtime == "nvflare-client" else ""
        )
        port = server.rpartition(":")[2]
        if port.isdigit() and 0 < int(port) < 65536:
            return int(port)
    return None


def endpoint_manifests(
    replicas: Sequence[Dispatch], ctx: RenderContext, *, api_keys: Mapping[str, str]
) -> list[Manifest]:
    """Every object of one endpoint: its namespace and fences and its current replicas, each with the
    key of ``api_keys[assignment_id]`` (the dispatcher makes one per replica, as an agent does, and
    reports it in ``replica_ready``).

    Raises:
        ManifestError: the commands cannot be rendered, or a replica has no key.
    """
    tenant, work_id, epoch = _one_work(replicas, "endpoint")
    ns, labels, ns_object = _frame(tenant, work_id, "endpoint", epoch, ctx)
    objects: list[Manifest] = []
    sizes: list[PodSize] = []
    for replica in sorted(replicas, key=lambda d: d.command.slot):
        key = api_keys.get(replica.command.assignment_id, "")
        if len(key) < 16:
            raise ManifestError(f"replica {replica.command.assignment_id!r} has no key of 16+ characters")
        made, size = replica_objects(replica, ns, labels, ctx, key)
        objects, sizes = [*objects, *made], [*sizes, size]
    fences = _fences(ns, labels, sizes, _services(objects), ctx, node_ports=len(replicas))
    hub = hub_model({d.command.assignment_id: d.command for d in replicas})
    policies = network_policies(ns, labels, ctx, same_namespace=False, gateway_ingress=True, hub_egress=hub)
    return [ns_object, *fences, *policies, *objects]


def _fences(
    ns: str,
    labels: dict[str, str],
    sizes: Sequence[PodSize],
    services: int,
    ctx: RenderContext,
    *,
    node_ports: int = 0,
) -> list[Manifest]:
    quota = resource_quota(ns, labels, sizes, services, ctx, node_ports=node_ports)
    return [quota, limit_range(ns, labels, sizes, ctx)]
