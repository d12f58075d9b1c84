"""Pure parts of the dispatcher service: node-worker ids, reading a pod's log a tail at a time, and the
node list as the kernel's workers (``ops.dispatcher.fleet``, ``ops.dispatcher.logs``)."""

from __future__ import annotations

from typing import Any

from core.placement.rules import in_maintenance
from core.streams import token
from ops.dispatcher.fleet import CORDONED, Fleet, Identity, worker_id_for
from schemas.workers import WorkerPolicy


def node(name: str, *, ready: str = "True", ip: str = "10.0.0.1", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi"},
            "addresses": [{"type": "InternalIP", "address": ip}],
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def test_worker_ids_are_stable_subject_tokens_and_two_nodes_never_share_one() -> None:
    assert worker_id_for("kc", "gpu-a") == "kernel-kc-gpu-a"  # the kernel's namespace: no provider's
    dotted, dashed = worker_id_for("kc", "gpu.a"), worker_id_for("kc", "gpu-a")
    assert dotted != dashed and token(dotted) == dotted  # a dot is not a token character
    long = worker_id_for("kc", "n" * 253)
    assert len(long) <= 64 and token(long) == long and long != worker_id_for("kc", "n" * 252)
    assert worker_id_for("kc", "gpu.a") == dotted  # the same after a restart


def test_the_region_is_the_dispatchers_and_not_a_nodes_label() -> None:
    fleet = Fleet(Identity(cluster="kc", provider="p", region="eu-west"))
    [(worker_id, event)] = fleet.update([node("a", **{"topology.kubernetes.io/region": "us-east"})])
    assert worker_id == "kernel-kc-a" and event.region == "eu-west" and event.address == "10.0.0.1"
    assert fleet.update([node("a", **{"topology.kubernetes.io/region": "us-east"})]) != []  # not claimed yet
    fleet.registered[worker_id] = event
    assert fleet.update([node("a", **{"topology.kubernetes.io/region": "us-east"})]) == []  # unchanged


def test_only_ready_listed_registered_unrefused_nodes_are_alive() -> None:
    fleet = Fleet(Identity(cluster="kc", provider="p"))
    due = fleet.update(
        [node("a"), node("b", ready="False"), node("c", ready="Unknown"), node("d", ip="10.0.0.4")]
    )
    assert fleet.alive() == []  # nothing beats for a node the kernel has not registered (or enrolled)
    fleet.registered.update(due)
    assert fleet.alive() == ["kernel-kc-a", "kernel-kc-d"]
    fleet.refused["kernel-kc-d"] = "not enrolled"
    assert fleet.alive() == ["kernel-kc-a"]
    fleet.update([node("b")])  # a and d vanished
    assert fleet.alive() == ["kernel-kc-b"] and fleet.node_of("kernel-kc-a") is None


def test_a_node_address_that_is_not_an_ip_is_left_out() -> None:
    fleet = Fleet(Identity(cluster="kc", provider="p"))
    [(_, event)] = fleet.update([node("a", ip="gateway.kernel.svc; rm -rf")])
    assert event.address == ""


def test_a_cordoned_node_is_claimed_in_maintenance_once_and_plain_again_when_uncordoned() -> None:
    fleet = Fleet(Identity(cluster="kc", provider="p"))
    cordoned = node("a") | {"spec": {"unschedulable": True}}
    registrations = fleet.update([cordoned, node("b")])
    assert fleet.policies_due() == []  # nothing before its registration
    fleet.registered.update(registrations)
    due = dict(fleet.policies_due())  # after a start, every node's once
    assert {w: p.policy for w, p in due.items()} == {"kernel-kc-a": CORDONED, "kernel-kc-b": WorkerPolicy()}
    fleet.policies.update({w: p.policy for w, p in due.items()})
    assert fleet.policies_due() == []
    fleet.update([node("a"), node("b")])  # uncordoned
    assert [(w, p.policy) for w, p in fleet.policies_due()] == [("kernel-kc-a", WorkerPolicy())]


def test_the_cordon_policy_is_maintenance_at_every_minute_of_the_week() -> None:
    minute_ns = 60 * 10**9
    week = range(0, 7 * 24 * 60 * minute_ns, 7 * minute_ns)  # every 7th minute of a week
    assert all(in_maintenance(CORDONED.maintenance, t) for t in week)
    assert not any(in_maintenance(WorkerPolicy().maintenance, t) for t in week)
