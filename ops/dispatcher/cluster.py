"""The dispatcher's conversation with one Kubernetes API server: exactly the calls it needs, typed.

Built on the official client's typed APIs (``CoreV1Api``, ``BatchV1Api``...), called with
``_preload_content=False`` so that every answer is the API server's own JSON (a dict), not the
client's models. Typed APIs build each URL from a fixed table (:data:`KINDS`), so they need no
discovery round-trip and behave the same against a real server and against kmock, whose discovery
serves only resources it has seen. ``DynamicClient`` needs that discovery; ``create_from_dict``
cannot patch on a conflict. The client blocks, so every call runs in a worker thread
(``asyncio.to_thread``) with a connect and read timeout, and every failure becomes a
:class:`~core.errors.ResontechError`: :class:`ClusterUnreachable` (no answer, a timeout, a 5xx: try
again later), :class:`ClusterRefused` (a 4xx: the request or the dispatcher's RBAC is wrong),
:class:`~core.errors.NotFound`.

Deleting a namespace is one call: the namespace controller deletes what it holds, pods included,
and the dispatcher does not delete the objects one by one as well. Doing so would repeat the
controller's work kind by kind and would still race the controllers that make pods. The test
harness (``tests/support/kube.py``) emulates that cascade, because kmock has no namespaces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config

from core.errors import ConfigError, InvalidInput, NotFound, ResontechError
from ops.dispatcher.podstate import PodState, pod_state

Json = dict[str, Any]
"""An object as the API server sends it (``metadata``, ``spec``, ``status``...)."""
TIMEOUT_S = (5.0, 30.0)
"""Connect and read timeouts of every call, in seconds."""
LOG_TAIL_BYTES = 64 * 1024
"""At most this much of a pod's log is read at once (the API server's `limitBytes`)."""
LOG_TIMEOUT_S = (3.0, 5.0)
"""Connect and read timeouts of a pod log read: the API server proxies it to the pod's kubelet, and a
dead node's kubelet may leave it hanging."""
FIELD_MANAGER = "resontech-dispatcher"
"""The field manager of the dispatcher's server-side applies."""
APPLY_PATCH = "application/apply-patch+yaml"
"""The content type of a server-side apply (the body is JSON, which is YAML)."""


class ClusterUnreachable(ResontechError):
    """The API server did not answer, timed out, or failed (5xx); retrying later may work."""

    code = "cluster_unreachable"


class ClusterRefused(ResontechError):
    """The API server refused a request (4xx): a bad manifest, or RBAC the dispatcher lacks.

    Attributes:
        status: the HTTP status (403: forbidden, 422: invalid, ...).
        reason: the ``reason`` of the server's ``Status`` (``Forbidden``, ``Invalid``...).
    """

    code = "cluster_refused"

    def __init__(self, message: str, *, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Kind:
    """How the typed client reaches one kind: its API class and the suffix of its methods."""

    api: type
    suffix: str
    namespaced: bool = True

    def method(self, api_client: client.ApiClient, verb: str, *, everywhere: bool = False) -> Any:
        """The client's method to ``verb`` (``create``, ``patch``, ``list``) objects of this kind,
        in one namespace, or ``everywhere`` (across namespaces: ``list`` only)."""
        api, scope = self.api(api_client), "namespaced_" if self.namespaced else ""
        if self.namespaced and everywhere:
            return getattr(api, f"{verb}_{self.suffix}_for_all_namespaces")
        return getattr(api, f"{verb}_{scope}{self.suffix}")


KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "Namespace"): Kind(client.CoreV1Api, "namespace", namespaced=False),
    ("v1", "ResourceQuota"): Kind(client.CoreV1Api, "resource_quota"),
    ("v1", "LimitRange"): Kind(client.CoreV1Api, "limit_range"),
    ("v1", "Service"): Kind(client.CoreV1Api, "service"),
    ("v1", "Secret"): Kind(client.CoreV1Api, "secret"),
    ("v1", "Pod"): Kind(client.CoreV1Api, "pod"),
    ("networking.k8s.io/v1", "NetworkPolicy"): Kind(client.NetworkingV1Api, "network_policy"),
    ("batch/v1", "Job"): Kind(client.BatchV1Api, "job"),
    ("apps/v1", "Deployment"): Kind(client.AppsV1Api, "deployment"),
}
"""The kinds :meth:`Cluster.apply` knows, by ``(apiVersion, kind)``: what the manifests hold (a Secret
holds presigned URLs or a replica's key, never the kernel's credentials). Nothing cluster-wide but
Namespace: no RBAC, no CRDs, nothing a job's objects could widen their reach with."""


@dataclass(frozen=True)
class Applied:
    """One object :meth:`Cluster.apply` wrote: ``created`` False when it existed and was patched."""

    kind: str
    namespace: str | None
    name: str
    created: bool


@dataclass(frozen=True)
class Namespace:
    """A namespace as listed: ``terminating`` once its deletion started (it may linger a while)."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    terminating: bool


@dataclass(frozen=True)
class Listing:
    """Objects listed at once, and the list's ``resourceVersion``."""

    items: list[Json]
    resource_version: str


