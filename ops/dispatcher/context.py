"""What the operator decides about a cluster, which the rendered objects need and the kernel's work
commands do not carry: images, where the object store and the gateway are, DNS, the cluster domain,
sizes of scratch space. One frozen :class:`RenderContext` per dispatcher, read once at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DOCUMENTATION_ADDRESS = "192.0.2.10/32"
"""The default object store address: TEST-NET-1, which routes nowhere. An operator who forgets to set
the real one gets pods that cannot fetch, never a policy that allows more than it should."""


@dataclass(frozen=True)
class RenderContext:
    """The operator's settings of one cluster (defaults in brackets).

    Attributes:
        default_image: the image of work whose spec names none, and of the kernel's own containers (the
            input fetcher, the FL server and clients, the CPU engine): Python 3 with this project, NVFlare
            and torch installed.
        vllm_image: the image of vLLM replicas on GPUs (the official ``vllm/vllm-openai``).
        vllm_cpu_image: the image of vLLM replicas on CPU nodes (a vLLM-CPU build).
        python: the interpreter in those images.
        namespace_prefix: every namespace the dispatcher makes starts with it [``rt``].
        object_store_cidr / object_store_port: where presigned URLs point: the only address outside
            the namespace a job's pods may reach [:data:`DOCUMENTATION_ADDRESS`, 9000].
        gateway_namespace / gateway_labels: the pods that may call a replica (the gateway's proxy);
            ``gateway_cidr`` instead when the gateway runs outside the cluster.
        kernel_namespace / kernel_labels: the kernel's federation service, which alone may reach an FL
            server's admin port.
        dns_namespace / dns_labels: the cluster DNS pods (port 53, UDP and TCP).
        hub_cidrs: addresses a replica serving a hub model may fetch it from (port 443); empty: none,
            so a hub model must be in the image or the endpoint must serve a workspace model.
        cluster_domain: the cluster's DNS domain [``cluster.local``].
        gpu_resource: the extended resource GPUs are scheduled as [``nvidia.com/gpu``].
        run_as_user: the uid and gid of every container [65534, ``nobody``, as the agent's sandbox].
        runtime_class: a RuntimeClass for every pod (``gvisor``, ``kata``), or none.
        work_mb / tmp_mb: the size limits of the working dir (an emptyDir on disk) and of ``/tmp``
            (in memory, counted in the container's memory, as the sandbox's 1 GiB tmpfs).
        replica_memory_mb: memory of a replica, whose work command names none [16384].
        fl_server_cpus / fl_server_memory_mb: the FL server pod's share of a federated job's quota.
        fetcher_cpus / fetcher_memory_mb: the input fetcher (an init container).
        engine_port / fl_port: where a replica's engine and an FL server listen.
        federation_cidr: where the kernel's federation service runs FL servers, when a federated job's
            server is the kernel's rather than a pod in its namespace: its clients may reach that
            address on their server's port. Unset: they may not (the server must be in the namespace).
    """

    default_image: str = "ghcr.io/resontech/resontech:latest"
    vllm_image: str = "docker.io/vllm/vllm-openai:v0.11.0"
    vllm_cpu_image: str = "ghcr.io/resontech/vllm-cpu:latest"
    python: str = "python3"
    namespace_prefix: str = "rt"
    object_store_cidr: str = DOCUMENTATION_ADDRESS
    object_store_port: int = 9000
    gateway_namespace: str = "resontech"
    gateway_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "resontech-gateway"}
    )
    gateway_cidr: str | None = None
    kernel_namespace: str = "resontech"
    kernel_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "resontech-federation"}
    )
    dns_namespace: str = "kube-system"
    dns_labels: dict[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    hub_cidrs: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    gpu_resource: str = "nvidia.com/gpu"
    run_as_user: int = 65534
    runtime_class: str | None = None
    work_mb: int = 51200
    tmp_mb: int = 1024
    replica_memory_mb: int = 16384
    fl_server_cpus: float = 1.0
    fl_server_memory_mb: int = 2048
    fetcher_cpus: float = 0.25
    fetcher_memory_mb: int = 256
    engine_port: int = 8000
    fl_port: int = 8002
    federation_cidr: str | None = None

    def service_host(self, service: str, namespace: str) -> str:
        """The cluster DNS name of ``service`` in ``namespace``."""
        return f"{service}.{namespace}.svc.{self.cluster_domain}"
