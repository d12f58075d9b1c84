"""The Kubernetes objects the dispatcher renders (:mod:`ops.dispatcher.manifests`) and
``resontech dispatcher render``: pure, no cluster.

Every manifest is checked with ``kubernetes-validate``, strict (no unknown field), against the schemas
of :data:`K8S`, the newest release the installed kubernetes-validate ships. The work commands are the
coordinator's own (:mod:`ops.dispatcher.render` builds them with ``ops.coordinator``'s functions for a
synthetic placement), so what is validated is what the kernel would send.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from core.placement.placing import work_ref
from core.workenv import workload_env
from ops.dispatcher import names
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fetch import main as fetch_main
from ops.dispatcher.manifests import (
    Dispatch,
    FlServer,
    ManifestError,
    endpoint_manifests,
    job_manifests,
    work_namespace,
)
from ops.dispatcher.render import RenderPresigner, endpoint_commands, job_commands, to_yaml
from schemas.api.endpoints import DeployEndpoint
from schemas.api.jobs import SubmitJob
from schemas.commands import StartWork, WorkSpec
from tests.support.fake_cluster import K8S

"""The Kubernetes release every manifest is validated against (the newest kubernetes-validate ships)."""
REPO = Path(__file__).resolve().parents[3]
CTX = RenderContext(object_store_cidr="10.0.0.7/32", object_store_port=9000)
PRESIGNER = RenderPresigner("http://10.0.0.7:9000")
NODES = ["gpu-node-a", "gpu-node-b"]
KEY = "k" * 43
Manifest = dict[str, Any]


def validate(objects: list[Manifest]) -> None:
    for obj in objects:
        kubernetes_validate.validate(obj, K8S, strict=True)


def job(spec: dict[str, Any], tenant: str = "acme") -> tuple[list[Dispatch], FlServer | None]:
    return job_commands(msgspec.convert(spec, SubmitJob), tenant, NODES, PRESIGNER, CTX)


def endpoint(spec: dict[str, Any], replicas: int = 1) -> list[Dispatch]:
    return endpoint_commands(msgspec.convert(spec, DeployEndpoint), "acme", NODES, PRESIGNER, replicas)


def render_endpoint(dispatches: list[Dispatch], ctx: RenderContext = CTX) -> list[Manifest]:
    keys = {d.command.assignment_id: KEY for d in dispatches}
    return endpoint_manifests(dispatches, ctx, api_keys=keys)


PROCESS = {
    "name": "etl",
    "kind": "process",
    "shards": 2,
    "command": ["python3", "run.py"],
    "inputs": ["run.py"],
}
DDP = {
    "name": "ddp-mlp",
    "kind": "ddp",
    "shards": 2,
    "resources": {"gpus": 2, "cpus": 4, "memory_mb": 8192, "gpu_type": "A100"},
    "command": ["scripts/train.py", "--epochs", "3"],
    "inputs": ["scripts/train.py", "data/"],
}
FEDERATED = {
    "name": "fedavg",
    "kind": "federated",
    "shards": 2,
    "rounds": 3,
    "federated": {"script": "jobs/fedavg/train.py"},
}
GPU_ENDPOINT = {"name": "chat", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "gpu_type": "A100"}
CPU_ENDPOINT = {"name": "minilm", "model": "all-MiniLM-L6-v2", "engine": "cpu", "min_replicas": 1}


def rendered(kind: str) -> list[Manifest]:
    if kind == "process":
        return job_manifests(job(PROCESS)[0], CTX)
    if kind == "ddp":
        return job_manifests(job(DDP)[0], CTX)
    if kind == "federated":
        shards, server = job(FEDERATED)
        return job_manifests(shards, CTX, fl_server=server)
    if kind == "endpoint-gpu":
        return render_endpoint(endpoint(GPU_ENDPOINT, replicas=2))
    if kind == "endpoint-vllm-cpu":
        return render_endpoint(endpoint({"name": "chat", "model": "smollm2-135m-instruct"}))
    return render_endpoint(endpoint(CPU_ENDPOINT))


KINDS = ["process", "ddp", "federated", "endpoint-gpu", "endpoint-vllm-cpu", "endpoint-cpu"]


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[Manifest]) -> list[Manifest]:
    specs = [o["spec"] for o in of_kind(objects, "Pod")]
    specs += [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Job", "Deployment")]
    return specs


def env_of(container: Manifest) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_named_release_is_the_newest_kubernetes_validate_ships() -> None:
    assert latest_version().startswith(f"{K8S}.")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_work_passes_strict_validation(kind: str) -> None:
    objects = rendered(kind)
    validate(objects)
    assert [o["kind"] for o in objects[:3]] == ["Namespace", "ResourceQuota", "LimitRange"]
    ns = objects[0]["metadata"]["name"]
    assert all(o["metadata"]["namespace"] == ns for o in objects[1:])
    assert not of_kind(objects, "ServiceAccount") and not of_kind(objects, "HorizontalPodAutoscaler")


def test_a_process_job_is_one_pinned_indexed_job_per_shard_with_the_agents_environment() -> None:
    dispatches, _ = job(PROCESS)
    objects = job_manifests(dispatches, CTX)
    jobs = of_kind(objects, "Job")
    assert [j["metadata"]["name"] for j in jobs] == ["shard-0-e1", "shard-1-e1"]
    for j, d in zip(jobs, dispatches, strict=True):
        spec = j["spec"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
            "Indexed",
            1,
            1,
            0,
        )
        pod = spec["template"]["spec"]
        assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"kubernetes.io/hostname": d.node}
        assert spec["template"]["metadata"]["labels"][names.SHARD] == str(d.command.slot)
        [main] = pod["containers"]
        assert main["command"] == ["python3", "run.py"] and "args" not in main
        expected = workload_env(d.command, "/work", gpu_indices=[])
        assert env_of(main) == expected
        ref = work_ref(d.command.tenant, "job", d.command.work_id)
        assert env_of(main)["RESONTECH_ASSIGNMENT_ID"] == f"{ref}-s{d.command.slot}-e1"
    assert not [s for s in of_kind(objects, "Service")], "no rendezvous for a process job"


def test_a_ddp_gang_meets_at_shard_zero_through_the_headless_service() -> None:
    dispatches, _ = job(DDP)
    objects = job_manifests(dispatches, CTX)
    ns = objects[0]["metadata"]["name"]
    ranks = named(objects, "Service", "ranks")
    assert ranks["spec"]["clusterIP"] == "None" and ranks["spec"]["publishNotReadyAddresses"] is True
    port = dispatches[0].command.spec.rendezvous.master_port  # type: ignore[union-attr]
    assert ranks["spec"]["ports"][0]["port"] == port
    for rank, j in enumerate(of_kind(objects, "Job")):
        pod = j["spec"]["template"]["spec"]
        assert pod["subdomain"] == "ranks"
        argv = pod["containers"][0]["command"]
        assert argv[argv.index("--master-addr") + 1] == f"shard-0-e1-0.ranks.{ns}.svc.cluster.local"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nproc-per-node") + 1] == "2"
        assert argv[-3:] == ["/work/scripts/train.py", "--epochs", "3"]
        env = env_of(pod["containers"][0])
        assert env["RESONTECH_DDP_BACKEND"] == "nccl" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_a_federated_job_runs_each_site_with_its_kit_and_the_fl_server_in_its_namespace() -> None:
    shards, server = job(FEDERATED)
    objects = job_manifests(shards, CTX, fl_server=server)
    ns = objects[0]["metadata"]["name"]
    jobs = of_kind(objects, "Job")
    sites = [j["spec"]["template"]["spec"]["containers"][0]["command"] for j in jobs]
    assert [next(a for a in argv if a.startswith("uid=")) for argv in sites] == ["uid=site-1", "uid=site-2"]
    inputs = json.loads(named(objects, "Secret", "shard-1-e1-inputs")["stringData"]["downloads.json"])
    assert {e["path"]: e.get("unpack") for e in inputs} == {
        "startup-kit.zip": "kit",
        "jobs/fedavg/shards/shard-1.zip": "data",
    }
    pod = named(objects, "Pod", "fl-server")
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == CTX.fl_port
    service = named(objects, "Service", "fl-server")
    assert service["spec"]["selector"] == {names.ROLE: "fl-server"}
    assert shards[0].command.spec.options["server"] == f"fl-server.{ns}.svc.cluster.local:{CTX.fl_port}"
    admin = named(objects, "NetworkPolicy", "allow-kernel-admin")["spec"]
    assert admin["podSelector"] == {"matchLabels": {names.ROLE: "fl-server"}}
    assert admin["ingress"][0]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": CTX.kernel_namespace}
    }
    assert named(objects, "ResourceQuota", "work-quota")["spec"]["hard"]["pods"] == "6"  # 3 and replacements


def test_a_gpu_replica_is_a_pinned_deployment_of_one_with_its_own_service_and_key() -> None:
    dispatches = endpoint({**GPU_ENDPOINT, "min_replicas": 2}, replicas=2)
    objects = render_endpoint(dispatches)
    deployments = of_kind(objects, "Deployment")
    assert [d["metadata"]["name"] for d in deployments] == ["replica-0-e1", "replica-1-e1"]
    for deployment, d in zip(deployments, dispatches, strict=True):
        spec = deployment["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
        pod = spec["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": d.node}
        [engine] = pod["containers"]
        assert engine["image"] == CTX.vllm_image
        assert engine["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert KEY not in json.dumps(engine) and KEY not in json.dumps(deployment)
        assert env_of(engine)["VLLM_API_KEY"] == {
            "secretKeyRef": {"name": f"replica-{d.command.slot}-e1-key", "key": "api-key"}
        }
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": CTX.engine_port}
        service = named(objects, "Service", f"replica-{d.command.slot}-e1")
        assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
        assert service["spec"]["type"] == "NodePort"  # reached at its own node's address only
        assert service["spec"]["externalTrafficPolicy"] == "Local"
    assert named(objects, "Secret", "replica-0-e1-key")["stringData"] == {"api-key": KEY}
    hard = named(objects, "ResourceQuota", "work-quota")["spec"]["hard"]
    # one node port per replica, and room for each replica's replacement while the old one goes
    assert hard["requests.nvidia.com/gpu"] == "4" and hard["services.nodeports"] == "4"


def test_cpu_replicas_take_no_gpu_and_the_cpu_engine_runs_in_the_default_image() -> None:
    embeddings = render_endpoint(endpoint(CPU_ENDPOINT))
    [engine] = of_kind(embeddings, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert engine["image"] == CTX.default_image and "agent.engines.embeddings" in engine["command"]
    assert named(embeddings, "ResourceQuota", "work-quota")["spec"]["hard"]["requests.nvidia.com/gpu"] == "0"
    chat = render_endpoint(endpoint({"name": "chat", "model": "smollm2-135m-instruct"}))
    [engine] = of_kind(chat, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert engine["image"] == CTX.vllm_cpu_image and "--enforce-eager" in engine["command"]
    assert "nvidia.com/gpu" not in engine["resources"]["limits"]
    assert env_of(engine)["CUDA_VISIBLE_DEVICES"] == "" and env_of(engine)["HF_HUB_OFFLINE"] == "1"


def test_a_workspace_model_arrives_through_presigned_urls_into_the_working_dir() -> None:
    spec = {"name": "mine", "model": "model_out/run-1/", "model_source": "workspace", "engine": "vllm"}
    objects = render_endpoint(endpoint(spec))
    [engine] = of_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert engine["command"][engine["command"].index("--model") + 1] == "/work/model"
    entries = json.loads(named(objects, "Secret", "replica-0-e1-inputs")["stringData"]["downloads.json"])
    assert {e["path"] for e in entries} == {"model/config.json", "model/model.safetensors"}


# Names and labels


TRICKY_IDS = ["acme", "Acme", "ACME_corp", "a" * 64, "x-" * 32, "-lead", "trail_", "_", "9"]


def test_namespaces_are_dns_labels_stable_and_never_shared() -> None:
    seen: dict[str, tuple[str, str, str]] = {}
    for tenant in TRICKY_IDS:
        for work in TRICKY_IDS:
            for kind in ("job", "endpoint"):
                name = work_namespace(tenant, work, kind, CTX)
                assert names.is_dns_label(name) and name.startswith("rt-"), name
                assert name == work_namespace(tenant, work, kind, CTX)
                assert seen.setdefault(name, (tenant, work, kind)) == (tenant, work, kind)


def test_label_values_are_sanitized_and_the_exact_ids_are_annotations() -> None:
    for value in [*TRICKY_IDS, "evil/../x", "a b", "é", "x" * 300, "$(HOME)", "new\nline"]:
        label = names.label_value(value)
        assert names.is_label_value(label) and len(label) <= 63, (value, label)
    assert names.label_value("acme") == "acme"
    assert names.label_value("Acme") != names.label_value("acme")
    assert names.label_value("a" * 64) != names.label_value("a" * 65)
    shards, _ = job(PROCESS, tenant="T" * 64)
    ns = job_manifests(shards, CTX)[0]
    assert ns["metadata"]["annotations"][names.TENANT_ID] == "T" * 64
    assert names.is_label_value(ns["metadata"]["labels"][names.TENANT])
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_labels_name_tenant_work_epoch_and_the_manager() -> None:
    for obj in rendered("ddp"):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "resontech-dispatcher"
        assert {names.TENANT, names.WORK, names.EPOCH} <= set(labels)
        assert all(key.startswith(("resontech.io/", "app.kubernetes.io/", "pod-security.")) for key in labels)


# Quota, limits and the network


def test_the_quota_is_what_was_placed_with_room_for_each_pods_replacement() -> None:
    spec = {**PROCESS, "shards": 3, "resources": {"cpus": 1.5, "memory_mb": 3000}}
    objects = job_manifests(job(spec)[0], CTX)
    hard = named(objects, "ResourceQuota", "work-quota")["spec"]["hard"]
    assert hard == {
        "pods": "6",
        "requests.cpu": "9000m",
        "limits.cpu": "9000m",
        "requests.memory": "18000Mi",
        "limits.memory": "18000Mi",
        "requests.nvidia.com/gpu": "0",
        "services": "0",
        "services.nodeports": "0",
        "services.loadbalancers": "0",
        "persistentvolumeclaims": "0",
    }
    limits = named(objects, "LimitRange", "work-limits")["spec"]["limits"]
    assert limits[0]["max"] == {"cpu": "1500m", "memory": "3000Mi"}
    for pod in pod_specs(objects):
        [main] = pod["containers"]
        assert (
            main["resources"]["requests"]
            == main["resources"]["limits"]
            == {"cpu": "1500m", "memory": "3000Mi"}
        )
        [fetcher] = pod["initContainers"]
        assert fetcher["resources"]["limits"] == {"cpu": "250m", "memory": "256Mi"}


def _peers(objects: list[Manifest]) -> dict[str, Manifest]:
    return {p["metadata"]["name"]: p["spec"] for p in of_kind(objects, "NetworkPolicy")}


def test_a_job_may_reach_its_own_pods_dns_and_the_object_store_only() -> None:
    policies = _peers(rendered("ddp"))
    assert set(policies) == {"default-deny", "allow-dns", "allow-object-store", "allow-same-namespace"}
    deny = policies["default-deny"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}
    dns = policies["allow-dns"]["egress"][0]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    store = policies["allow-object-store"]["egress"][0]
    assert store == {
        "to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}],
        "ports": [{"protocol": "TCP", "port": 9000}],
    }
    same = policies["allow-same-namespace"]
    assert same["ingress"] == [{"from": [{"podSelector": {}}]}] and same["egress"] == [
        {"to": [{"podSelector": {}}]}
    ]


def test_a_replica_takes_requests_from_the_gateway_alone() -> None:
    policies = _peers(rendered("endpoint-gpu"))
    assert set(policies) == {"default-deny", "allow-dns", "allow-object-store", "allow-gateway"}
    rule = policies["allow-gateway"]["ingress"][0]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "resontech"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "resontech-gateway"}},
        }
    ]
    outside = RenderContext(gateway_cidr="203.0.113.5/32", hub_cidrs=("198.51.100.0/24",))
    policies = _peers(render_endpoint(endpoint(GPU_ENDPOINT), outside))
    assert policies["allow-gateway"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "203.0.113.5/32"}}]
    assert policies["allow-model-hub"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "198.51.100.0/24"}}]


# Hardening and inputs


@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_is_hardened_and_holds_no_credential(kind: str) -> None:
    objects = rendered(kind)
    for pod in pod_specs(objects):
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
        assert not (pod["hostNetwork"] or pod["hostPID"] or pod["hostIPC"])
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65534
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert {next(k for k in v if k != "name") for v in pod["volumes"]} <= {"emptyDir", "secret"}
        for container in pod["initContainers"] + pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
            assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        mounting = [
            c["name"]
            for c in pod["initContainers"] + pod["containers"]
            if any(m["name"] == "inputs" for m in c["volumeMounts"])
        ]
        assert mounting in ([], ["fetch-inputs"]), "only the fetcher sees the presigned URLs"
    text = json.dumps([o for o in objects if o["kind"] != "Secret"])
    assert "X-Amz-Signature" not in text, "presigned URLs live in the inputs Secret only"
    assert not re.search(r"(?i)aws_secret|access_key|secret_key|AWS_", json.dumps(objects))


# What a hostile tenant sends


def _shape(obj: Any) -> Any:
    """``obj`` without the fields that carry a tenant's values (argv, env, Secret contents)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items() if k not in ("command", "env", "stringData")}
    if isinstance(obj, list):
        return [_shape(v) for v in obj]
    return obj


