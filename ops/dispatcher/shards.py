"""A job's shards as Indexed Jobs, torchrun's headless Service, and a federated job's FL server.

**One pod per shard, in an Indexed Job** (``completionMode: Indexed``, ``backoffLimit: 0``: a failed
pod fails its Job, and the kernel decides what follows: it re-places a lost or failed shard at a new
epoch, a DDP gang whole, from the last checkpoint; Kubernetes restarting a shard by itself would run
it behind the kernel's back, unmetered and at a stale epoch). The shards of one placement share one
Indexed Job (``shards-e<epoch>``) when they differ only by what the completion index gives: the slot,
the assignment id (``<work>-s<slot>-e<epoch>``) and torchrun's node rank, all ``$(RESONTECH_SHARD_INDEX)``
(the ``process`` shards and a DDP gang). Shards that differ in more each get an Indexed Job of one
completion (``shard-<slot>-e<epoch>``): a federated job's sites (each has its own NVFlare identity,
startup kit and data shard) and any shard the kernel re-placed alone.

**torchrun** meets through the headless Service ``ranks``: every shard pod sets ``subdomain: ranks``
and so resolves as ``<job>-<index>.ranks.<namespace>.svc.<domain>``; node 0's name is the master
address (the kernel's own address of shard 0's worker means nothing inside the cluster). The master
port is the kernel's (:mod:`core.rendezvous`); in a namespace of its own a job never meets another's.

**The FL server** of a federated job is a Pod (``fl-server``) with a Service of the same name in the
job's namespace: its startup kit comes through a presigned URL like the clients', and the kernel must
provision the federation with :func:`fl_server_host` as the server's name, which the clients dial and
its certificate names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from core.flare import KIT_FILE, ORG
from core.workenv import workload_env
from ops.dispatcher import pods
from ops.dispatcher.context import RenderContext
from ops.dispatcher.names import EPOCH, ROLE, SLOT, ManifestError
from ops.dispatcher.pods import INDEX_REF, WORKDIR, Dispatch, escape
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
    """One shard's container and inputs, as rendered (with the index's references or literally)."""

    container: Manifest
    downloads: list[dict[str, str]]
    size: PodSize


def fl_server_host(namespace: str, ctx: RenderContext) -> str:
    """The FL server's DNS name: the server name a federation on this cluster is provisioned with."""
    return ctx.service_host(FL_SERVER, namespace)


def job_name(epoch: int, slot: int | None = None) -> str:
    """The Indexed Job of one placement's shards (``slot``: of one shard alone)."""
    return f"shards-e{epoch}" if slot is None else f"shard-{slot}-e{epoch}"


def master_host(namespace: str, job: str, ctx: RenderContext) -> str:
    """Node 0's DNS name: index 0 of ``job`` under the headless Service."""
    return f"{job}-0.{ctx.service_host(RANKS, namespace)}"


def _identity(cmd: StartWork, indexed: bool) -> dict[str, str]:
    """The values that differ by shard: the index's references, or the shard's own."""
    if not indexed:
        return {}
    return {
        "RESONTECH_ASSIGNMENT_ID": f"{escape(cmd.work_id)}-s{INDEX_REF}-e{cmd.epoch}",
        "RESONTECH_SLOT": INDEX_REF,
    }


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


