"""The hardened pod every workload runs in, and the parts of it that carry what a tenant sent.

Every pod: non-root (uid :attr:`RenderContext.run_as_user`), no privilege escalation, every capability
dropped, seccomp ``RuntimeDefault``, a read-only root filesystem with two writable emptyDirs (the
working dir ``/work`` and ``/tmp`` in memory), no service account token, no service links, no host
network, PID, IPC or path. Inputs arrive through presigned URLs only: an init container (the fetcher,
:mod:`ops.dispatcher.fetch`) reads them from a Secret mounted into it alone, fetches them into
``/work`` and exits; the workload sees files, never the URLs, and there is no object-store credential
anywhere in the namespace.

What a tenant sends reaches a pod only as values: argv elements (never a shell), env values, file
contents. Kubernetes expands ``$(NAME)`` in a container's command, args and env values, so every ``$``
of a tenant's string is doubled (``$$`` is a literal ``$``), and so is every ``$`` of the
dispatcher's own values: nothing expands. Env names must be C identifiers; an image must be a
plain image reference.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ops.dispatcher.context import RenderContext
from ops.dispatcher.names import ManifestError, is_label_value
from ops.dispatcher.policies import PodSize, mebibytes, millicores
from schemas.commands import StartWork, WorkSpec
from schemas.values import IMAGE_PATTERN, MAX_IMAGE_LENGTH

Manifest = dict[str, Any]
WORKDIR = PurePosixPath("/work")
INPUTS_DIR = "/var/run/resontech/inputs"
DOWNLOADS_FILE = "downloads.json"
UPLOADS_DIR = "/var/run/resontech/uploads"
UPLOADS_FILE = "urls.json"
"""The checkpoint upload URLs of a shard (``[[object key, URL], ...]``), mounted in its container only."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_IMAGE = re.compile(IMAGE_PATTERN)


def escape(value: str) -> str:
    """``value`` as a literal for a container's command, args or env value: no ``$(NAME)`` in it
    expands (Kubernetes reads ``$$`` as ``$``)."""
    return value.replace("$", "$$")


def image_of(spec: WorkSpec, default: str) -> str:
    """The image the work names (:attr:`WorkSpec.image`), else ``default``.

    Raises:
        ManifestError: the image is not a plain image reference (the gateway refuses such a spec;
            this guards the dispatcher's own configuration and events older than that check).
    """
    image = spec.image or default
    if len(image) > MAX_IMAGE_LENGTH or not _IMAGE.match(image):
        raise ManifestError(f"image {image[:80]!r} is not an image reference (registry/name:tag[@digest])")
    return image


def env_list(env: Mapping[str, str]) -> list[Manifest]:
    """``env`` as a container's ``env``, every value escaped (no ``$(NAME)`` in it expands).

    Raises:
        ManifestError: a name that is not a C identifier (at most 128 characters).
    """
    for name in env:
        if not _ENV_NAME.match(name):
            raise ManifestError(f"env name {name[:80]!r} must be letters, digits and '_', not first a digit")
    return [{"name": k, "value": escape(v)} for k, v in env.items()]


def relative_path(name: str, what: str) -> str:
    """``name`` when it is a relative path inside the working dir (no ``..``, not absolute).

    Raises:
        ManifestError: it is not.
    """
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in name:
        raise ManifestError(f"{what} {name[:80]!r} must be a relative path inside the working dir")
    return name


def downloads_json(entries: Sequence[Mapping[str, str]]) -> str:
    """The fetcher's list: ``{"path", "url"}`` and, for an archive, ``"unpack"`` (a folder)."""
    for entry in entries:
        relative_path(entry["path"], "download target")
        if "unpack" in entry:
            relative_path(entry["unpack"], "unpack folder")
    return json.dumps(list(entries), indent=1, sort_keys=True)