HOSTILE_VALUES = [
    "$(HOME)",
    "$(RESONTECH_ASSIGNMENT_ID)",
    "$$(X)",
    "x\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: kube-system",
    "'; rm -rf / #",
    '{"privileged": true}',
    "\x00\x1b[2J",
]


def test_nothing_a_tenant_sends_changes_a_name_label_policy_or_security_context() -> None:
    benign = job_manifests(job({**DDP, "env": {"MODE": "fast"}})[0], CTX)
    hostile_env = {"MODE": HOSTILE_VALUES[3], "LD_PRELOAD": HOSTILE_VALUES[0], "RESONTECH_SLOT": "7"}
    command = ["scripts/train.py", *HOSTILE_VALUES]
    hostile = job_manifests(job({**DDP, "env": hostile_env, "command": command})[0], CTX)
    assert _shape(hostile) == _shape(benign)
    validate(hostile)
    for j in of_kind(hostile, "Job"):
        main = j["spec"]["template"]["spec"]["containers"][0]
        env = env_of(main)
        assert env["RESONTECH_SLOT"] in ("0", "1"), "a RESONTECH_ name is the kernel's"
        assert env["LD_PRELOAD"] == "$$(HOME)" and env["MODE"] == HOSTILE_VALUES[3].replace("$", "$$")
        assert main["command"][-len(HOSTILE_VALUES) :] == [v.replace("$", "$$") for v in HOSTILE_VALUES]
    again = list(yaml.safe_load_all(to_yaml(hostile)))
    assert again == hostile, "the YAML holds exactly the objects: no document a value could add"


