"""A Kubernetes API server for tests: kmock 0.8, made to answer the dispatcher's conversation.

kmock (PyPI ``kmock``, by the author of kopf) is an aiohttp server. Here it runs in the test's own
event loop on a free loopback port; the official ``kubernetes`` client talks to it over real HTTP
from worker threads (its calls block: a test must run them with ``asyncio.to_thread``, never on the
loop that serves them). The fixture :func:`kube` yields a :class:`Kube`: the emulator (to inject
state and inspect ``objects``), its URL, an ``ApiClient`` for it and a kubeconfig file naming it.

What kmock 0.8's ``KubernetesEmulator`` does by itself (tried with kubernetes 36.0.3):

- namespaced objects of any resource (Job, Pod, Deployment, Service, NetworkPolicy, ResourceQuota,
  LimitRange...): create (409 on a duplicate name), get, list (in one namespace or across all),
  merge-patch (dicts merge recursively, lists are replaced whole, ``null`` removes a key), delete;
- cluster-scoped objects on a plain path (Node): the same, with ``/status`` patches merging into
  the object;
- watch streams of ``ADDED`` / ``MODIFIED`` / ``DELETED`` events (every existing object first, as
  ``ADDED``), but only for ``?watch=true``.

What it does not, and what this harness does instead:

- **Namespaces**: ``/api/v1/namespaces`` makes its path parser fail (500, and 404 for one
  namespace). :class:`ClusterEmulator` serves Namespace create, get, list, patch and delete itself,
  stored in kmock's ``objects`` under ``v1/namespaces``. Deleting one is what Kubernetes 1.36's
  namespace controller does (checked on a real control plane): its pods go first, as their kubelets
  confirm (:meth:`ClusterEmulator.settle`); everything else stays, and may be applied again, until
  the last pod is gone, then goes with the namespace (``DELETED`` events). Meanwhile the namespace is
  ``Terminating`` and refuses every create (403). No watch on namespaces.
- **Admission**, in the real server's order, before kmock stores anything: a create in a namespace
  that does not exist answers 404, in a terminating one 403, one beyond a ResourceQuota's ``pods`` or
  ``services`` 403 ``exceeded quota`` (pods not in a terminal phase count, terminating ones too), and
  only then a taken name 409. Quota on CPU, memory and GPUs, LimitRange and Pod Security are not
  admitted (manifests are checked with ``kubernetes-validate`` instead).
- **Server-side apply** (``PATCH`` with ``application/apply-patch+yaml``): a create when the object is
  missing (admitted as any create, answered 201), else a merge patch of the fields it names.
- **The garbage collector**: a Job or Deployment deleted takes the pods it owns (the harness marks
  them with :data:`OWNER`), which terminate like a namespace's.
- **Kubelets**: :meth:`Kube.kubelet_down` makes a node's kubelet stop answering: a log read through it
  hangs past the client's time-out (``hang``) or fails at once with the API server's 500
  (``refuse``), and its deleted pods stay terminating until :meth:`Kube.force_delete_pods`.
- **Label selectors** are ignored by kmock: the harness filters lists and watches by
  ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``; set-based forms answer 400).
- **watch=True**: the official client sends ``watch=True`` (the API server's ``ParseBool`` takes it),
  kmock only knows ``watch=true`` and answers a list instead; the harness lowercases it.
- **Unseen resources**: kmock lists a resource only once it holds an object of it (404 before);
  the harness declares the dispatcher's resources, so an empty namespace lists as empty.
- **Pod logs**: kmock answers ``/log`` with the pod's JSON. The harness serves text set with
  :meth:`Kube.set_log` as it is (no timestamps are added), honouring ``sinceTime`` (lines stamped
  before its second are left out), ``tailLines`` and ``limitBytes`` (404 when the pod does not exist).
- **Subresources**: a ``/status`` patch merges into the whole object, and so does a patch of the
  object itself, status included (a real server keeps the two apart). A create that a test's
  reaction refuses (``mock["post", ...] << kmock.KubernetesError(status=403)``) is stored anyway.
- Not emulated at all, so not tested here: controllers running by themselves (a test makes the pods
  a Job or Deployment controller would, with :meth:`Kube.run_controllers`, which a full quota or a
  terminating namespace refuses as it would a real controller), the scheduler, the node lifecycle
  controller's evictions, the quota controller's lag (a create refused by name after admission stays
  charged until its resync on a real server), server-set metadata (no uid, resourceVersion,
  creationTimestamp; a list's resourceVersion is ``"..."``), ``timeoutSeconds`` on watches,
  ``resourceVersion`` semantics and 410 Gone (a test injects an ``ERROR`` event with a reaction
  instead), PUT (replace: 404), ``deletecollection`` (404), strategic-merge semantics for lists,
  field selectors, NetworkPolicy enforcement, authentication and RBAC (any token passes).

State changes a test injects go through HTTP (``PATCH`` of ``/status``, as the kubelet and node
controller do), so watchers see them: :meth:`Kube.set_pod_phase`, :meth:`Kube.set_node_ready`.
Failures are reactions, which win over the emulator:
``kube.mock["get /api/v1/nodes"] << kmock.KubernetesError(status=500)``.

A test module uses the fixture with ``pytest_plugins = ("tests.support.kube",)``, importing :class:`Kube`
only under ``TYPE_CHECKING`` (imported earlier, this module would escape pytest's assert rewriting);
other test modules do not import the ``kubernetes`` client (kmock's own pytest plugin, with its
``kmock`` fixture, is loaded in every run by its entry point anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest
import yaml
from kubernetes import client

from ops.ports import free_port

NAMESPACES = kmock.resource("", "v1", "namespaces")
NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
JOBS = kmock.resource("batch", "v1", "jobs")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
QUOTAS = kmock.resource("", "v1", "resourcequotas")
OWNER = "harness.test/owner"
"""The annotation naming a pod's Job or Deployment (the harness's stand-in for ``ownerReferences``)."""
HANG_S = 8.0
"""How long a log read through a kubelet that hangs goes unanswered (then 504): longer than the
dispatcher's read timeout, short enough not to hold up a test's teardown."""
APPLIED = "X-Harness-Applied"
"""The header on a server-side apply the harness turned into a create or a merge patch."""
_GONE = "deletionTimestamp"
_NOW = "2026-01-01T00:00:00Z"
KNOWN_RESOURCES = {
    "v1/nodes": False,
    "v1/pods": True,
    "v1/services": True,
    "v1/secrets": True,
    "v1/resourcequotas": True,
    "v1/limitranges": True,
    "networking.k8s.io/v1/networkpolicies": True,
    "batch/v1/jobs": True,
    "apps/v1/deployments": True,
    "autoscaling/v2/horizontalpodautoscalers": True,
}
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+))?/?")
_STAMPED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_OBJECT_PATH = re.compile(r"/apis?/(?:([^/]+)/)?([^/]+)/namespaces/([^/]+)/([^/]+)/([^/]+)/?")
_SELECTOR_TERM = re.compile(r"(!?)([\w./-]+)(?:(==|=|!=)([\w.-]*))?")


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether ``labels`` satisfy an equality-based label selector (empty selects everything)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        match = _SELECTOR_TERM.fullmatch(term)
        if match is None:
            raise ValueError(f"label selector term not emulated: {term!r}")
        negated, key, op, value = match.groups()
        if op is None:
            ok = (key in labels) != bool(negated)
        elif negated:
            raise ValueError(f"label selector term not emulated: {term!r}")
        elif op == "!=":
            ok = labels.get(key) != value
        else:
            ok = labels.get(key) == value
        if not ok:
            return False
    return True


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def _going(resource: Any, obj: Any, kind: Any) -> bool:
    """Whether a stored object of ``resource`` is a ``kind`` whose deletion started (not gone yet)."""
    return bool(resource == kind and not obj.deleted and obj["metadata"].get(_GONE))


def _node(pod: Any) -> str:
    """The node a stored pod runs on (empty: none)."""
    return str((pod.raw.get("spec") or {}).get("nodeName") or "")


def _counted(obj: dict[str, Any]) -> bool:
    """Whether quota counts the object: a pod in a terminal phase is not counted."""
    return (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code}
    return aiohttp.web.json_response(body | {"reason": reason, "message": message}, status=code)


@attrs.frozen
class Refused(kmock.KubernetesError):
    """A refusal of the emulated API server (a ``Status`` with this code, reason and message)."""

    status: int = 403
    reason: str = "Forbidden"
    message: str = ""


QUOTA_COUNTS = {"pods": PODS, "services": SERVICES}
"""The object counts the emulated quota admission charges, by their ``hard`` key."""


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus namespaces, label selectors, ``watch=True``, pod logs, server-side
    apply, quota admission and a kubelet per node that may stop answering."""

    logs: dict[tuple[str, str], str] = attrs.field(factory=dict)
    namespace_calls: list[tuple[str, bool, str]] = attrs.field(factory=list)
    """Every request for namespaces (which kmock does not record): method, whether it named one, and
    its User-Agent."""
    dead_kubelets: dict[str, str] = attrs.field(factory=dict)
    """Nodes whose kubelet does not answer, and how a log read through it fails: ``hang`` (no answer
    until the client gives up) or ``refuse`` (the API server's 500 for a dial that failed)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock lists only resources it knows of: declared, or with an object stored. A real server
        # lists an empty namespace as empty, not 404.
        for resource, namespaced in KNOWN_RESOURCES.items():
            self.resources[resource].namespaced = namespaced

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.query.get("watch") in ("True", "1"):
            url = raw_request.rel_url.update_query(watch="true")
            raw_request = raw_request.clone(rel_url=url)
        match = _NAMESPACE_PATH.fullmatch(raw_request.path)
        if match is None:
            return await super().__call__(self._applied(raw_request))
        agent = raw_request.headers.get("User-Agent", "")
        self.namespace_calls.append((raw_request.method, bool(match.group(1)), agent))
        try:
            return await self._serve_namespace(raw_request, match.group(1))
        except ValueError as exc:
            return _status(400, "BadRequest", str(exc))

    def _applied(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.BaseRequest:
        """A server-side apply as kmock takes it: a create (POST to the collection) when the object
        is missing, else a merge patch (the fields it names are set; none is removed)."""
        found = _OBJECT_PATH.fullmatch(raw.path)
        if raw.method != "PATCH" or not raw.content_type.startswith("application/apply-patch") or not found:
            return raw
        group, version, namespace, plural, name = found.groups()
        headers = {**raw.headers, "Content-Type": "application/json", APPLIED: "server-side"}
        if self.has_object(kmock.resource(group or "", version, plural), namespace, name):
            return raw.clone(headers=headers | {"Content-Type": "application/merge-patch+json"})
        return raw.clone(method="POST", rel_url=raw.path.rsplit("/", 1)[0], headers=headers)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Admission before kmock stores anything: a create is checked against its namespace
        (missing: 404; terminating: 403) and its quota (403), before its name (409), as the real
        server orders them."""
        creating = request.resource not in (None, NAMESPACES) and request.action == kmock.action.CREATE
        if creating:
            self._admit(request)
        response = await super()._handle(request)
        if creating and response.status == 200 and not response.prepared:
            response.set_status(201)  # Created, as the real server says
        return response

    def has_object(self, resource: Any, namespace: str | None, name: str) -> bool:
        """Whether the server holds that object (not deleted)."""
        key = (resource, namespace, name)
        return key in self.objects and not self.objects[key].deleted

    def has_namespace(self, name: str) -> bool:
        """Whether the namespace exists (and is not deleted: it may be terminating)."""
        return self.has_object(NAMESPACES, None, name)

    def terminating(self, name: str) -> bool:
        """Whether the namespace's deletion started (it stays while pods in it still terminate)."""
        return self.has_namespace(name) and bool(self.objects[NAMESPACES, None, name]["metadata"].get(_GONE))

    def _admit(self, request: kmock.Request) -> None:
        namespace = request.namespace or (request.data or {}).get("metadata", {}).get("namespace")
        if not namespace or request.resource == NODES:
            return
        if not self.has_namespace(namespace):
            raise Refused(status=404, reason="NotFound", message=f'namespaces "{namespace}" not found')
        if self.terminating(namespace):
            message = f"unable to create new content in namespace {namespace} because it is being terminated"
            raise Refused(message=message)
        for key, resource in QUOTA_COUNTS.items():
            if request.resource == resource:
                self._charge(namespace, key, resource)

    def _charge(self, namespace: str, key: str, resource: Any) -> None:
        """Refuse one more ``resource`` object beyond a quota's ``hard[key]`` in ``namespace``: pods not
        in a terminal phase count, terminating ones too (the real evaluator drops those only after their
        grace period)."""
        used = sum(
            1
            for (r, ns, _), obj in self.objects.items()
            if r == resource and ns == namespace and not obj.deleted and _counted(obj.raw)
        )
        for (r, ns, name), quota in self.objects.items():
            if r != QUOTAS or ns != namespace or quota.deleted:
                continue
            hard = (quota.raw.get("spec") or {}).get("hard") or {}
            if key in hard and used + 1 > int(hard[key]):
                raise Refused(
                    message=f"{key} is forbidden: exceeded quota: {name}, requested: {key}=1, "
                    f"used: {key}={used}, limited: {key}={hard[key]}"
                )

    async def _serve_namespace(self, raw: aiohttp.web.BaseRequest, name: str | None) -> aiohttp.web.Response:
        body = await raw.json() if raw.can_read_body else None
        applying = raw.method == "PATCH" and raw.content_type.startswith("application/apply-patch")
        if (name is None and raw.method == "POST") or (applying and not self.has_namespace(name or "")):
            name = str(body["metadata"]["name"])
            if self.has_namespace(name):
                return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            self.objects[NAMESPACES, None, name] = body | {"status": {"phase": "Active"}}
            return aiohttp.web.json_response(self.objects[NAMESPACES, None, name].raw, status=201)
        if name is None and raw.method == "GET":
            if raw.query.get("watch"):
                return _status(501, "NotImplemented", "the harness does not watch namespaces")
            selector = raw.query.get("labelSelector", "")
            items = [
                obj.raw
                for (resource, _, _), obj in self.objects.items()
                if resource == NAMESPACES and not obj.deleted and selects(selector, _labels(obj.raw))
            ]
            return aiohttp.web.json_response({"kind": "NamespaceList", "items": items})
        if name is None or not self.has_namespace(name):
            return _status(404, "NotFound", f'namespaces "{name}" not found')
        key = (NAMESPACES, None, name)
        if raw.method == "PATCH":
            self.objects[key].patch(body)
        elif raw.method == "DELETE":
            return aiohttp.web.json_response(await self._delete_namespace(name))
        return aiohttp.web.json_response(self.objects[key].raw)

    async def _delete_namespace(self, name: str) -> dict[str, Any]:
        """Start deleting the namespace, as Kubernetes 1.36's namespace controller does: its pods first,
        which go as their kubelets confirm (:meth:`settle`); everything else stays, and may be applied
        again, until the last pod is gone. Meanwhile the namespace is ``Terminating`` and refuses every
        create."""
        async with self._lock:
            namespace_obj = self.objects[NAMESPACES, None, name]
            if not namespace_obj["metadata"].get(_GONE):
                namespace_obj.patch({"metadata": {_GONE: _NOW}, "status": {"phase": "Terminating"}})
            for (resource, namespace, _), obj in list(self.objects.items()):
                if resource == PODS and namespace == name and not obj.deleted:
                    await self._remove(resource, obj)
            last = dict(json.loads(json.dumps(namespace_obj.raw)))
        await self.settle()
        return last

    async def _remove(self, resource: Any, obj: Any) -> None:
        """Delete one object (a pod: mark it terminating; :meth:`settle` removes it). Under the lock."""
        if resource != PODS:
            await self._remove_now(resource, obj)
        elif not obj["metadata"].get(_GONE):
            obj.patch({"metadata": {_GONE: _NOW}})
            await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})

    async def settle(self) -> None:
        """What the kubelets and the namespace controller finish: a terminating pod whose node's
        kubelet answers (or that has no node) is removed; a terminating namespace with no pod left goes,
        with everything still in it."""
        async with self._lock:
            for (resource, _, _), obj in list(self.objects.items()):
                if _going(resource, obj, PODS) and _node(obj) not in self.dead_kubelets:
                    await self._remove_now(resource, obj)
            holding = {ns for (r, ns, _), o in self.objects.items() if r == PODS and not o.deleted}
            for (resource, _, name), obj in list(self.objects.items()):
                if _going(resource, obj, NAMESPACES) and name not in holding:
                    for (kind, namespace, _), held in list(self.objects.items()):
                        if namespace == name and not held.deleted:
                            await self._remove_now(kind, held)
                    obj.delete()

    async def _remove_now(self, resource: Any, obj: Any) -> None:
        """Delete one object at once, telling its watchers. Under the lock."""
        raw = obj.raw
        obj.delete()
        await self._buses[resource].put({"type": "DELETED", "object": raw})

    async def _serve_delete(self, request: kmock.Request) -> Any:
        """A Job or Deployment deleted takes its pods with it (the garbage collector's work, with the
        dispatcher's ``Background`` propagation); a pod deleted terminates first (:meth:`settle`)."""
        last = await super()._serve_delete(request)
        owner = request.name
        if request.resource in (JOBS, DEPLOYMENTS) and owner:
            async with self._lock:
                for (resource, ns, _), obj in list(self.objects.items()):
                    if resource != PODS or ns != request.namespace or obj.deleted:
                        continue
                    if (obj.raw["metadata"].get("annotations") or {}).get(OWNER) == owner:
                        await self._remove(PODS, obj)
            await self.settle()
        return last

    async def _serve_list(self, request: kmock.Request) -> Any:
        listing = await super()._serve_list(request)
        selector = request.params.get("labelSelector", "")
        listing["items"] = [item for item in listing["items"] if selects(selector, _labels(item))]
        return listing

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        selector = request.params.get("labelSelector", "")
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or selects(selector, _labels(event.get("object", {}))):
                yield event

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        pod = await super()._serve_fetch(request)
        if request.subresource != "log":
            return pod
        node = (pod.get("spec") or {}).get("nodeName", "")
        match self.dead_kubelets.get(node):
            case "hang":
                await asyncio.sleep(HANG_S)
                raise Refused(status=504, reason="Timeout", message=f"the kubelet of {node} did not answer")
            case "refuse":
                message = (
                    f'Get "https://{node}:10250/containerLogs/...": dial tcp: connect: connection refused'
                )
                raise Refused(status=500, reason="InternalError", message=message)
        lines = self.logs.get((request.namespace or "", request.name or ""), "").splitlines(keepends=True)
        if since := request.params.get("sinceTime", ""):  # the kubelet compares whole seconds
            lines = [line for line in lines if not _STAMPED.match(line) or line[:19] >= since[:19]]
        elif "tailLines" in request.params:
            lines = lines[len(lines) - int(request.params["tailLines"]) :]
        return "".join(lines).encode()[: int(request.params.get("limitBytes", 1 << 30))]


