"""The dispatcher's conversation with an API server (kmock, through ``tests/support/kube.py``): apply a
namespace-full of objects, again (idempotent), list by label, delete, read nodes and see one go
NotReady, read a failed pod's phase and log tail, and the errors each failure becomes.

What kmock does not emulate, and so what these tests do not show, is listed in ``tests/support/kube.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kmock
import pytest

from core.errors import ConfigError, InvalidInput, NotFound
from ops.dispatcher.cluster import (
    LOG_TAIL_BYTES,
    Cluster,
    ClusterRefused,
    ClusterUnreachable,
)
from ops.dispatcher.nodes import node_worker
from ops.dispatcher.render import add_arguments, render
from ops.ports import free_port

if TYPE_CHECKING:
    from tests.support.kube import Kube

pytest_plugins = ("tests.support.kube",)

REPO = Path(__file__).resolve().parents[3]
MANAGED = "app.kubernetes.io/managed-by=resontech-dispatcher"
JOBS = kmock.resource("batch", "v1", "jobs")
SERVICES = kmock.resource("", "v1", "services")


def labels(work: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "resontech-dispatcher", "resontech.io/work": work}


def job_objects(ns: str, work: str = "job-1") -> list[dict[str, Any]]:
    """A namespace-full, hand-written and minimal, Namespace last to show it is applied first."""
    meta = {"namespace": ns, "labels": labels(work)}
    template = {
        "metadata": {"labels": labels(work)},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    once = template | {"spec": template["spec"] | {"restartPolicy": "Never"}}
    return [
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "quota", **meta},
            "spec": {"hard": {"requests.nvidia.com/gpu": "2", "pods": "4"}},
        },
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "limits", **meta},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "1"}}]},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "deny", **meta},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ranks", **meta},
            "spec": {"clusterIP": "None", "selector": labels(work)},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "shard-0", **meta},
            "spec": {"backoffLimit": 0, "template": once},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "replicas", **meta},
            "spec": {"selector": {"matchLabels": labels(work)}, "template": template},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels(work)}},
    ]


@pytest.fixture
async def cluster(kube: Kube) -> Any:
    cluster = Cluster.from_kubeconfig(kube.kubeconfig)
    yield cluster
    cluster.close()


async def test_apply_creates_the_namespace_first_then_the_rest_in_order(kube: Kube, cluster: Cluster) -> None:
    applied = await cluster.apply(job_objects("rt-acme-job-1"))
    kinds = ["Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "Service", "Job", "Deployment"]
    assert [a.kind for a in applied] == kinds and all(a.created for a in applied)
    posted = [r.resource.plural for r in kube.mock["post"] if r.resource]  # (namespaces: the harness)
    assert posted == ["resourcequotas", "limitranges", "networkpolicies", "services", "jobs", "deployments"]
    assert kube.mock.objects[JOBS, "rt-acme-job-1", "shard-0"]["spec"]["backoffLimit"] == 0


async def test_apply_again_patches_what_exists_and_fails_on_nothing(kube: Kube, cluster: Cluster) -> None:
    await cluster.apply(job_objects("rt-acme-job-1"))
    again = job_objects("rt-acme-job-1")
    again[4]["spec"]["backoffLimit"] = 2
    applied = await cluster.apply(again)
    assert len(applied) == 7 and not any(a.created for a in applied)
    assert kube.mock.objects[JOBS, "rt-acme-job-1", "shard-0"]["spec"]["backoffLimit"] == 2
    assert len(await cluster.objects("batch/v1", "Job", "rt-acme-job-1")) == 1


async def test_applying_again_into_a_namespace_whose_quota_is_full_creates_nothing_twice(
    kube: Kube, cluster: Cluster
) -> None:
    """A real API server runs quota admission before it sees a name is taken: a create of an existing
    Service in a namespace whose quota is full answers 403, never 409. Every start of a gang's shard
    and of an endpoint's replica applies its work's objects again."""
    objects = job_objects("rt-acme-job-1")
    objects[0]["spec"]["hard"] = {"services": "1", "pods": "1"}
    await cluster.apply(objects)
    await kube.add_pod("rt-acme-job-1", "shard-0-pod", labels=labels("job-1"))
    applied = await cluster.apply(job_objects("rt-acme-job-1")[:1] + objects[1:])
    assert len(applied) == 7 and not any(a.created for a in applied)
    assert [r.method for r in kube.mock["post"] if r.resource == SERVICES] == ["POST"]  # the first only
    with pytest.raises(ClusterRefused, match="exceeded quota: quota"):  # the harness admits as a server
        await cluster.apply(
            [
                job_objects("rt-acme-job-1", "job-1")[3]
                | {"metadata": {"name": "more", "namespace": "rt-acme-job-1"}}
            ]
        )


async def test_a_terminating_namespace_refuses_new_objects_until_its_last_pod_is_gone(
    kube: Kube, cluster: Cluster
) -> None:
    await kube.add_gpu_node("gpu-a", "10.0.0.1")
    await cluster.apply(job_objects("rt-acme-job-1"))
    await kube.add_pod("rt-acme-job-1", "shard-0-pod", labels=labels("job-1"), node="gpu-a")
    kube.kubelet_down("gpu-a")  # the node died: its pod cannot confirm its end
    assert await cluster.delete_namespace("rt-acme-job-1") is True
    [ns] = await cluster.namespaces(MANAGED)
    assert ns.terminating and [p.name for p in await cluster.pods("rt-acme-job-1")] == ["shard-0-pod"]
    # Kubernetes 1.36 deletes the pods first and keeps the rest until they are gone: applying what is
    # there again passes, anything new is refused.
    assert not any(a.created for a in await cluster.apply(job_objects("rt-acme-job-1")))
    another = job_objects("rt-acme-job-1")[4]
    another["metadata"] = another["metadata"] | {"name": "shard-1"}
    with pytest.raises(ClusterRefused, match="being terminated") as refused:
        await cluster.apply([another])
    assert refused.value.status == 403
    assert await kube.force_delete_pods("gpu-a") == ["shard-0-pod"]
    assert await cluster.namespaces(MANAGED) == []


async def test_a_kubelet_that_does_not_answer_fails_a_log_read_in_seconds(
    kube: Kube, cluster: Cluster
) -> None:
    await kube.add_gpu_node("gpu-a", "10.0.0.1")
    await cluster.apply(job_objects("rt-acme-job-1"))
    await kube.add_pod("rt-acme-job-1", "shard-0-pod", labels=labels("job-1"), node="gpu-a")
    kube.set_log("rt-acme-job-1", "shard-0-pod", "step 1\n")
    assert await cluster.pod_log("rt-acme-job-1", "shard-0-pod") == "step 1\n"
    kube.kubelet_down("gpu-a", "refuse")
    with pytest.raises(ClusterUnreachable, match="connection refused"):
        await cluster.pod_log("rt-acme-job-1", "shard-0-pod")
    kube.kubelet_down("gpu-a", "hang")  # answers after the read time-out, which is not tried again
    with pytest.raises(ClusterUnreachable, match="ReadTimeoutError"):
        await cluster.pod_log("rt-acme-job-1", "shard-0-pod")
    assert len([r for r in kube.mock["get"] if r.subresource == "log"]) == 3  # one read each


async def test_apply_refuses_unknown_kinds_unnamed_and_unnamespaced_objects(cluster: Cluster) -> None:
    rbac = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "s"},
    }
    no_namespace = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}
    no_name = {"apiVersion": "v1", "kind": "Namespace", "metadata": {}}
    for manifest in (rbac, no_namespace, no_name):
        with pytest.raises(InvalidInput):
            await cluster.apply([manifest])
    with pytest.raises(NotFound, match="namespaces"):  # the server refuses objects of no namespace
        await cluster.apply(job_objects("rt-acme-job-1")[:-1])


async def test_objects_and_namespaces_list_by_label(cluster: Cluster) -> None:
    await cluster.apply(job_objects("rt-acme-job-1", "job-1") + job_objects("rt-acme-job-2", "job-2"))
    await cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}])
    assert sorted(ns.name for ns in await cluster.namespaces(MANAGED)) == ["rt-acme-job-1", "rt-acme-job-2"]
    job2 = await cluster.namespaces("resontech.io/work=job-2")
    assert [(ns.name, ns.terminating, ns.labels["resontech.io/work"]) for ns in job2] == [
        ("rt-acme-job-2", False, "job-2")
    ]
    jobs = await cluster.objects("batch/v1", "Job", None, "resontech.io/work=job-1")
    assert [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in jobs] == [
        ("rt-acme-job-1", "shard-0")
    ]
    assert await cluster.objects("apps/v1", "Deployment", "rt-acme-job-2", "resontech.io/work=job-1") == []
    with pytest.raises(InvalidInput):
        await cluster.objects("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")


async def test_deleting_a_namespace_deletes_what_it_holds_and_twice_is_no_error(
    kube: Kube, cluster: Cluster
) -> None:
    await cluster.apply(job_objects("rt-acme-job-1") + job_objects("rt-acme-job-2", "job-2"))
    await kube.add_pod("rt-acme-job-1", "shard-0-abcde", labels=labels("job-1"))
    assert await cluster.delete_namespace("rt-acme-job-1") is True
    assert [ns.name for ns in await cluster.namespaces(MANAGED)] == ["rt-acme-job-2"]
    assert await cluster.pods("rt-acme-job-1") == []
    assert await cluster.objects("batch/v1", "Job", "rt-acme-job-1") == []
    assert len(await cluster.objects("batch/v1", "Job", "rt-acme-job-2")) == 1
    assert await cluster.delete_namespace("rt-acme-job-1") is False


async def test_nodes_read_as_workers_and_one_goes_not_ready(kube: Kube, cluster: Cluster) -> None:
    gpu = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    allocatable = {"cpu": "31500m", "memory": "250Gi", "nvidia.com/gpu": "4"}
    for name in ("gpu-a", "gpu-b"):
        await kube.add_node(name, labels=gpu | {"kubernetes.io/hostname": name}, allocatable=allocatable)
    listing = await cluster.nodes()
    workers = sorted((node_worker(node) for node in listing.items), key=lambda w: w.name)
    assert [(w.name, len(w.gpus), w.cpus, w.ready) for w in workers] == [
        ("gpu-a", 4, 31, True),
        ("gpu-b", 4, 31, True),
    ]

    await kube.set_node_ready("gpu-b", "False")
    assert {node_worker(n).name: node_worker(n).ready for n in (await cluster.nodes()).items} == {
        "gpu-a": True,
        "gpu-b": False,
    }


async def test_a_failed_pod_shows_its_phase_exit_code_and_log_tail(kube: Kube, cluster: Cluster) -> None:
    await cluster.apply(job_objects("rt-acme-job-1"))
    await kube.add_pod("rt-acme-job-1", "shard-0-abcde", labels=labels("job-1"), node="gpu-a")
    await kube.add_pod("rt-acme-job-1", "other", labels={"app": "else"})
    [pending] = await cluster.pods("rt-acme-job-1", "resontech.io/work=job-1")
    assert (pending.phase, pending.node, pending.containers) == ("Pending", "gpu-a", ())

    await kube.set_pod_phase("rt-acme-job-1", "shard-0-abcde", "Running")
    [running] = await cluster.pods(None, MANAGED)
    assert (running.phase, running.containers[0].state, running.started_at) == (
        "Running",
        "running",
        "2026-01-01T00:00:00Z",
    )

    await kube.set_pod_phase("rt-acme-job-1", "shard-0-abcde", "Failed", exit_code=137)
    kube.set_log(
        "rt-acme-job-1", "shard-0-abcde", "".join(f"line {i}\n" for i in range(100)) + "CUDA error: OOM\n"
    )
    [failed] = await cluster.pods("rt-acme-job-1", MANAGED)
    container = failed.containers[0]
    assert (failed.phase, container.state, container.exit_code, container.reason) == (
        "Failed",
        "terminated",
        137,
        "Error",
    )
    assert container.finished_at == "2026-01-01T00:10:00Z"
    tail = await cluster.pod_log("rt-acme-job-1", "shard-0-abcde", tail_lines=2)
    assert tail == "line 99\nCUDA error: OOM\n"
    with pytest.raises(NotFound):
        await cluster.pod_log("rt-acme-job-1", "no-such-pod")
    stamped = "".join(f"2026-11-24T14:00:{s:02d}.5Z step {s}\n" for s in range(4))
    kube.set_log("rt-acme-job-1", "shard-0-abcde", stamped)
    since = await cluster.pod_log("rt-acme-job-1", "shard-0-abcde", since="2026-11-24T14:00:02Z")
    assert since == "2026-11-24T14:00:02.5Z step 2\n2026-11-24T14:00:03.5Z step 3\n"
    [read] = [r for r in kube.mock["get"] if r.subresource == "log"][-1:]
    assert (read.params["sinceTime"], read.params["timestamps"], read.params["limitBytes"]) == (
        "2026-11-24T14:00:02Z",
        "true",
        str(LOG_TAIL_BYTES),
    )


async def test_failures_become_the_projects_errors(kube: Kube, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Cluster.from_kubeconfig(tmp_path / "missing")
    with pytest.raises(ConfigError):
        Cluster.in_cluster()  # not in a pod

    from tests.support.kube import (
        write_kubeconfig,  # here: the plugin is loaded (and its asserts rewritten) by now
    )

    nobody = Cluster.from_kubeconfig(write_kubeconfig(tmp_path / "nobody", f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(ClusterUnreachable):
        await nobody.nodes()
    nobody.close()

    cluster = Cluster.from_kubeconfig(kube.kubeconfig)
    kube.mock["post", JOBS] << kmock.KubernetesError(status=403, reason="Forbidden", message="RBAC")
    kube.mock["get /api/v1/nodes"] << kmock.KubernetesError(status=500, reason="InternalError")
    with pytest.raises(ClusterRefused) as refused:
        await cluster.apply(job_objects("rt-acme-job-1"))
    assert (refused.value.status, refused.value.reason, refused.value.code) == (
        403,
        "Forbidden",
        "cluster_refused",
    )
    with pytest.raises(ClusterUnreachable):
        await cluster.nodes()
    cluster.close()


def test_the_harness_selects_labels_as_a_server_does_or_refuses_the_form() -> None:
    from tests.support.kube import selects

    pod = {"app": "x", "tier": "gpu"}
    assert selects("", pod) and selects("app=x", pod) and selects("app==x,tier", pod)
    assert selects("app!=y,!zone", pod) and not selects("app=y", pod) and not selects("tier,zone", pod)
    with pytest.raises(ValueError):
        selects("app in (x,y)", pod)


async def test_what_the_renderer_makes_applies_again_and_goes(cluster: Cluster) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # One of each shape: a DDP gang (Jobs, Secrets, the ranks Service), a federated job (the FL
    # server's Pod), an endpoint (Deployments); tests/ops/dispatcher/test_manifests.py renders them all.
    examples = ["ddp-mlp/job.yaml", "fedavg-numpy/job.yaml", "inference/chat.yaml"]
    for path in (REPO / "examples" / name for name in examples):
        manifests = render(path, parser.parse_args([str(path), "--node", "gpu-a", "--node", "gpu-b"]))
        first, again = await cluster.apply(manifests), await cluster.apply(manifests)
        assert len(first) == len(again) == len(manifests), path
        assert all(a.created for a in first) and not any(a.created for a in again), path
        [namespace] = [a.name for a in first if a.kind == "Namespace"]
        assert [ns.name for ns in await cluster.namespaces(MANAGED)] == [namespace]
        assert await cluster.delete_namespace(namespace)
        assert await cluster.namespaces(MANAGED) == []
