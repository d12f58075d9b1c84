"""The dispatcher's reconciliation after a restart: what it deletes, what it reports lost, and what it
leaves alone (pure; the cluster conversation is in tests/ops/dispatcher/test_cluster.py)."""

from __future__ import annotations

from functools import partial

from ops.dispatcher import names
from ops.dispatcher.cluster import Namespace
from ops.dispatcher.context import RenderContext
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.reconcile import Held, owned_work, reconcile

CTX = RenderContext()
NAMESPACE_OF = partial(work_namespace, ctx=CTX)


def made(tenant: str, work_id: str, kind: str, *, terminating: bool = False) -> Namespace:
    """A namespace as the dispatcher makes it (labels and the exact ids in annotations)."""
    return Namespace(
        name=work_namespace(tenant, work_id, kind, CTX),
        labels=names.work_labels(tenant, work_id, kind, 1),
        annotations=names.work_annotations(tenant, work_id),
        terminating=terminating,
    )


def test_a_namespace_whose_work_is_over_is_deleted_and_a_live_one_kept() -> None:
    done, live, serving = (
        made("acme", "j-done", "job"),
        made("acme", "j-live", "job"),
        made("acme", "ep-1", "endpoint"),
    )
    held = [Held("j-live-s0-e1", "acme", "j-live", "job"), Held("ep-1-s0-e1", "acme", "ep-1", "endpoint")]
    plan = reconcile([done, live, serving], held, applied=set(), present=set(), namespace_of=NAMESPACE_OF)
    assert plan.delete == (done.name,) and plan.lost == () and plan.foreign == ()


def test_an_applied_assignment_whose_objects_vanished_is_lost_and_one_not_yet_applied_is_not() -> None:
    ns = made("acme", "j-1", "job")
    gone, fresh, fine = (Held(f"j-1-s{i}-e1", "acme", "j-1", "job") for i in range(3))
    plan = reconcile(
        [ns],
        [gone, fresh, fine],
        applied={gone.assignment_id, fine.assignment_id},
        present={fine.assignment_id},
        namespace_of=NAMESPACE_OF,
    )
    assert plan.lost == (gone,) and plan.delete == ()


def test_a_namespace_already_terminating_is_not_deleted_again() -> None:
    plan = reconcile([made("acme", "j-old", "job", terminating=True)], [], set(), set(), NAMESPACE_OF)
    assert plan.delete == ()


def test_a_label_alone_never_gets_a_namespace_of_the_clusters_owner_deleted() -> None:
    labels = names.work_labels("acme", "j-1", "job", 1)
    forged = [
        Namespace("kube-system", labels, names.work_annotations("acme", "j-1"), False),  # name is not ours
        Namespace("payments", labels, {}, False),  # no ids
        Namespace(
            work_namespace("acme", "j-1", "job", CTX), labels, names.work_annotations("acme", "j-2"), False
        ),
        Namespace(
            work_namespace("acme", "j-1", "job", CTX),
            {**labels, names.WORK_KIND: "cluster"},
            names.work_annotations("acme", "j-1"),
            False,
        ),
        Namespace("rt-x", {"app.kubernetes.io/managed-by": "someone-else"}, {}, False),
    ]
    plan = reconcile(forged, [], set(), set(), NAMESPACE_OF)
    assert plan.delete == () and len(plan.foreign) == len(forged)
    assert all(owned_work(ns, NAMESPACE_OF) is None for ns in forged)
    assert owned_work(made("acme", "j-1", "job"), NAMESPACE_OF) == ("acme", "j-1", "job")
