"""The namespace of one job or endpoint and what fences it: a ResourceQuota and a LimitRange from what
the kernel placed (a runaway workload cannot take more than its assignments hold), and NetworkPolicies
that deny everything, then allow only what the work needs.

Allowed peers (NetworkPolicies add up; nothing else gets in or out):

* ``allow-dns``: egress to the cluster DNS pods, port 53 UDP and TCP;
* ``allow-object-store``: egress to the object store's address and port, where presigned URLs point
  (inputs, a checkpoint to resume from, kits);
* jobs only, ``allow-same-namespace``: the job's own pods with each other, both ways: torchrun's
  rendezvous and collectives (gloo and NCCL connect on ephemeral ports), NVFlare clients to their FL
  server. An endpoint's replicas never call each other, so an endpoint has no such rule;
* a federated job's FL server, ``allow-kernel-admin``: ingress on its port from the kernel's federation
  service (which runs the FL runs through NVFlare's admin API);
* endpoints, ``allow-gateway``: ingress on the engine port from the gateway's pods (or its address):
  the proxy is the only caller of a replica;
* endpoints serving a hub model, ``allow-model-hub``: egress on 443 to the hub's addresses, when the
  operator lists some.

Never: the Kubernetes API (no egress to it, and no service account token mounted), other namespaces,
the kernel's NATS, the internet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ops.dispatcher.context import RenderContext

Manifest = dict[str, Any]
SURGE = 2
"""A work's quota holds this many times what was placed (:func:`resource_quota` says why)."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the API server on every namespace (1.22+): a selector on it cannot be forged by a label."""


@dataclass(frozen=True)
class PodSize:
    """What one pod of the work may use (its main container's requests, equal to its limits)."""

    cpus: float
    memory_mb: int
    gpus: int = 0


def millicores(cpus: float) -> str:
    """``cpus`` as a Kubernetes CPU quantity in millicores (at least 1m)."""
    return f"{max(1, round(cpus * 1000))}m"


def mebibytes(mb: int) -> str:
    """``mb`` MiB as a Kubernetes memory quantity."""
    return f"{max(1, mb)}Mi"


def metadata(
    name: str, namespace: str | None, labels: dict[str, str], annotations: dict[str, str]
) -> Manifest:
    meta: Manifest = {"name": name, "labels": dict(labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def namespace(name: str, labels: dict[str, str], annotations: dict[str, str]) -> Manifest:
    """The work's namespace. Pod Security Admission enforces ``restricted`` on it, so a pod that is
    not hardened (by a bug here) is refused by the API server, not run."""
    psa = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": metadata(name, None, {**labels, **psa}, annotations),
    }


def resource_quota(
    ns: str,
    labels: dict[str, str],
    pods: Sequence[PodSize],
    services: int,
    ctx: RenderContext,
    *,
    node_ports: int = 0,
) -> Manifest:
    """The namespace's quota: room for what was placed twice over (:data:`SURGE`): no more pods, CPU,
    memory or GPUs than each slot's pod and one replacement, ``services`` Services of which
    ``node_ports`` NodePorts (an endpoint's replicas: one each) likewise, and no LoadBalancer or volume
    claim.

    Why twice: a replacement (a new epoch after a node was lost, a gang restarted) is created while the
    pod it replaces may still count. A dead node's pod stays terminating, and counted, until its
    grace period has passed twice over; a quota of exactly what was placed refuses the replacement
    for that long. The quota fences the dispatcher's own objects (a workload has no API access), and
    the kernel's placement, not the quota, keeps each node to what was placed on it."""
    cpus = SURGE * sum(p.cpus for p in pods)
    memory = SURGE * sum(p.memory_mb for p in pods)
    hard = {
        "pods": str(SURGE * len(pods)),
        "requests.cpu": millicores(cpus),
        "limits.cpu": millicores(cpus),
        "requests.memory": mebibytes(memory),
        "limits.memory": mebibytes(memory),
        f"requests.{ctx.gpu_resource}": str(SURGE * sum(p.gpus for p in pods)),
        "services": str(SURGE * services),
        "services.nodeports": str(SURGE * node_ports),
        "services.loadbalancers": "0",
        "persistentvolumeclaims": "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": metadata("work-quota", ns, labels, {}),
        "spec": {"hard": hard},
    }


def limit_range(ns: str, labels: dict[str, str], pods: Sequence[PodSize], ctx: RenderContext) -> Manifest:
    """No container above the largest the work placed; a container that names no resources (the
    dispatcher renders none such) gets the fetcher's small share."""
    largest = {
        "cpu": millicores(max(p.cpus for p in pods)),
        "memory": mebibytes(max(p.memory_mb for p in pods)),
    }
    small = {"cpu": millicores(ctx.fetcher_cpus), "memory": mebibytes(ctx.fetcher_memory_mb)}
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": metadata("work-limits", ns, labels, {}),
        "spec": {
            "limits": [
                {"type": "Container", "max": largest, "default": small, "defaultRequest": small},
                {"type": "Pod", "max": dict(largest)},
            ]
        },
    }


