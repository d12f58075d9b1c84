"""A job's shards as Jobs, torchrun's headless Service, and a federated job's FL server.

**One Job of one pod per assignment** (``shard-<slot>-e<epoch>``), pinned to the node of the worker the
kernel chose (``nodeSelector: kubernetes.io/hostname``; see ``docs/dispatcher.md``: the kernel places,
meters and pays per worker, and an Indexed Job of N pods cannot pin index 0 to one node and index 1
to another). Each is ``completionMode: Indexed`` with one completion, which gives its pod the stable
host name ``<job>-0``, and ``backoffLimit: 0``: a failed pod fails its Job, and the kernel decides what
follows (it re-places a lost or failed shard at a new epoch, a DDP gang whole, from the last
checkpoint); Kubernetes restarting a shard by itself would run it behind the kernel's back, unmetered
and at a stale epoch. A shard's pods carry ``resontech.io/shard: <slot>``.

**torchrun** meets through the headless Service ``ranks``: every shard pod of a job sets ``subdomain:
ranks`` and so resolves as ``shard-<slot>-e<epoch>-0.ranks.<namespace>.svc.<domain>``; node 0's name
is the master address (the kernel's own address of shard 0's worker means nothing inside the
cluster), known from any shard's command alone (a gang shares its epoch). The master port is the
kernel's (:mod:`core.rendezvous`); in a namespace of its own a job never meets another's.

**The FL server** of a federated job is a Pod (``fl-server``) with a Service of the same name in the
job's namespace: its startup kit comes through a presigned URL like the clients', and the kernel must
provision the federation with :func:`fl_server_host` as the server's name, which the clients dial and
its certificate names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from core.flare import KIT_FILE, ORG
from core.rendezvous import rank_env
from core.workenv import CHECKPOINTS, workload_env
from ops.dispatcher import pods
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fetch import KERNEL_FOLDER, SUPERVISOR
from ops.dispatcher.names import ASSIGNMENT, ASSIGNMENT_ID, EPOCH, ROLE, SHARD, ManifestError, label_value
from ops.dispatcher.pods import WORKDIR, Dispatch, escape
from ops.dispatcher.policies import PodSize, metadata
from schemas.commands import StartWork

Manifest = dict[str, Any]
RANKS = "ranks"
FL_SERVER = "fl-server"
_SITE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class FlServer:
    """A federated job's FL server, as the kernel provisioned it.

    Attributes:
        kit_url: a presigned GET of the server's startup kit (a ZIP of its provisioned workspace).
    """

    kit_url: str


@dataclass(frozen=True)
class ShardPod:
    """One shard's container and inputs, as rendered."""

    container: Manifest
    downloads: list[dict[str, str]]
    size: PodSize
    uploads: dict[str, str]


def fl_server_host(namespace: str, ctx: RenderContext) -> str:
    """The FL server's DNS name: the server name a federation on this cluster is provisioned with."""
    return ctx.service_host(FL_SERVER, namespace)


def job_name(epoch: int, slot: int) -> str:
    """The Job of one shard's assignment."""
    return f"shard-{slot}-e{epoch}"


def master_host(namespace: str, epoch: int, ctx: RenderContext) -> str:
    """Node 0's DNS name at ``epoch``: the pod of shard 0's Job under the headless Service."""
    return f"{job_name(epoch, 0)}-0.{ctx.service_host(RANKS, namespace)}"


def _fetches(cmd: StartWork) -> list[dict[str, str]]:
    spec = cmd.spec
    if cmd.spec.runtime == "nvflare-client":
        shard = spec.options.get("shard", "")
        unpack = {KIT_FILE: "kit", shard: "data"}
        return [
            {"path": k, "url": u, **({"unpack": unpack[k]} if k in unpack else {})}
            for k, u in spec.downloads.items()
        ]
    entries = [{"path": k, "url": u} for k, u in spec.downloads.items()]
    if spec.runtime == "torchrun" and spec.resume_url and spec.resume_from:
        entries.append({"path": f"resume/{PurePosixPath(spec.resume_from).name}", "url": spec.resume_url})
    return entries