def _argv_and_env(
    cmd: StartWork, ctx: RenderContext, master: str, indexed: bool
) -> tuple[list[str], dict[str, str]]:
    """The argv (escaped) and the runtime's own env of one shard."""
    spec, own = cmd.spec, _identity(cmd, indexed)
    if spec.runtime == "process":
        if not spec.command:
            raise ManifestError("a process shard needs a command")
        return [escape(a) for a in spec.command], own
    if spec.runtime == "torchrun":
        rdzv = spec.rendezvous
        if rdzv is None or not spec.command:
            raise ManifestError("a torchrun shard needs a command and a rendezvous")
        script = pods.relative_path(spec.command[0], "training script")
        argv = [
            ctx.python, "-m", "torch.distributed.run",
            "--nnodes", str(rdzv.nnodes), "--node-rank", INDEX_REF if indexed else str(rdzv.node_rank),
            "--nproc-per-node", str(rdzv.nproc_per_node),
            "--master-addr", master, "--master-port", str(rdzv.master_port),
            "--rdzv-conf", f"timeout={rdzv.timeout_s}", "--max-restarts", "0",
            escape(str(WORKDIR / script)), *(escape(a) for a in spec.command[1:]),
        ]  # fmt: skip
        extra = {
            "RESONTECH_DDP_BACKEND": rdzv.backend,
            "OMP_NUM_THREADS": str(max(1, int(spec.cpus // rdzv.nproc_per_node))),
        }
        if spec.resume_url and spec.resume_from:
            extra["RESONTECH_RESUME_PATH"] = escape(
                str(WORKDIR / "resume" / PurePosixPath(spec.resume_from).name)
            )
        return argv, {**own, **extra}
    if spec.runtime == "nvflare-client":
        site = spec.options.get("site", "")
        if not _SITE.match(site) or KIT_FILE not in spec.downloads:
            raise ManifestError(f"an nvflare-client shard needs a site name and its {KIT_FILE}")
        argv = [
            ctx.python, "-u", "-m", "nvflare.private.fed.app.client.client_train",
            "-m", str(WORKDIR / "kit"), "-s", "fed_client.json",
            "--set", "secure_train=true", f"uid={site}", f"org={ORG}", "config_folder=config",
        ]  # fmt: skip
        extra = {
            "RESONTECH_SITE": site,
            "RESONTECH_ROUNDS": escape(spec.options.get("rounds", "")),
            "RESONTECH_LOCAL_EPOCHS": escape(spec.options.get("local_epochs", "1")),
        }
        return argv, {**own, **extra}
    raise ManifestError(f"runtime {spec.runtime!r} is not a job shard's (process, torchrun, nvflare-client)")


def shard_pod(cmd: StartWork, ctx: RenderContext, master: str, *, indexed: bool) -> ShardPod:
    """The container of one shard: with ``indexed``, what differs by shard refers to the index."""
    size = pods.pod_size(cmd.spec, 1024)
    argv, own = _argv_and_env(cmd, ctx, master, indexed)
    env = workload_env(cmd, WORKDIR, gpu_indices=list(range(cmd.spec.gpus)))
    env.update(own)
    image = pods.image_of(cmd.spec.options, ctx.default_image)
    container = pods.main_container("shard", image, argv, pods.env_list(env, refs=own), size, ctx)
    return ShardPod(container, _fetches(cmd), size)


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


def indexed_job(
    name: str,
    ns: str,
    labels: dict[str, str],
    shard: ShardPod,
    ctx: RenderContext,
    *,
    completions: int,
    nodes: Sequence[str],
    slot: int | None,
    subdomain: str | None,
) -> list[Manifest]:
    """One Indexed Job (and the Secret of its inputs, if it has any)."""
    pod_labels = {**labels, ROLE: "shard"} | ({SLOT: str(slot)} if slot is not None else {})
    secret = f"{name}-inputs" if shard.downloads else None
    init = [pods.fetcher(ctx, shard.size, has_inputs=secret is not None)]
    spec = pods.pod_spec(
        ctx, [shard.container], init=init, inputs_secret=secret, restart="Never", gpus=shard.size.gpus,
        nodes=nodes, spread={**labels, ROLE: "shard"}, subdomain=subdomain,
    )  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, ns, pod_labels, {}),
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": pod_labels}, "spec": spec},
        },
    }
    if secret is None:
        return [job]
    return [pods.inputs_secret(secret, ns, labels, shard.downloads), job]


def _folds(dispatches: Sequence[Dispatch], pods_: list[ShardPod]) -> bool:
    cmds = [d.command for d in dispatches]
    canonical = all(
        c.slot == i and c.epoch == cmds[0].epoch and c.assignment_id == f"{c.work_id}-s{c.slot}-e{c.epoch}"
        for i, c in enumerate(cmds)
    )
    shapes = {json.dumps([p.container, p.downloads], sort_keys=True) for p in pods_}
    return canonical and len(shapes) == 1


def shard_jobs(
    dispatches: Sequence[Dispatch], ns: str, labels: dict[str, str], ctx: RenderContext
) -> tuple[list[Manifest], list[PodSize]]:
    """The Indexed Jobs of a job's current assignments (all of one epoch or not), their Secrets and
    the headless Service when they run torchrun; and the size of every pod, for the quota."""
    ordered = sorted(dispatches, key=lambda d: (d.command.epoch, d.command.slot))
    torchrun = any(d.command.spec.runtime == "torchrun" for d in ordered)
    subdomain = RANKS if torchrun else None
    epoch = ordered[0].command.epoch
    folded_master = master_host(ns, job_name(epoch), ctx)
    candidates = [shard_pod(d.command, ctx, folded_master, indexed=True) for d in ordered]
    nodes = [d.node for d in ordered if d.node]
    if len(ordered) > 1 and _folds(ordered, candidates):
        objects = indexed_job(
            job_name(epoch),
            ns,
            labels,
            candidates[0],
            ctx,
            completions=len(ordered),
            nodes=nodes,
            slot=None,
            subdomain=subdomain,
        )
    else:
        objects = []
        zero = next((d.command for d in ordered if d.command.slot == 0), ordered[0].command)
        master = master_host(ns, job_name(zero.epoch, zero.slot), ctx)
        for d in ordered:
            cmd = d.command
            shard = shard_pod(cmd, ctx, master, indexed=False)
            job_labels = {**labels, EPOCH: str(cmd.epoch)}
            objects += indexed_job(
                job_name(cmd.epoch, cmd.slot),
                ns,
                job_labels,
                shard,
                ctx,
                completions=1,
                nodes=[d.node] if d.node else [],
                slot=cmd.slot,
                subdomain=subdomain,
            )
    if torchrun:
        rdzv = ordered[0].command.spec.rendezvous
        objects.insert(0, headless_service(ns, labels, rdzv.master_port if rdzv else 29500))
    return objects, [p.size for p in candidates]


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
