"""``resontech dispatcher render SPEC``: the Kubernetes objects the dispatcher would apply for a job or
an endpoint spec (the YAML, TOML or JSON ``resontech submit`` and ``deploy`` send), as multi-document
YAML, for operators and reviewers to read and to pipe to ``kubectl apply --dry-run=server -f -``.

It shows the real thing for a synthetic placement: the spec is decoded with the API's own request
types (unknown fields refused), made into the kernel's ``job.submitted`` or ``endpoint.deployed``, placed
on synthetic workers (one node per shard or replica, ``node-0``...), and given to the coordinator's
own functions (:func:`ops.coordinator.starts.start_command`, :func:`~ops.coordinator.workspecs.ddp_spec`,
:func:`~ops.coordinator.workspecs.federated_spec`, :func:`ops.coordinator.replicas.start_command`), whose
``start_work`` commands :mod:`ops.dispatcher.manifests` renders. What is synthetic: the ids (the spec's
``job_id``/``endpoint_id`` or one made from its name), the nodes, the federation's sites and kits, and the
presigned URLs (the coordinator's shape, with ``X-Amz-Signature=RENDERED``: nothing is signed, no object
store is asked, and a prefix input is shown as one object ``<prefix>EACH-OBJECT``, where the coordinator
lists the objects under it). A replica's key is made fresh, as the dispatcher makes one.

A bad file, or a spec the API would refuse, is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import msgspec
import yaml

from core.errors import ResontechError
from core.flare import KIT_BUCKET, kit_key, site_name
from core.placement.placing import assignment_id
from ops.coordinator.inputs import URL_TTL_S, Presigner
from ops.dispatcher.context import RenderContext
from ops.dispatcher.manifests import (
    Dispatch,
    FlServer,
    endpoint_manifests,
    fl_server_host,
    job_manifests,
    work_namespace,
)
from ops.specs import read_spec
from projections.admission import replica_gpus
from projections.endpoints import EndpointRecord, ReplicaRecord
from projections.registry import WorkerRecord
from projections.schedule import Federation, JobRecord
from schemas.api.endpoints import DeployEndpoint
from schemas.api.jobs import SubmitJob
from schemas.endpoints import EndpointDeployed
from schemas.jobs import JobSubmitted
from schemas.values import Assignment
from schemas.workers import WorkerRegistered

Manifest = dict[str, Any]


class RenderError(ResontechError):
    """A spec that cannot be rendered: the message names the file and what is wrong, in one line."""

    code = "render"


class RenderPresigner(Presigner):
    """The coordinator's presigner without credentials: URLs of the right shape, signed by nobody."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")

    def url(self, bucket: str, key: str, *, put: bool = False, ttl_s: int = URL_TTL_S) -> str:
        method = "PUT" if put else "GET"
        query = f"X-Amz-Expires={ttl_s}&X-Amz-Method={method}&X-Amz-Signature=RENDERED"
        return f"{self.endpoint}/{quote(bucket)}/{quote(key)}?{query}"


def _decode(raw: dict[str, Any], kind: type[Any], path: Path) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise RenderError(f"{path}: {exc}") from None


def _token(prefix: str, name: str) -> str:
    return f"{prefix}-{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"[:64]


def _worker(node: str) -> WorkerRecord:
    registration = WorkerRegistered(provider="render", hostname=node, address=node)
    return WorkerRecord(worker_id=f"w-{node}", registration=registration)


def _downloads(presigner: Presigner, bucket: str, keys: list[str]) -> dict[str, str]:
    named = [f"{k}EACH-OBJECT" if k.endswith("/") else k for k in keys]
    return {k: presigner.url(bucket, k) for k in dict.fromkeys(named)}