def _error(exc: Exception, what: str) -> ResontechError:
    """The project's error for a failed call about ``what``."""
    if isinstance(exc, client.ApiException):
        status = int(exc.status or 0)
        try:
            body = json.loads(exc.body or "{}")
        except ValueError:
            body = {}
        reason = str(body.get("reason") or exc.reason or "")
        message = f"{what}: {status} {reason}: {body.get('message') or exc.reason}"
        if status == 404:
            return NotFound(message)
        if 400 <= status < 500:
            return ClusterRefused(message, status=status, reason=reason)
        return ClusterUnreachable(message)
    return ClusterUnreachable(f"{what}: {type(exc).__name__}: {exc}")


_FAILURES = (client.ApiException, urllib3.exceptions.HTTPError, OSError)


def _call(
    fn: Callable[..., Any], *args: Any, what: str, timeout: tuple[float, float] = TIMEOUT_S, **kwargs: Any
) -> Any:
    """Call one client method, blocking: the raw urllib3 response, or the project's error."""
    try:
        return fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    except _FAILURES as exc:
        raise _error(exc, what) from exc


def _json(response: Any) -> Json:
    data = json.loads(response.data or b"{}")
    if not isinstance(data, dict):
        raise ClusterUnreachable(f"the API server answered {type(data).__name__}, not an object")
    return data


def _order(manifests: list[Json]) -> list[Json]:
    """Namespaces first (what goes in them needs them), the rest in the order given."""
    return sorted(manifests, key=lambda m: m.get("kind") != "Namespace")