def _policy(ns: str, labels: dict[str, str], name: str, selector: dict[str, str], **rules: Any) -> Manifest:
    types = [kind for kind, key in (("Ingress", "ingress"), ("Egress", "egress")) if key in rules]
    spec: Manifest = {"podSelector": {"matchLabels": selector} if selector else {}, "policyTypes": types}
    spec.update(rules)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, ns, labels, {}),
        "spec": spec,
    }


def _namespace_peer(namespace_name: str, pod_labels: dict[str, str]) -> Manifest:
    peer: Manifest = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace_name}}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}
    return peer


def default_deny(ns: str, labels: dict[str, str]) -> Manifest:
    """No ingress and no egress for any pod of the namespace (what other policies do not allow)."""
    return _policy(ns, labels, "default-deny", {}, ingress=[], egress=[])


def network_policies(
    ns: str,
    labels: dict[str, str],
    ctx: RenderContext,
    *,
    same_namespace: bool,
    gateway_ingress: bool = False,
    hub_egress: bool = False,
    fl_server: dict[str, str] | None = None,
    kernel_fl_port: int | None = None,
) -> list[Manifest]:
    """Default deny, then the allow rules of the module docstring. ``fl_server``: the FL server pod's
    labels, which the kernel alone may reach from outside on :attr:`RenderContext.fl_port`;
    ``kernel_fl_port``: the port of the kernel's FL server the job's clients dial, at
    :attr:`RenderContext.federation_cidr`."""
    dns = {
        "to": [_namespace_peer(ctx.dns_namespace, ctx.dns_labels)],
        "ports": [{"protocol": p, "port": 53} for p in ("UDP", "TCP")],
    }
    store = {
        "to": [{"ipBlock": {"cidr": ctx.object_store_cidr}}],
        "ports": [{"protocol": "TCP", "port": ctx.object_store_port}],
    }
    policies = [
        default_deny(ns, labels),
        _policy(ns, labels, "allow-dns", {}, egress=[dns]),
        _policy(ns, labels, "allow-object-store", {}, egress=[store]),
    ]
    if same_namespace:
        ingress: list[Manifest] = [{"from": [{"podSelector": {}}]}]
        egress: list[Manifest] = [{"to": [{"podSelector": {}}]}]
        policies.append(_policy(ns, labels, "allow-same-namespace", {}, ingress=ingress, egress=egress))
    if fl_server is not None:
        admin = {
            "from": [_namespace_peer(ctx.kernel_namespace, ctx.kernel_labels)],
            "ports": [{"protocol": "TCP", "port": ctx.fl_port}],
        }
        policies.append(_policy(ns, labels, "allow-kernel-admin", fl_server, ingress=[admin]))
    if kernel_fl_port is not None and ctx.federation_cidr:
        server = {
            "to": [{"ipBlock": {"cidr": ctx.federation_cidr}}],
            "ports": [{"protocol": "TCP", "port": kernel_fl_port}],
        }
        policies.append(_policy(ns, labels, "allow-kernel-fl-server", {}, egress=[server]))
    if gateway_ingress:
        gateway = (
            {"ipBlock": {"cidr": ctx.gateway_cidr}}
            if ctx.gateway_cidr
            else _namespace_peer(ctx.gateway_namespace, ctx.gateway_labels)
        )
        rule = {"from": [gateway], "ports": [{"protocol": "TCP", "port": ctx.engine_port}]}
        policies.append(_policy(ns, labels, "allow-gateway", {}, ingress=[rule]))
    if hub_egress and ctx.hub_cidrs:
        hub = {
            "to": [{"ipBlock": {"cidr": cidr}} for cidr in ctx.hub_cidrs],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
        policies.append(_policy(ns, labels, "allow-model-hub", {}, egress=[hub]))
    return policies