def job_commands(
    spec: SubmitJob, tenant: str, nodes: list[str], presigner: Presigner, ctx: RenderContext
) -> tuple[list[Dispatch], FlServer | None]:
    """The ``start_work`` of every shard of ``spec`` placed on ``nodes`` at epoch 1, as the coordinator
    sends them, and the FL server of a federated job."""
    from ops.coordinator.starts import start_command
    from ops.coordinator.workspecs import ddp_spec, federated_spec

    raw = msgspec.to_builtins(spec)
    if spec.federated is not None:
        raw["federated"]["script"] = spec.federated.script or ""
    submitted = msgspec.convert(raw, JobSubmitted)
    job_id = spec.job_id or _token("j", spec.name)
    placed = [nodes[slot % len(nodes)] for slot in range(spec.shards)]
    workers = {f"w-{n}": _worker(n) for n in placed}
    assignments = {
        str(slot): Assignment(
            assignment_id=assignment_id(job_id, slot, 1, tenant=tenant, kind="job"),
            worker_id=f"w-{node}",
            slot=slot,
            epoch=1,
            gpus=spec.resources.gpus,
        )
        for slot, node in enumerate(placed)
    }
    federation, server = None, None
    if spec.kind == "federated":
        ns = work_namespace(tenant, job_id, "job", ctx)
        sites = [site_name(slot) for slot in range(spec.shards)]
        federation = Federation(
            server=f"{fl_server_host(ns, ctx)}:{ctx.fl_port}",
            sites=sites,
            kit_bucket=KIT_BUCKET,
            kits=[kit_key(tenant, job_id, site) for site in sites],
            shards=[f"jobs/{spec.name}/shards/shard-{slot}.zip" for slot in range(spec.shards)],
        )
        server = FlServer(kit_url=presigner.url(KIT_BUCKET, kit_key(tenant, job_id, "server")))
    job = JobRecord(
        tenant=tenant,
        job_id=job_id,
        spec=submitted,
        state="placed",
        assignments=assignments,
        epoch=1,
        federation=federation,
    )
    inputs = [] if spec.kind == "federated" else list(submitted.inputs)
    dispatches = []
    for slot, node in enumerate(placed):
        assignment = assignments[str(slot)]
        downloads = _downloads(presigner, f"rt-{tenant}", inputs)
        command = start_command(job, assignment, "unverified", downloads)
        work = command.spec
        if spec.kind == "ddp":
            work = ddp_spec(job, assignment, command.spec, presigner, workers)
        elif spec.kind == "federated":
            work = federated_spec(job, assignment, command.spec, presigner) or work
        dispatches.append(Dispatch(msgspec.structs.replace(command, spec=work), node))
    return dispatches, server


def endpoint_commands(
    spec: DeployEndpoint, tenant: str, nodes: list[str], presigner: Presigner, replicas: int | None
) -> list[Dispatch]:
    """The ``start_work`` of the endpoint's first replicas (``replicas``, default its minimum, at least
    one) placed on ``nodes`` at epoch 1, as the coordinator sends them."""
    from ops.coordinator.replicas import start_command

    deployed = msgspec.convert(msgspec.to_builtins(spec), EndpointDeployed)
    endpoint_id = spec.endpoint_id or _token("e", spec.name)
    count = replicas if replicas is not None else max(1, spec.min_replicas)
    endpoint = EndpointRecord(tenant=tenant, endpoint_id=endpoint_id, spec=deployed, desired_replicas=count)
    gpus = replica_gpus(endpoint)
    downloads: dict[str, str] = {}
    if deployed.model_source == "workspace":
        prefix = deployed.model if deployed.model.endswith("/") else deployed.model.rsplit("/", 1)[0] + "/"
        keys = (
            [f"{prefix}config.json", f"{prefix}model.safetensors"]
            if deployed.model.endswith("/")
            else [deployed.model]
        )
        downloads = _downloads(presigner, f"rt-{tenant}", keys)
    dispatches = []
    for slot in range(count):
        node = nodes[slot % len(nodes)]
        replica = ReplicaRecord(
            assignment_id=assignment_id(endpoint_id, slot, 1, tenant=tenant, kind="endpoint"),
            worker_id=f"w-{node}",
            slot=slot,
            epoch=1,
            gpus=gpus,
        )
        dispatches.append(Dispatch(start_command(endpoint, replica, "unverified", downloads), node))
    return dispatches