class Cluster:
    """One Kubernetes API server, as the dispatcher uses it. Every method is a coroutine that runs
    the blocking client in a thread; close it with :meth:`close`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._core = client.CoreV1Api(api)

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, *, context: str | None = None) -> Cluster:
        """A cluster from a kubeconfig file (default: ``$KUBECONFIG``, else ``~/.kube/config``) and
        one of its contexts (default: its current context).

        Raises:
            ConfigError: the file is missing or does not name a usable cluster.
        """
        configuration = client.Configuration()
        try:
            config.load_kube_config(
                config_file=str(path) if path else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (config.ConfigException, OSError, ValueError) as exc:
            raise ConfigError(f"kubeconfig {path or '(default)'}: {exc}") from exc
        return cls(client.ApiClient(_no_read_retries(configuration)))

    @classmethod
    def in_cluster(cls) -> Cluster:
        """A cluster from the service account of the pod this process runs in.

        Raises:
            ConfigError: not running in a pod (no service-account token or environment).
        """
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise ConfigError(f"in-cluster configuration: {exc}") from exc
        return cls(client.ApiClient(_no_read_retries(configuration)))

    def close(self) -> None:
        """Release the client's connections."""
        self.api.close()

    async def apply(self, manifests: list[Json]) -> list[Applied]:
        """Apply each object, Namespaces first, then in the order given, with server-side apply
        (field manager :data:`FIELD_MANAGER`, conflicts forced): one request that creates what is
        missing and updates what exists, so applying again after a crash or a refusal converges and
        never creates anything twice. A create is what quota admission charges: creating an object
        that exists in a namespace whose quota is full answers 403 before the name is checked, and a
        409 after admission would still be charged until the quota controller's resync. A changed
        immutable field (a Job's pod template) is refused (422): delete the object to start over.

        Raises:
            InvalidInput: a manifest of a kind not in :data:`KINDS`, with no name, or namespaced
                and without ``metadata.namespace`` (the dispatcher never relies on a default).
            NotFound: the namespace of an object does not exist (and was not in ``manifests``).
            ClusterRefused: the server refused one (the earlier ones stay: apply again).
            ClusterUnreachable: the server did not answer.
        """
        return [await asyncio.to_thread(self._apply_one, manifest) for manifest in _order(manifests)]

    def _apply_one(self, manifest: Json) -> Applied:
        kind = KINDS.get((str(manifest.get("apiVersion")), str(manifest.get("kind"))))
        meta = manifest.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        what = f"{manifest.get('kind')} {namespace}/{name}" if namespace else f"{manifest.get('kind')} {name}"
        if kind is None or not name or (kind.namespaced and not namespace):
            raise InvalidInput(f"cannot apply {what} ({manifest.get('apiVersion')}): unknown kind or no name")
        scope = (namespace,) if kind.namespaced else ()
        response = _call(
            kind.method(self.api, "patch"),
            name,
            *scope,
            manifest,
            what=f"apply {what}",
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )
        return Applied(str(manifest["kind"]), namespace, name, created=response.status == 201)

    async def delete_namespace(self, name: str) -> bool:
        """Delete a namespace and, through the namespace controller, everything in it.

        Returns:
            True when the deletion started (or was already under way), False when there was no
            such namespace: deleting twice is not an error.
        """
        options = client.V1DeleteOptions(propagation_policy="Background")
        try:
            await asyncio.to_thread(
                _call, self._core.delete_namespace, name, body=options, what=f"delete namespace {name}"
            )
        except NotFound:
            return False
        except ClusterRefused as exc:
            if exc.status != 409:  # 409: its deletion is already under way
                raise
        return True

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete one namespaced object of :data:`KINDS` (and, in the background, what it owns: a
        Job's pods); False when there was no such object.

        Raises:
            InvalidInput: a kind not in :data:`KINDS`, or not namespaced.
        """
        found = KINDS.get((api_version, kind))
        if found is None or not found.namespaced:
            raise InvalidInput(
                f"cannot delete {kind} ({api_version}): not a namespaced kind the dispatcher uses"
            )
        options = client.V1DeleteOptions(propagation_policy="Background")
        method = found.method(self.api, "delete")
        try:
            await asyncio.to_thread(
                _call, method, name, namespace, body=options, what=f"delete {kind} {namespace}/{name}"
            )
        except NotFound:
            return False
        return True

    async def namespaces(self, label_selector: str) -> list[Namespace]:
        """The namespaces whose labels match ``label_selector`` (e.g.
        ``app.kubernetes.io/managed-by=resontech-dispatcher``), terminating ones included."""
        listing = await self._list(self._core.list_namespace, "namespaces", label_selector=label_selector)
        return [_namespace(item) for item in listing.items]

    async def objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Json]:
        """The objects of one kind in :data:`KINDS` whose labels match, in ``namespace`` (``None``:
        in every namespace), as JSON: what reconciliation compares with the schedule.

        Raises:
            InvalidInput: a kind not in :data:`KINDS`.
        """
        found = KINDS.get((api_version, kind))
        if found is None:
            raise InvalidInput(f"cannot list {kind} ({api_version}): not a kind the dispatcher uses")
        everywhere = namespace is None or not found.namespaced
        scope = () if everywhere else (namespace,)
        method = found.method(self.api, "list", everywhere=everywhere)
        listing = await self._list(method, f"{kind} objects", *scope, label_selector=label_selector)
        return listing.items

    async def nodes(self) -> Listing:
        """Every node, as JSON (see :mod:`ops.dispatcher.nodes`), and the list's resourceVersion.

        Served from the API server's watch cache (``resourceVersion=0``): cheap enough to poll.
        """
        return await self._list(self._core.list_node, "nodes", resource_version="0")

    async def pods(self, namespace: str | None, label_selector: str = "") -> list[PodState]:
        """The pods of ``namespace`` (``None``: of every namespace) whose labels match."""
        return [pod_state(item) for item in await self.objects("v1", "Pod", namespace, label_selector)]

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str = "",
        *,
        since: str = "",
        tail_lines: int = 0,
        timestamps: bool = True,
    ) -> str:
        """A pod's log, at most :data:`LOG_TAIL_BYTES` of it, decoded leniently: from the first line
        stamped at or after ``since`` (an RFC 3339 time; the kubelet compares whole seconds), else the
        last ``tail_lines`` lines, else from the start; each line starting with the kubelet's RFC 3339
        time with ``timestamps``. Fewer bytes than the limit means the read reached the log's end.

        Raises:
            NotFound: no such pod (or container).
            ClusterUnreachable: no answer within :data:`LOG_TIMEOUT_S`, or a 5xx (a kubelet that
                does not answer: the API server proxies the read to it).
        """
        query: list[tuple[str, str]] = [("limitBytes", str(LOG_TAIL_BYTES))]
        query += [("timestamps", "true")] if timestamps else []
        query += [("container", container)] if container else []
        query += [("sinceTime", since)] if since else [("tailLines", str(tail_lines))] if tail_lines else []
        response = await asyncio.to_thread(
            _call,
            self.api.call_api,  # the typed method has no sinceTime, which the API server takes
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            {"namespace": namespace, "name": pod},
            query,
            {"Accept": "text/plain, */*"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            what=f"log of pod {namespace}/{pod}",
            timeout=LOG_TIMEOUT_S,
        )
        return bytes(response.data[:LOG_TAIL_BYTES]).decode("utf-8", errors="replace")

    async def _list(self, fn: Callable[..., Any], what: str, *args: Any, **kwargs: Any) -> Listing:
        response = await asyncio.to_thread(_call, fn, *args, what=f"list {what}", **kwargs)
        body = _json(response)
        items = [item for item in body.get("items") or [] if isinstance(item, dict)]
        return Listing(items, str((body.get("metadata") or {}).get("resourceVersion") or ""))


def _no_read_retries(configuration: client.Configuration) -> client.Configuration:
    """No second try of a request whose answer timed out: urllib3 would try a GET three more times,
    and a log read through a dead node's kubelet would hold its round four read time-outs long (the
    next round asks again anyway). A connection that fails is still tried again, twice."""
    configuration.retries = urllib3.Retry(total=2, read=0, redirect=0)
    return configuration


def _namespace(item: Json) -> Namespace:
    meta = item.get("metadata") or {}
    phase = (item.get("status") or {}).get("phase")
    return Namespace(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        terminating=phase == "Terminating" or bool(meta.get("deletionTimestamp")),
    )