@pytest.mark.parametrize("name", ["A=B", "1ST", "a b", "$(X)", "", "x" * 129, "ÉNV", "A\nB"])
def test_an_env_name_that_is_not_an_identifier_is_refused(name: str) -> None:
    [d] = job({**PROCESS, "shards": 1})[0]
    bad = msgspec.structs.replace(d.command, spec=msgspec.structs.replace(d.command.spec, env={name: "v"}))
    with pytest.raises(ManifestError, match="env name"):
        job_manifests([Dispatch(bad, d.node)], CTX)


def _with(d: Dispatch, node: str | None = None, **changes: Any) -> Dispatch:
    spec = msgspec.structs.replace(d.command.spec, **changes)
    return Dispatch(msgspec.structs.replace(d.command, spec=spec), node or d.node)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": "evil; rm -rf /"}, "image"),
        ({"image": "img\nkind: Secret"}, "image"),
        ({"image": "--privileged"}, "image"),
        ({"downloads": {"../../etc/passwd": "http://x"}}, "relative path"),
        ({"downloads": {"/etc/passwd": "http://x"}}, "relative path"),
        ({"command": []}, "needs a command"),
        ({"runtime": "hostexec"}, "runtime"),
    ],
)
def test_a_hostile_job_spec_is_refused_with_the_field(change: dict[str, Any], message: str) -> None:
    [d] = job({**PROCESS, "shards": 1})[0]
    with pytest.raises(ManifestError, match=message):
        job_manifests([_with(d, **change)], CTX)