@dataclass(frozen=True)
class Kube:
    """A running emulator and the ways a test reaches it.

    Attributes:
        mock: the emulator: ``mock.objects[kmock.resource("batch", "v1", "jobs"), "ns", "name"]``
            is what the server holds.
        url: the server's base URL (``http://127.0.0.1:<port>``).
        api: an official-client ``ApiClient`` for it (blocking: use it from a thread).
        kubeconfig: a kubeconfig file naming the server (context ``kmock``, a dummy token).
    """

    mock: ClusterEmulator
    url: str
    api: client.ApiClient
    kubeconfig: Path

    async def add_node(self, name: str, *, labels: dict[str, str] | None = None, **status: Any) -> None:
        """Create a node as the kubelet would register it (``status`` goes in whole, ready if unsaid)."""
        status.setdefault("conditions", [{"type": "Ready", "status": "True"}])
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
        await self._call("POST", "/api/v1/nodes", body | {"spec": {}, "status": status})

    async def add_gpu_node(self, name: str, address: str, *, gpus: int = 1) -> None:
        """A Ready node with ``gpus`` A100s as GPU feature discovery labels them, at ``address``."""
        labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/cuda.driver.major": "550",
        }
        allocatable = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
        addresses = [{"type": "InternalIP", "address": address}]
        await self.add_node(name, labels=labels, allocatable=allocatable, addresses=addresses)

    async def cordon(self, name: str, *, on: bool = True) -> None:
        """``kubectl cordon`` (``on``) or ``uncordon`` a node: its ``spec.unschedulable``."""
        await self._call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": on}})

    async def set_node_ready(self, name: str, status: str) -> None:
        """Set a node's ``Ready`` condition (``True``, ``False``, ``Unknown``), as its controller does."""
        conditions = [{"type": "Ready", "status": status, "reason": "KubeletNotReady"}]
        await self._call("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": conditions}})

    async def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict[str, str],
        node: str = "",
        container: str = "main",
        owner: str = "",
        missing_ok: bool = False,
    ) -> bool:
        """Create a pending pod, as a Job or Deployment controller would (``owner``: its name; the pod
        goes when it is deleted). ``missing_ok``: as a controller, which makes nothing (and says False)
        when the namespace is gone or terminating or its quota is full, and tries again later."""
        meta = {"name": name, "namespace": namespace, "labels": labels, "annotations": {OWNER: owner}}
        spec = {"nodeName": node, "containers": [{"name": container, "image": "stand-in"}]}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        return await self._call(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            body | {"status": {"phase": "Pending"}},
            missing_ok=missing_ok,
        )

    async def set_pod_phase(
        self, namespace: str, name: str, phase: str, *, exit_code: int = 0, container: str = "main"
    ) -> None:
        """Move a pod to ``Running``, ``Succeeded`` or ``Failed``, with its container's state, as the
        kubelet reports it (``exit_code`` for a terminated container)."""
        at = "2026-01-01T00:00:00Z"
        if phase in ("Succeeded", "Failed"):
            state = {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}}
            state["terminated"] |= {"startedAt": at, "finishedAt": "2026-01-01T00:10:00Z"}
        else:
            state = {"running": {"startedAt": at}}
        reported = {"name": container, "ready": phase == "Running", "restartCount": 0, "state": state}
        status = {"phase": phase, "startTime": at, "containerStatuses": [reported]}
        await self._call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status})

    def forget_requests(self) -> None:
        """Drop kmock's record of the requests it served. kmock matches each new request against each
        of its reactions by walking that whole record, so a long run slows down in proportion to the
        requests served so far (the dispatcher benches' trial-to-trial growth). Benches call this as
        they go; tests, which are short and may read the requests, do not."""
        self.mock._requests.clear()

    async def run_controllers(self) -> list[tuple[str, str]]:
        """Make the pod of every Job and Deployment that has none (``<name>-pod``, Pending, on the node
        of its ``nodeSelector``, with its template's labels and first container's name), as the Job and
        ReplicaSet controllers and the scheduler would; returns the ``(namespace, pod)`` made. A pod the
        namespace refuses (terminating, quota full) is not made: a later call tries again."""
        made = []
        for (resource, ns, name), obj in list(self.mock.objects.items()):
            if resource not in (JOBS, DEPLOYMENTS) or obj.deleted or ns is None:
                continue
            if self.has(PODS, ns, f"{name}-pod"):
                continue
            template = obj.raw["spec"]["template"]
            node = template["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname", "")
            container = template["spec"]["containers"][0]["name"]
            labels = template["metadata"]["labels"]
            pod = f"{name}-pod"
            if await self.add_pod(
                ns, pod, labels=labels, node=node, container=container, owner=name, missing_ok=True
            ):
                made.append((ns, pod))
        await self._assign_node_ports()
        return made

    async def _assign_node_ports(self) -> None:
        """Give every NodePort Service without one a node port, as the API server does."""
        taken = {
            port.get("nodePort")
            for (resource, _, _), obj in self.mock.objects.items()
            if resource == SERVICES and not obj.deleted
            for port in obj.raw.get("spec", {}).get("ports", [])
        }
        for (resource, ns, name), obj in list(self.mock.objects.items()):
            if resource != SERVICES or obj.deleted or obj.raw.get("spec", {}).get("type") != "NodePort":
                continue
            spec = obj.raw["spec"]
            ports = spec.get("ports", [])
            if ports and "nodePort" not in ports[0]:
                port = next(p for p in range(30000, 32768) if p not in taken)
                taken.add(port)
                body = {"spec": {"ports": [ports[0] | {"nodePort": port}, *ports[1:]]}}
                await self._call("PATCH", f"/api/v1/namespaces/{ns}/services/{name}", body, missing_ok=True)

    def has(self, resource: Any, namespace: str | None, name: str) -> bool:
        """Whether the server holds that object (not deleted)."""
        return self.mock.has_object(resource, namespace, name)

    def names(self, resource: Any, namespace: str | None = None) -> list[str]:
        """The names of the objects of ``resource`` the server holds (in ``namespace``, if given)."""
        return sorted(
            name
            for (r, ns, name), obj in self.mock.objects.items()
            if r == resource and not obj.deleted and (namespace is None or ns == namespace)
        )

    def set_log(self, namespace: str, pod: str, text: str) -> None:
        """What ``GET .../pods/<pod>/log`` answers from now on."""
        self.mock.logs[namespace, pod] = text

    def kubelet_down(self, node: str, how: str = "hang") -> None:
        """The node's kubelet stops answering: a log read through it hangs (``hang``) or fails at once
        (``refuse``); a pod on it that is deleted stays terminating (:meth:`force_delete_pods`)."""
        self.mock.dead_kubelets[node] = how

    async def force_delete_pods(self, node: str) -> list[str]:
        """Remove the terminating pods of a node at once (``kubectl delete --force``, or the pod
        garbage collector once the node object is gone); returns their names."""
        gone = []
        async with self.mock._lock:
            for (resource, _, name), obj in list(self.mock.objects.items()):
                if _going(resource, obj, PODS) and _node(obj) == node:
                    obj.delete()
                    gone.append(name)
        await self.mock.settle()
        return gone

    async def _call(self, method: str, path: str, body: dict[str, Any], *, missing_ok: bool = False) -> bool:
        """One request to the emulator; False when ``missing_ok`` and it was refused (404 or 403)."""
        async with self.mock.request(method, path, json=body) as response:
            if missing_ok and response.status in (403, 404):
                return False
            assert response.status < 300, await response.text()
        return True


def write_kubeconfig(path: Path, url: str) -> Path:
    """Write a kubeconfig with one context, ``kmock``, for the server at ``url``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "dispatcher", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "dispatcher"}}],
        "current-context": "kmock",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[Kube]:
    """A fresh emulated Kubernetes API server on a free loopback port, for one test."""
    async with serving(tmp_path) as emulated:
        yield emulated


@contextlib.asynccontextmanager
async def serving(root: Path) -> AsyncIterator[Kube]:
    """An emulated Kubernetes API server on a free loopback port (its kubeconfig in ``root``) until
    the block ends: the fixture's, and ``ops.bench.dispatcher``'s."""
    async with ClusterEmulator() as mock, kmock.Server(mock, port=free_port()) as server:
        url = str(server.url).rstrip("/")
        configuration = client.Configuration()
        configuration.host = url
        api = client.ApiClient(configuration)
        try:
            yield Kube(mock=mock, url=url, api=api, kubeconfig=write_kubeconfig(root / "kubeconfig", url))
        finally:
            api.close()
