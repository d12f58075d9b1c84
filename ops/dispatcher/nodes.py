"""A Kubernetes node, as its JSON comes from the API server, turned into a worker's facts. Pure.

The cluster belongs to a tenant or a provider, so a node's labels and status are claims: every
value read here is checked and bounded, and one that fails is left out with the reason in
:attr:`NodeWorker.problems`, never clamped into a plausible lie. A node that claims GPUs without a
valid model and memory (the NVIDIA GPU feature discovery labels ``nvidia.com/gpu.product`` and
``nvidia.com/gpu.memory``, in MiB) registers with none: such GPUs cannot be placed on or priced.
The model keeps the label's form (``NVIDIA-A100-SXM4-80GB``: a label value has no spaces), which
:func:`core.pricing.gpu_family` reads as NVML's ``NVIDIA A100-SXM4-80GB``. MIG resources
(``nvidia.com/mig-*``) are not read.

Liveness: a node is ready when its ``Ready`` condition is ``True``; ``False``, ``Unknown``, no
condition, or no node at all is lost. ``spec.unschedulable`` (``kubectl cordon``) is cordoned.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from core.errors import InvalidInput
from core.placement.rules import RUNS_IMAGES
from schemas.values import TOPOLOGY_LEVELS, TOPOLOGY_VALUE, Gpu, Pool
from schemas.workers import WorkerRegistered

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
HOSTNAME = "kubernetes.io/hostname"
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
CLIQUE = "nvidia.com/gpu.clique"
TOPOLOGY_LABEL = "topology.resontech.io/"
_TOPOLOGY = re.compile(TOPOLOGY_VALUE)

MAX_GPUS = 64
"""GPUs one node may claim (the largest nodes today have 8 to 16)."""
MAX_GPU_MEMORY_MB = 1 << 20
"""Memory one GPU may claim, in MiB (1 TiB; the largest GPUs today have under 300 GB)."""
MAX_CPUS = 4096
MAX_MEMORY_MB = 1 << 26
"""Memory one node may claim, in MiB (64 TiB)."""
MAX_QUANTITY_CHARS = 64

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d{1,3})?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_MODEL = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_. ()/+]{0,127}")
_MIB = re.compile(r"\d{1,9}")
_DRIVER = re.compile(r"\d{1,5}(\.\d{1,5}){0,3}")


def parse_quantity(text: object) -> Decimal:
    """A Kubernetes quantity (``4``, ``3500m``, ``16Gi``, ``16G``, ``1.5e3``) as an exact number.

    Raises:
        InvalidInput: not a quantity, or longer than :data:`MAX_QUANTITY_CHARS` characters.
    """
    match = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None or len(str(text)) > MAX_QUANTITY_CHARS:
        raise InvalidInput(f"not a Kubernetes quantity: {str(text)[:MAX_QUANTITY_CHARS]!r}")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    try:
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        return number.scaleb(exponent)
    except InvalidOperation as exc:  # pragma: no cover - the pattern bounds the exponent
        raise InvalidInput(f"not a Kubernetes quantity: {text!r}") from exc


@dataclass(frozen=True)
class NodeWorker:
    """What the kernel needs of a node to register it as a worker, and to keep it alive.

    Attributes:
        name: the node's name (``metadata.name``).
        hostname: its ``kubernetes.io/hostname`` label (what pods are pinned with), else its name.
        address: its ``InternalIP`` (where its replicas' node ports answer), else empty.
        gpus: its GPUs, index 0..n-1, each with the label's model and memory (free = total).
        cpus: whole CPUs allocatable to pods (``3500m`` is 3).
        memory_mb: memory allocatable to pods, in MiB.
        region: the ``topology.kubernetes.io/region`` label, or empty (shown, never registered: the
            registration takes the dispatcher's configured region).
        driver: the NVIDIA driver version from the feature discovery labels, or empty.
        labels: the zone and instance type, when the node has valid ones.
        topology: its network domains by level (:func:`topology_of`).
        ready: the ``Ready`` condition is ``True``.
        cordoned: ``spec.unschedulable`` is set.
        problems: each value left out, and why.
    """

    name: str
    hostname: str
    address: str
    gpus: tuple[Gpu, ...]
    cpus: int
    memory_mb: int
    region: str
    driver: str
    labels: dict[str, str]
    ready: bool
    cordoned: bool
    problems: tuple[str, ...]
    topology: dict[str, str] = field(default_factory=dict)


def topology_of(labels: Mapping[str, Any], problems: list[str]) -> dict[str, str]:
    """A node's network domains from its labels: ``nvidia.com/gpu.clique`` (the NVLink domain GPU
    feature discovery reads from NVML) as its clique, ``topology.kubernetes.io/zone`` as its zone,
    and ``topology.resontech.io/<level>`` for any level (:data:`schemas.values.TOPOLOGY_LEVELS`),
    which the cluster's operator sets (racks, blocks, switches). An invalid value is left out."""
    keys = {level: f"{TOPOLOGY_LABEL}{level}" for level in TOPOLOGY_LEVELS}
    keys["clique"] = CLIQUE  # the hardware's word, over any other
    if not labels.get(keys["zone"]):
        keys["zone"] = ZONE
    found = {level: _label(labels, key, _TOPOLOGY, problems) for level, key in keys.items()}
    return {level: name for level, name in found.items() if name}


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _label(labels: Mapping[str, Any], key: str, pattern: re.Pattern[str], problems: list[str]) -> str:
    value = labels.get(key)
    if value is None or value == "":
        return ""
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    problems.append(f"label {key}={str(value)[:80]!r} is not valid")
    return ""


def _count(allocatable: Mapping[str, Any], key: str, limit: int, scale: int, problems: list[str]) -> int:
    """``allocatable[key]`` in units of ``scale``, rounded down, or 0 (with a problem) when it is
    missing, not a quantity, negative, or above ``limit``."""
    raw = allocatable.get(key)
    if raw is None:
        return 0
    try:
        value = math.floor(parse_quantity(raw) / scale)
    except InvalidInput as exc:
        problems.append(f"allocatable {key}: {exc.message}")
        return 0
    if not 0 <= value <= limit:
        problems.append(f"allocatable {key}={str(raw)[:40]!r} is outside 0..{limit}")
        return 0
    return value


def _gpus(allocatable: Mapping[str, Any], labels: Mapping[str, Any], problems: list[str]) -> tuple[Gpu, ...]:
    count = _count(allocatable, GPU_RESOURCE, MAX_GPUS, 1, problems)
    if count == 0:
        return ()
    model = _label(labels, GPU_PRODUCT, _MODEL, problems)
    memory = _label(labels, GPU_MEMORY, _MIB, problems)
    memory_mb = int(memory) if memory else 0
    if not model or not 0 < memory_mb <= MAX_GPU_MEMORY_MB:
        problems.append(
            f"{count} GPUs left out: {GPU_PRODUCT} and {GPU_MEMORY} (1..{MAX_GPU_MEMORY_MB} MiB) "
            "must both be valid (is GPU feature discovery running?)"
        )
        return ()
    return tuple(
        Gpu(index=i, model=model, vram_total_mb=memory_mb, vram_free_mb=memory_mb) for i in range(count)
    )


def _driver(labels: Mapping[str, Any], problems: list[str]) -> str:
    full = _label(labels, DRIVER_FULL, _DRIVER, problems)
    parts = [str(labels.get(key, "")) for key in DRIVER_PARTS]
    joined = ".".join(part for part in parts if part)
    return full or (joined if _DRIVER.fullmatch(joined) else "")


def _internal_ip(addresses: object, problems: list[str]) -> str:
    """The node's first ``InternalIP`` that is an IP address."""
    for entry in addresses if isinstance(addresses, list) else []:
        if isinstance(entry, Mapping) and entry.get("type") == "InternalIP":
            try:
                return str(ipaddress.ip_address(str(entry.get("address"))))
            except ValueError:
                problems.append("status.addresses: an InternalIP that is not an IP address")
    return ""


def is_ready(node: Mapping[str, Any] | None) -> bool:
    """Whether a node (``None``: vanished) counts as alive: its ``Ready`` condition is ``True``."""
    if node is None:
        return False
    conditions = _dict(node.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def node_worker(node: Mapping[str, Any]) -> NodeWorker:
    """Read one node's JSON (as the API server sends it).

    Raises:
        InvalidInput: the node has no valid name (DNS subdomain), so it cannot be a worker.
    """
    meta, spec, status = (_dict(node.get(key)) for key in ("metadata", "spec", "status"))
    name, labels = meta.get("name"), _dict(meta.get("labels"))
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.fullmatch(name):
        raise InvalidInput(f"a node without a valid name: {str(name)[:80]!r}")
    problems: list[str] = []
    allocatable = _dict(status.get("allocatable"))
    hostname = _label(labels, HOSTNAME, _DNS_SUBDOMAIN, problems) or name
    extra = {"zone": _label(labels, ZONE, _LABEL_VALUE, problems)}
    extra["instance_type"] = _label(labels, INSTANCE_TYPE, _LABEL_VALUE, problems)
    return NodeWorker(
        name=name,
        hostname=hostname,
        address=_internal_ip(status.get("addresses"), problems),
        gpus=_gpus(allocatable, labels, problems),
        cpus=_count(allocatable, "cpu", MAX_CPUS, 1, problems),
        memory_mb=_count(allocatable, "memory", MAX_MEMORY_MB, 2**20, problems),
        region=_label(labels, REGION, _LABEL_VALUE, problems),
        driver=_driver(labels, problems),
        labels={key: value for key, value in extra.items() if value},
        topology=topology_of(labels, problems),
        ready=is_ready(node),
        cordoned=spec.get("unschedulable") is True,
        problems=tuple(problems),
    )


def registration(
    worker: NodeWorker, *, provider: str, pool: Pool, owner_tenant: str | None, version: str, region: str = ""
) -> WorkerRegistered:
    """The ``worker.registered`` event of a node: its facts, and the identity the dispatcher's
    configuration gives every node of its cluster (provider, pool, owner, region). The region is the
    configuration's, never the node's label: the enrollment names it (a node's labels are the
    cluster's claim, and data residency must not rest on them), and the intake refuses a registration
    that says otherwise. Its sandbox is ``kubernetes``: every workload is a hardened pod, so the node
    takes work that names its own container image (which no agent's host does)."""
    return WorkerRegistered(
        provider=provider,
        hostname=worker.hostname,
        region=region,
        pool=pool,
        owner_tenant=owner_tenant,
        gpus=list(worker.gpus),
        cpus=worker.cpus,
        memory_mb=worker.memory_mb,
        driver=worker.driver,
        agent_version=version,
        address=worker.address,
        labels={"kubernetes_node": worker.name, **worker.labels},
        sandbox=RUNS_IMAGES,
        topology=dict(worker.topology),
    )