def _argv_and_env(cmd: StartWork, ctx: RenderContext, master: str) -> tuple[list[str], dict[str, str]]:
    """The argv (escaped) and the runtime's own env of one shard."""
    spec = cmd.spec
    if spec.runtime == "process":
        if not spec.command:
            raise ManifestError("a process shard needs a command")
        return [escape(a) for a in spec.command], {}
    if spec.runtime == "torchrun":
        rdzv = spec.rendezvous
        if rdzv is None or not spec.command:
            raise ManifestError("a torchrun shard needs a command and a rendezvous")
        script = pods.relative_path(spec.command[0], "training script")
        argv = [
            ctx.python, "-m", "torch.distributed.run",
            "--nnodes", str(rdzv.nnodes), "--node-rank", str(rdzv.node_rank),
            "--nproc-per-node", str(rdzv.nproc_per_node),
            "--master-addr", master, "--master-port", str(rdzv.master_port),
            "--rdzv-conf", f"timeout={rdzv.timeout_s}", "--max-restarts", "0",
            escape(str(WORKDIR / script)), *(escape(a) for a in spec.command[1:]),
        ]  # fmt: skip
        env = rank_env(spec, rdzv)
        if spec.resume_url and spec.resume_from:
            env["RESONTECH_RESUME_PATH"] = str(WORKDIR / "resume" / PurePosixPath(spec.resume_from).name)
        return argv, env
    if spec.runtime == "nvflare-client":
        site = spec.options.get("site", "")
        if not _SITE.match(site) or KIT_FILE not in spec.downloads:
            raise ManifestError(f"an nvflare-client shard needs a site name and its {KIT_FILE}")
        argv = [
            ctx.python, "-u", "-m", "nvflare.private.fed.app.client.client_train",
            "-m", str(WORKDIR / "kit"), "-s", "fed_client.json",
            "--set", "secure_train=true", f"uid={site}", f"org={ORG}", "config_folder=config",
        ]  # fmt: skip
        env = {
            "RESONTECH_SITE": site,
            "RESONTECH_ROUNDS": spec.options.get("rounds", ""),
            "RESONTECH_LOCAL_EPOCHS": spec.options.get("local_epochs", "1"),
        }
        return argv, env
    raise ManifestError(f"runtime {spec.runtime!r} is not a job shard's (process, torchrun, nvflare-client)")


def shard_pod(cmd: StartWork, ctx: RenderContext, master: str) -> ShardPod:
    """The container and inputs of one shard. A shard with checkpoint upload URLs (shard 0, whose rank
    0 writes the world's checkpoints) runs under the supervisor, which uploads the files its workload
    reports (:mod:`ops.dispatcher.supervise`)."""
    size = pods.pod_size(cmd.spec, 1024)
    argv, runtime_env = _argv_and_env(cmd, ctx, master)
    env = {**workload_env(cmd, WORKDIR, gpu_indices=list(range(cmd.spec.gpus))), **runtime_env}
    image = pods.image_of(cmd.spec, ctx.default_image)
    if cmd.spec.checkpoint_urls:
        supervisor = str(WORKDIR / KERNEL_FOLDER / SUPERVISOR)
        urls = f"{pods.UPLOADS_DIR}/{pods.UPLOADS_FILE}"
        argv = [ctx.python, supervisor, urls, str(WORKDIR / CHECKPOINTS), "--", *argv]
    container = pods.main_container("shard", image, argv, pods.env_list(env), size, ctx)
    if cmd.spec.checkpoint_urls:
        container["volumeMounts"].append({"name": "uploads", "mountPath": pods.UPLOADS_DIR, "readOnly": True})
    return ShardPod(container, _fetches(cmd), size, dict(cmd.spec.checkpoint_urls))


