"""A fake of the Kubernetes API as the dispatcher's rounds and verifications use it
(:class:`~ops.dispatcher.rounds.ClusterPort`): it keeps what is applied, and the test is its kubelet (it
makes pods from the applied controllers' templates and writes their logs). For pure unit tests; the
process-level tests use the emulator of :mod:`tests.support.kube`."""

from __future__ import annotations

from core.errors import NotFound
from ops.dispatcher.cluster import LOG_TAIL_BYTES, ClusterRefused, ClusterUnreachable, Json, Namespace
from ops.dispatcher.context import RenderContext
from ops.dispatcher.endpoints import replica_name
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.podstate import PodState, pod_state
from ops.dispatcher.reporting import WORKLOAD_CONTAINER
from ops.dispatcher.shards import job_name
from schemas.commands import StartWork

CTX = RenderContext()
NODE_PORT = 30123
"""The node port the fake gives every Service it stores."""
K8S = "1.36"
"""The Kubernetes release the rendered objects are validated against: the newest kubernetes-validate
ships (a test in ``tests/ops/dispatcher/test_manifests.py`` checks it)."""
Key = tuple[str, str, str | None, str]
"""``(apiVersion, kind, namespace, name)`` of an object in the fake cluster."""


def namespace_of(cmd: StartWork) -> str:
    return work_namespace(cmd.tenant, cmd.work_id, cmd.work_kind, CTX)


def controller_of(cmd: StartWork) -> Key:
    if cmd.work_kind == "job":
        return "batch/v1", "Job", namespace_of(cmd), job_name(cmd.epoch, cmd.slot)
    return "apps/v1", "Deployment", namespace_of(cmd), replica_name(cmd)


class FakeCluster:
    """The cluster as the rounds use it: applied objects by key; pods and logs as the test puts them.

    Like the API server, it gives a Service a node port when it is created. ``failure`` is raised by
    every apply while set.
    """

    def __init__(self) -> None:
        self.stored: dict[Key, Json] = {}
        self.pod_list: list[PodState] = []
        self.logs: dict[tuple[str, str], str] = {}
        self.failure: Exception | None = None
        self.deleted: list[str] = []
        """``Kind namespace/name`` (``Namespace name``) of every deletion asked, in order."""
        self.applies = 0
        self.partial = 0
        """With a number, the next apply stores that many objects, then is refused."""
        self.unreadable: set[str] = set()
        """Pods (``namespace/name``) whose log read fails as a dead kubelet's does."""
        self.log_reads: list[str] = []

    async def apply(self, manifests: list[Json]) -> object:
        self.applies += 1
        if self.failure is not None:
            raise self.failure
        if self.partial:
            manifests, self.partial = manifests[: self.partial], 0
            await self.apply(manifests)
            raise ClusterRefused("exceeded quota: work-quota", status=403, reason="Forbidden")
        for m in manifests:
            meta = m["metadata"]
            if m["kind"] == "Service":
                m["spec"]["ports"][0]["nodePort"] = NODE_PORT
            self.stored[(m["apiVersion"], m["kind"], meta.get("namespace"), meta["name"])] = m
        return [m["metadata"]["name"] for m in manifests]

    async def delete_namespace(self, name: str) -> bool:
        self.deleted.append(f"Namespace {name}")
        gone = [k for k in self.stored if k[2] == name or (k[1], k[3]) == ("Namespace", name)]
        for key in gone:
            del self.stored[key]
        self.pod_list = [p for p in self.pod_list if p.namespace != name]
        return bool(gone)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.deleted.append(f"{kind} {namespace}/{name}")
        return self.stored.pop((api_version, kind, namespace, name), None) is not None

    async def namespaces(self, label_selector: str) -> list[Namespace]:
        return [
            Namespace(name, m["metadata"]["labels"], m["metadata"]["annotations"], terminating=False)
            for (_, kind, _, name), m in self.stored.items()
            if kind == "Namespace"
        ]

    async def objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Json]:
        return [
            m
            for (v, k, ns, _), m in self.stored.items()
            if (v, k) == (api_version, kind) and namespace in (None, ns)
        ]

    async def pods(self, namespace: str | None, label_selector: str = "") -> list[PodState]:
        return [p for p in self.pod_list if namespace in (None, p.namespace)]

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
        """As the API server serves it: from the first line of ``since``'s second, else the last
        ``tail_lines``, else the start; at most :data:`LOG_TAIL_BYTES` of it."""
        self.log_reads.append(f"{namespace}/{pod}")
        if f"{namespace}/{pod}" in self.unreadable:
            raise ClusterUnreachable(f"log of pod {namespace}/{pod}: 504 Timeout: the kubelet did not answer")
        if (namespace, pod) not in self.logs:
            raise NotFound(f"no pod {namespace}/{pod}")
        lines = self.logs[(namespace, pod)].splitlines(keepends=True)
        if since:
            lines = [line for line in lines if line[:19] >= since[:19]]
        elif tail_lines:
            lines = lines[-tail_lines:]
        return "".join(lines).encode()[:LOG_TAIL_BYTES].decode(errors="replace")

    def run_pod(self, cmd: StartWork, phase: str, state: Json, *, ready: bool = False, log: str = "") -> None:
        """Be the kubelet: the pod of ``cmd``'s controller, from its template, in ``phase``."""
        api_version, kind, ns, name = controller_of(cmd)
        template = self.stored[(api_version, kind, ns, name)]["spec"]["template"]
        pod = pod_state(
            {
                "metadata": {
                    "namespace": ns,
                    "name": f"{name}-pod",
                    "labels": template["metadata"]["labels"],
                },
                "spec": {"nodeName": "gpu-a"},
                "status": {
                    "phase": phase,
                    "startTime": "2026-11-24T14:00:00Z",
                    "containerStatuses": [
                        {"name": WORKLOAD_CONTAINER[cmd.work_kind], "state": state, "ready": ready}
                    ],
                },
            }
        )
        self.pod_list = [p for p in self.pod_list if (p.namespace, p.name) != (ns, pod.name)] + [pod]
        self.logs[(pod.namespace, pod.name)] = log
