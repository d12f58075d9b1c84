"""What a dispatcher puts right when it starts: its namespaces against the kernel's current
assignments. Pure: the caller lists the namespaces and the objects, and asks the kernel for the
assignments (:func:`projections.clusters.cluster_facts`).

* A namespace whose work is over (no current assignment of the dispatcher's workers holds it) is
  deleted: nothing is left running, unwatched and unmetered, after a restart. So is every verification
  namespace (:mod:`ops.dispatcher.verification`): the kernel challenges again a worker whose answer
  never came.
* A current assignment the dispatcher had applied, whose objects are gone from the cluster (deleted by
  hand, lost with a node), is reported lost: the kernel places it again, as for a lost agent's work.

It deletes only what it could have made: a namespace counts as the dispatcher's when it carries the
``managed-by`` label *and* its name is the one :func:`~ops.dispatcher.manifests.work_namespace` gives
for the exact ids in its annotations. The cluster may belong to a tenant or a provider, who can label
anything; a label alone never gets one of their namespaces deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ops.dispatcher import names
from ops.dispatcher.cluster import Namespace


@dataclass(frozen=True, slots=True)
class Held:
    """A current assignment of one of the dispatcher's workers.

    Attributes:
        kind: ``job`` or ``endpoint``.
    """

    assignment_id: str
    tenant: str
    work_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What to do: namespaces to delete, assignments to report lost, and namespaces not ours."""

    delete: tuple[str, ...]
    lost: tuple[Held, ...]
    foreign: tuple[str, ...]


NamespaceOf = Callable[[str, str, str], str]
"""``(tenant, work_id, kind) -> namespace``: :func:`~ops.dispatcher.manifests.work_namespace` with the
dispatcher's render context."""


def owned_work(ns: Namespace, namespace_of: NamespaceOf) -> tuple[str, str, str] | None:
    """``(tenant, work_id, kind)`` of a namespace the dispatcher made, else ``None``."""
    if ns.labels.get("app.kubernetes.io/managed-by") != names.MANAGED_BY:
        return None
    tenant = ns.annotations.get(names.TENANT_ID, "")
    work_id = ns.annotations.get(names.WORK_ID, "")
    kind = ns.labels.get(names.WORK_KIND, "")
    if not tenant or not work_id or kind not in ("job", "endpoint", "verify"):
        return None
    try:
        expected = namespace_of(tenant, work_id, kind)
    except names.ManifestError:
        return None
    return (tenant, work_id, kind) if expected == ns.name else None


def reconcile(
    namespaces: Sequence[Namespace],
    held: Sequence[Held],
    applied: Collection[str],
    present: Collection[str],
    namespace_of: NamespaceOf,
) -> Reconciliation:
    """Compare the cluster with the kernel (see the module docstring).

    Args:
        namespaces: the namespaces listed with the ``managed-by`` label.
        held: the current assignments of the dispatcher's workers.
        applied: the assignment ids whose objects the dispatcher applied (its own record).
        present: the assignment ids whose objects the cluster still holds.
        namespace_of: how the dispatcher names a work's namespace.
    """
    live = {(h.tenant, h.work_id, h.kind) for h in held}
    delete, foreign = [], []
    for ns in namespaces:
        work = owned_work(ns, namespace_of)
        if work is None:
            foreign.append(ns.name)
        elif work not in live and not ns.terminating:
            delete.append(ns.name)
    lost = tuple(h for h in held if h.assignment_id in applied and h.assignment_id not in present)
    return Reconciliation(tuple(sorted(delete)), lost, tuple(sorted(foreign)))