def headless_service(ns: str, labels: dict[str, str], port: int) -> Manifest:
    """``ranks``: DNS for every shard pod (not-ready ones too: a rank resolves before it serves)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(RANKS, ns, labels, {}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {ROLE: "shard"},
            "ports": [{"name": "rendezvous", "protocol": "TCP", "port": port, "targetPort": port}],
        },
    }


def shard_job(
    dispatch: Dispatch, ns: str, labels: dict[str, str], ctx: RenderContext
) -> tuple[list[Manifest], PodSize]:
    """One shard's Job (and the Secret of its inputs, if it has any), and its pod's size."""
    cmd = dispatch.command
    torchrun = cmd.spec.runtime == "torchrun"
    shard = shard_pod(cmd, ctx, master_host(ns, cmd.epoch, ctx))
    name = job_name(cmd.epoch, cmd.slot)
    own = {
        EPOCH: str(cmd.epoch),
        ROLE: "shard",
        SHARD: str(cmd.slot),
        ASSIGNMENT: label_value(cmd.assignment_id),
    }
    pod_labels = {**labels, **own}
    annotations = {ASSIGNMENT_ID: cmd.assignment_id}
    secret = f"{name}-inputs" if shard.downloads else None
    uploads = f"{name}-uploads" if shard.uploads else None
    init = [pods.fetcher(ctx, shard.size, has_inputs=secret is not None)]
    spec = pods.pod_spec(
        ctx,
        [shard.container],
        init=init,
        inputs_secret=secret,
        uploads_secret=uploads,
        restart="Never",
        gpus=shard.size.gpus,
        node=dispatch.node,
        subdomain=RANKS if torchrun else None,
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, ns, pod_labels, annotations),
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": spec},
        },
    }
    objects = [] if secret is None else [pods.inputs_secret(secret, ns, labels, shard.downloads)]
    if uploads is not None:
        objects.append(pods.uploads_secret(uploads, ns, labels, shard.uploads))
    return [*objects, job], shard.size


def shard_jobs(
    dispatches: Sequence[Dispatch], ns: str, labels: dict[str, str], ctx: RenderContext
) -> tuple[list[Manifest], list[PodSize]]:
    """The Jobs of a job's current assignments (of one epoch or several), their Secrets and, when they
    run torchrun, the headless Service; and the size of every pod, for the quota."""
    objects: list[Manifest] = []
    sizes: list[PodSize] = []
    for dispatch in sorted(dispatches, key=lambda d: d.command.slot):
        made, size = shard_job(dispatch, ns, labels, ctx)
        objects, sizes = [*objects, *made], [*sizes, size]
    rendezvous = [d.command.spec.rendezvous for d in dispatches if d.command.spec.rendezvous]
    if rendezvous:
        objects.insert(0, headless_service(ns, labels, rendezvous[0].master_port))
    return objects, sizes


def fl_server_objects(
    server: FlServer, ns: str, labels: dict[str, str], ctx: RenderContext
) -> tuple[list[Manifest], PodSize]:
    """The FL server's Pod, Service and inputs Secret; its size, for the quota."""
    size = PodSize(ctx.fl_server_cpus, ctx.fl_server_memory_mb)
    pod_labels = {**labels, ROLE: FL_SERVER}
    argv = [
        ctx.python, "-u", "-m", "nvflare.private.fed.app.server.server_train",
        "-m", str(WORKDIR / "server"), "-s", "fed_server.json",
        "--set", "secure_train=true", f"org={ORG}", "config_folder=config",
    ]  # fmt: skip
    env = {"HOME": str(WORKDIR), "TMPDIR": str(WORKDIR / "tmp"), "PYTHONUNBUFFERED": "1"}
    container = pods.main_container(FL_SERVER, ctx.default_image, argv, pods.env_list(env), size, ctx)
    container["ports"] = [{"name": "flare", "containerPort": ctx.fl_port, "protocol": "TCP"}]
    secret = f"{FL_SERVER}-inputs"
    init = [pods.fetcher(ctx, size, has_inputs=True)]
    spec = pods.pod_spec(ctx, [container], init=init, inputs_secret=secret, restart="Never", gpus=0)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(FL_SERVER, ns, pod_labels, {}),
        "spec": spec,
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(FL_SERVER, ns, labels, {}),
        "spec": {
            "type": "ClusterIP",
            "selector": {ROLE: FL_SERVER},
            "ports": [{"name": "flare", "protocol": "TCP", "port": ctx.fl_port, "targetPort": ctx.fl_port}],
        },
    }
    entries = [{"path": "server-kit.zip", "url": server.kit_url, "unpack": "server"}]
    return [pods.inputs_secret(secret, ns, labels, entries), pod, service], size