def test_hostile_sites_models_and_nodes_are_refused() -> None:
    shards, server = job(FEDERATED)
    site = _with(shards[0], options={**shards[0].command.spec.options, "site": "x uid=site-2"})
    with pytest.raises(ManifestError, match="site"):
        job_manifests([site, shards[1]], CTX, fl_server=server)
    with pytest.raises(ManifestError, match="node"):
        job_manifests([_with(shards[0], node="node a; x"), shards[1]], CTX)
    [replica] = endpoint(GPU_ENDPOINT)
    flag = _with(replica, options={**replica.command.spec.options, "model": "--trust-remote-code"})
    with pytest.raises(ManifestError, match="model"):
        render_endpoint([flag])
    quiet = _with(replica, options={**replica.command.spec.options, "served_name": "$(VLLM_API_KEY)"})
    [engine] = of_kind(render_endpoint([quiet]), "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert "$$(VLLM_API_KEY)" in engine["command"] and "$(VLLM_API_KEY)" not in engine["command"]


def test_an_image_the_work_names_is_used_when_it_is_an_image_reference() -> None:
    [d] = job({**PROCESS, "shards": 1})[0]
    image = "registry.example:5000/team/trainer:v1.2@sha256:" + "a" * 64
    [main] = of_kind(job_manifests([_with(d, image=image)], CTX), "Job")[0]["spec"]["template"]["spec"][
        "containers"
    ]
    assert main["image"] == image


def test_commands_of_other_work_or_a_second_assignment_of_a_slot_are_refused() -> None:
    a, _ = job(PROCESS)
    b, _ = job({**PROCESS, "job_id": "other"})
    with pytest.raises(ManifestError, match="is not of job"):
        job_manifests([a[0], b[1]], CTX)
    with pytest.raises(ManifestError, match="slot"):
        job_manifests([a[0], a[0]], CTX)
    with pytest.raises(ManifestError, match="no job assignment"):
        job_manifests([], CTX)
    with pytest.raises(ManifestError, match="key"):
        endpoint_manifests(endpoint(GPU_ENDPOINT), CTX, api_keys={})
    foreign = StartWork(
        tenant="acme",
        work_id="e",
        work_kind="endpoint",
        assignment_id="e-s0-e1",
        slot=0,
        epoch=1,
        spec=WorkSpec(runtime="process", command=["x"]),
    )
    with pytest.raises(ManifestError, match="runtime"):
        endpoint_manifests([Dispatch(foreign)], CTX, api_keys={"e-s0-e1": KEY})


# The fetcher


def test_the_fetcher_makes_the_folders_fetches_unpacks_and_refuses_escapes(tmp_path: Path) -> None:
    work, source = tmp_path / "work", tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print(1)")
    with zipfile.ZipFile(source / "kit.zip", "w") as zf:
        zf.writestr("startup/fed_client.json", "{}")
    entries = [
        {"path": "scripts/train.py", "url": (source / "train.py").as_uri()},
        {"path": "startup-kit.zip", "url": (source / "kit.zip").as_uri(), "unpack": "kit"},
    ]
    (tmp_path / "downloads.json").write_text(json.dumps(entries))
    assert fetch_main([str(work), str(tmp_path / "downloads.json")]) == 0
    assert (work / "scripts/train.py").read_text() == "print(1)"
    assert (work / "kit/startup/fed_client.json").exists() and not (work / "startup-kit.zip").exists()
    assert all((work / d).is_dir() for d in ("data", "checkpoints", "tmp"))
    with zipfile.ZipFile(source / "slip.zip", "w") as zf:
        zf.writestr("../../outside.txt", "x")
    (tmp_path / "slip.json").write_text(
        json.dumps([{"path": "s.zip", "url": (source / "slip.zip").as_uri(), "unpack": "k"}])
    )
    with pytest.raises(SystemExit, match="relative path"):
        fetch_main([str(work), str(tmp_path / "slip.json")])
    assert not (tmp_path / "outside.txt").exists()


# resontech dispatcher render


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ops.cli", "dispatcher", "render", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_render_prints_valid_manifests_for_every_example_spec() -> None:
    examples = sorted(REPO.glob("examples/*/job*.yaml")) + sorted(REPO.glob("examples/inference/*.yaml"))
    assert len(examples) >= 5
    for path in examples:
        done = _render(str(path.relative_to(REPO)), "--object-store", "http://10.1.2.3:9000")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("# rendered by `resontech dispatcher render")
        objects = list(yaml.safe_load_all(done.stdout))
        validate(objects)
        policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
        assert policies["allow-object-store"]["spec"]["egress"][0]["to"] == [
            {"ipBlock": {"cidr": "10.1.2.3/32"}}
        ]


def test_render_says_what_is_wrong_with_a_bad_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "unknown.yaml").write_text("name: x\nkind: process\ncommand: [a]\nprivileged: true\n")
    (tmp_path / "neither.yaml").write_text("name: x\n")
    cases = {
        "missing.yaml": "no spec file",
        "broken.yaml": "is not valid yaml",
        "list.yaml": "must hold a mapping",
        "unknown.yaml": "privileged",
        "neither.yaml": "neither a job spec",
    }
    for name, message in cases.items():
        done = _render(str(tmp_path / name))
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