def context_from(args: argparse.Namespace) -> RenderContext:
    """The render context of the command's options (defaults: :class:`RenderContext`'s)."""
    given: dict[str, Any] = {}
    if args.image:
        given["default_image"] = args.image
    if args.vllm_image:
        given["vllm_image"] = args.vllm_image
    store = urlsplit(args.object_store)
    if store.scheme not in ("http", "https") or not store.hostname:
        raise RenderError(f"--object-store {args.object_store!r} is not an http(s) URL")
    given["object_store_port"] = store.port or (443 if store.scheme == "https" else 80)
    cidr = args.object_store_cidr
    if cidr is None:
        try:
            cidr = f"{ipaddress.ip_address(store.hostname)}/32"
        except ValueError:
            cidr = None  # a host name: the operator names its address, else the default routes nowhere
    if cidr is not None:
        try:
            given["object_store_cidr"] = str(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise RenderError(f"--object-store-cidr: {exc}") from None
    if getattr(args, "federation_cidr", None):
        try:
            given["federation_cidr"] = str(ipaddress.ip_network(args.federation_cidr, strict=False))
        except ValueError as exc:
            raise RenderError(f"--federation-cidr: {exc}") from None
    return RenderContext(**given)


def render(path: Path, args: argparse.Namespace) -> list[Manifest]:
    """The manifests of the spec at ``path`` (see the module docstring)."""
    raw = read_spec(path)
    ctx = context_from(args)
    presigner = RenderPresigner(args.object_store)
    nodes = list(args.node or ["node-0", "node-1"])
    if "kind" in raw:
        job = _decode(raw, SubmitJob, path)
        dispatches, server = job_commands(job, args.tenant, nodes, presigner, ctx)
        return job_manifests(dispatches, ctx, fl_server=server)
    if "model" in raw:
        endpoint = _decode(raw, DeployEndpoint, path)
        replicas = endpoint_commands(endpoint, args.tenant, nodes, presigner, args.replicas)
        keys = {d.command.assignment_id: secrets.token_urlsafe(32) for d in replicas}
        return endpoint_manifests(replicas, ctx, api_keys=keys)
    raise RenderError(f"{path}: neither a job spec (it has no kind) nor an endpoint spec (no model)")


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # pyyaml ships no types here
    """Plain YAML: no anchors, multi-line strings as blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def to_yaml(manifests: list[Manifest], header: str = "") -> str:
    """Multi-document YAML of ``manifests``, keys in the order rendered, after ``header`` comments."""
    body: str = yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    return comments + body


def header(path: Path, manifests: list[Manifest]) -> str:
    kinds: dict[str, int] = {}
    for m in manifests:
        kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
    counted = ", ".join(f"{n} {k}" for k, n in kinds.items())
    return (
        f"rendered by `resontech dispatcher render {path}` for a synthetic placement\n"
        f"(nodes, ids and presigned URLs are made up; nothing was signed or applied): {counted}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``resontech dispatcher render``."""
    parser.add_argument("spec", help="a job or endpoint spec (YAML, TOML or JSON), as submit/deploy take")
    parser.add_argument("--tenant", default="acme", help="the tenant it is rendered for (default acme)")
    parser.add_argument("--node", action="append", help="a node to place on (repeat; default node-0, node-1)")
    parser.add_argument(
        "--replicas", type=int, help="an endpoint's replicas to render (default its minimum, 1+)"
    )
    add_context_arguments(parser)


def add_context_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's settings of a cluster (:func:`context_from`), for ``render`` and ``run``."""
    parser.add_argument(
        "--image", help="the default image (work whose spec names none, the kernel's containers)"
    )
    parser.add_argument("--vllm-image", help="the image of vLLM replicas on GPUs")
    parser.add_argument(
        "--object-store",
        default="http://192.0.2.10:9000",
        help="the object store's URL (presigned URLs point there)",
    )
    parser.add_argument(
        "--object-store-cidr", help="its address for the network policy (default: the URL's IP)"
    )
    parser.add_argument(
        "--federation-cidr", help="where the kernel's FL servers run (a federated job's clients dial it)"
    )


def command(args: argparse.Namespace) -> str:
    """What ``resontech dispatcher render`` prints: YAML documents, or with ``--json`` a ``v1`` List."""
    path = Path(args.spec)
    manifests = render(path, args)
    if getattr(args, "json", False):  # a v1 List, which kubectl takes as well
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}, indent=2) + "\n"
    return to_yaml(manifests, header(path, manifests))


__all__ = [
    "RenderError",
    "add_arguments",
    "add_context_arguments",
    "command",
    "context_from",
    "render",
    "to_yaml",
]