def resources(size: PodSize, ctx: RenderContext) -> Manifest:
    """Requests equal to limits (a Guaranteed pod: it is evicted last and cannot burst)."""
    amounts = {"cpu": millicores(size.cpus), "memory": mebibytes(size.memory_mb)}
    if size.gpus:
        amounts[ctx.gpu_resource] = str(size.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def mounts(*, inputs: bool = False) -> list[Manifest]:
    found: list[Manifest] = [
        {"name": "work", "mountPath": str(WORKDIR)},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if inputs:
        found.append({"name": "inputs", "mountPath": INPUTS_DIR, "readOnly": True})
    return found


def volumes(
    ctx: RenderContext, inputs_secret: str | None, uploads_secret: str | None = None
) -> list[Manifest]:
    """The working dir and ``/tmp`` (emptyDirs), the Secret with the fetcher's presigned URLs, and the
    one with a shard's checkpoint upload URLs."""
    found: list[Manifest] = [
        {"name": "work", "emptyDir": {"sizeLimit": mebibytes(ctx.work_mb)}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": mebibytes(ctx.tmp_mb)}},
    ]
    for volume, secret_name in (("inputs", inputs_secret), ("uploads", uploads_secret)):
        if secret_name is not None:
            secret = {"secretName": secret_name, "defaultMode": 0o440}
            found.append({"name": volume, "secret": secret})
    return found


def fetcher(ctx: RenderContext, main: PodSize, *, has_inputs: bool) -> Manifest:
    """The init container that prepares ``/work`` (``data``, ``checkpoints``, ``tmp``) and fetches
    the inputs into it; never larger than the workload's own container (the quota holds the pod)."""
    size = PodSize(min(ctx.fetcher_cpus, main.cpus), min(ctx.fetcher_memory_mb, main.memory_mb))
    argv = [ctx.python, "-m", "ops.dispatcher.fetch", str(WORKDIR)]
    if has_inputs:
        argv.append(f"{INPUTS_DIR}/{DOWNLOADS_FILE}")
    return {
        "name": "fetch-inputs",
        "image": ctx.default_image,
        "command": argv,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": resources(size, ctx),
        "securityContext": container_security(),
        "volumeMounts": mounts(inputs=has_inputs),
    }


def main_container(
    name: str, image: str, argv: Sequence[str], env: list[Manifest], size: PodSize, ctx: RenderContext
) -> Manifest:
    """The workload's container: ``argv`` as the command (no shell), ``/work`` its working dir."""
    return {
        "name": name,
        "image": image,
        "command": list(argv),
        "workingDir": str(WORKDIR),
        "env": env,
        "resources": resources(size, ctx),
        "securityContext": container_security(),
        "volumeMounts": mounts(),
    }


def pod_spec(
    ctx: RenderContext,
    containers: list[Manifest],
    *,
    init: list[Manifest],
    inputs_secret: str | None,
    uploads_secret: str | None = None,
    restart: str,
    gpus: int,
    node: str | None = None,
    subdomain: str | None = None,
) -> Manifest:
    """A hardened pod (see the module docstring), on ``node`` (the kernel's choice) when given."""
    uid = ctx.run_as_user
    spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": init,
        "containers": containers,
        "volumes": volumes(ctx, inputs_secret, uploads_secret),
    }
    if node:
        if not is_label_value(node):
            raise ManifestError(f"node {node[:80]!r} is not a valid kubernetes.io/hostname label value")
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if gpus:
        spec["tolerations"] = [{"key": ctx.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
    if ctx.runtime_class:
        spec["runtimeClassName"] = ctx.runtime_class
    if subdomain:
        spec["subdomain"] = subdomain
    return spec


def inputs_secret(
    name: str, ns: str, labels: dict[str, str], entries: Sequence[Mapping[str, str]]
) -> Manifest:
    """The fetcher's presigned URLs (they grant an hour's read of the tenant's objects: a Secret, not
    a ConfigMap), immutable."""
    return _url_secret(name, ns, labels, DOWNLOADS_FILE, downloads_json(entries))


def uploads_secret(name: str, ns: str, labels: dict[str, str], urls: Mapping[str, str]) -> Manifest:
    """A shard's checkpoint upload URLs, in the order they are used (presigned PUTs of its own
    checkpoint keys), for the supervisor (:mod:`ops.dispatcher.supervise`), immutable."""
    return _url_secret(
        name, ns, labels, UPLOADS_FILE, json.dumps([[k, u] for k, u in urls.items()], indent=1)
    )


def _url_secret(name: str, ns: str, labels: dict[str, str], file: str, text: str) -> Manifest:
    """An immutable Secret holding one file of presigned URLs."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "type": "Opaque",
        "immutable": True,
        "stringData": {file: text},
    }


@dataclass(frozen=True)
class Dispatch:
    """One assignment to run: the kernel's ``start_work`` and the node it was placed on.

    Attributes:
        command: what the coordinator sent (its spec: runtime, argv, env, presigned downloads, sizes).
        node: the Kubernetes node of the worker the kernel chose (``None``: the scheduler picks within
            the quota, as ``render`` does).
    """

    command: StartWork
    node: str | None = None


def pod_size(spec: WorkSpec, memory_default_mb: int) -> PodSize:
    """What the workload's container may use: the assignment's CPUs, memory (or ``memory_default_mb``
    when it names none) and GPUs."""
    return PodSize(spec.cpus, spec.memory_mb or memory_default_mb, spec.gpus)
