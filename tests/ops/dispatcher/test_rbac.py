"""The dispatcher's ClusterRole (``ops/dispatcher/deploy/rbac.yaml``) grants exactly what the dispatcher's
conversation with an API server uses: every call a round or a command makes is made against kmock, and
the verbs its requests need are read off the requests themselves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from ops.dispatcher.cluster import Cluster
from ops.dispatcher.render import add_arguments, render
from ops.dispatcher.rounds import CONTROLLERS, MANAGED

if TYPE_CHECKING:
    from tests.support.kube import Kube

APPLIED = "X-Harness-Applied"
"""``tests.support.kube.APPLIED`` (imported here, the plugin would escape pytest's assert rewriting)."""

pytest_plugins = ("tests.support.kube",)

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "ops" / "dispatcher" / "deploy" / "rbac.yaml"
VERBS = {"POST": {"create"}, "PATCH": {"patch"}, "DELETE": {"delete"}}
"""The RBAC verbs a request needs, by method; a GET is ``list`` without a name and ``get`` with one,
and a server-side apply (a PATCH that may create) needs ``create`` and ``patch``."""
CLIENT = "OpenAPI-Generator/"
"""How the official client's requests begin their User-Agent (the harness's own are kmock's)."""


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def granted() -> set[tuple[str, str, str]]:
    """``(api group, resource, verb)`` the ClusterRole grants."""
    [role] = [d for d in documents() if d["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def verbs_of(method: str, named: bool, applied: bool) -> set[str]:
    """The RBAC verbs one request needs (:data:`VERBS`)."""
    if applied:
        return {"create", "patch"}
    return VERBS.get(method, {"get" if named else "list"})


def needed(kube: Kube) -> set[tuple[str, str, str]]:
    """What the official client's requests to the emulator needed."""
    found = {
        ("", "namespaces", verb)
        for method, named, agent in kube.mock.namespace_calls
        if agent.startswith(CLIENT)
        for verb in verbs_of(method, named, applied=method == "PATCH")  # the dispatcher only applies
    }
    for r in kube.mock._requests:  # every other request kmock served
        if r.resource is None or not r.headers.get("User-Agent", "").startswith(CLIENT):
            continue
        resource = f"{r.resource.plural}/{r.subresource}" if r.subresource else r.resource.plural
        verbs = verbs_of(r.method.value, bool(r.name), bool(r.headers.get(APPLIED)))
        found |= {(r.resource.group or "", resource, verb) for verb in verbs}
    return found


@pytest.fixture
async def cluster(kube: Kube) -> Any:
    cluster = Cluster.from_kubeconfig(kube.kubeconfig)
    yield cluster
    cluster.close()


async def test_the_cluster_role_grants_exactly_what_the_dispatcher_calls(
    kube: Kube, cluster: Cluster
) -> None:
    await kube.add_gpu_node("gpu-a", "10.0.0.1")
    await kube.add_gpu_node("gpu-b", "10.0.0.2")
    await cluster.nodes()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    namespaces = []
    for example in ("ddp-mlp/job.yaml", "fedavg-numpy/job.yaml", "inference/chat.yaml"):
        path = REPO / "examples" / example
        manifests = render(path, parser.parse_args([str(path), "--node", "gpu-a", "--node", "gpu-b"]))
        await cluster.apply(manifests)
        namespaces += [m["metadata"]["name"] for m in manifests if m["kind"] == "Namespace"]
    await kube.run_controllers()
    await cluster.namespaces(MANAGED)
    for api_version, kind in CONTROLLERS.values():
        await cluster.objects(api_version, kind, None, MANAGED)  # a restart's reconciliation
        await cluster.objects(api_version, kind, namespaces[0], MANAGED)  # a round
    await cluster.objects("v1", "Service", namespaces[2], MANAGED)  # a replica's node port
    [pod, *_] = await cluster.pods(namespaces[0], MANAGED)
    kube.set_log(pod.namespace, pod.name, "step 1\n")
    await cluster.pod_log(pod.namespace, pod.name)
    for api_version, kind in [*CONTROLLERS.values(), ("v1", "Service")]:  # a replica forgotten
        [obj, *_] = await cluster.objects(api_version, kind, None, MANAGED)
        await cluster.delete(api_version, kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
    await cluster.delete_namespace(namespaces[0])
    assert needed(kube) == granted()


def test_the_manifest_is_valid_and_fences_the_dispatcher_to_its_namespaces() -> None:
    for document in documents():
        kubernetes_validate.validate(document, latest_version(), strict=True)
    [policy] = [d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in documents() if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    fenced = set(policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"])
    assert fenced == {resource for _, resource, verb in granted() if verb in ("create", "patch", "delete")}
    [account] = [d for d in documents() if d["kind"] == "ServiceAccount"]
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    assert user in policy["spec"]["matchConditions"][0]["expression"]
