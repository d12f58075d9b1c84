"""A node's JSON -> a worker's facts (pure): quantities, GPU feature discovery labels, liveness, and
the bounds every claimed value must fit."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from core.errors import InvalidInput
from core.pricing import gpu_family
from ops.dispatcher.nodes import MAX_GPU_MEMORY_MB, is_ready, node_worker, parse_quantity, registration


def gpu_node(name: str = "gpu-a", **overrides: Any) -> dict[str, Any]:
    """A node as an API server sends it: 8 A100s labelled by GPU feature discovery, Ready."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": "eu-west-1a",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/cuda.driver.major": "550",
                "nvidia.com/cuda.driver.minor": "54",
                "nvidia.com/cuda.driver.rev": "15",
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "95500m", "memory": "1056Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
        },
    }
    for path, value in overrides.items():
        *parents, leaf = path.split("__")
        target = node
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = value
    return node


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", Decimal(4)),
        ("3500m", Decimal("3.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("16G", Decimal(16 * 10**9)),
        ("1.5Ki", Decimal(1536)),
        ("100M", Decimal(10**8)),
        ("1e3", Decimal(1000)),
        ("2E", Decimal(2 * 10**18)),
        ("250u", Decimal("0.00025")),
        ("0", Decimal(0)),
    ],
)
def test_quantities_parse_exactly(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "Gi", "4 Gi", "4gi", "1.2.3", "NaN", "Infinity", "1e9999", "9" * 65, 4, None]
)
def test_what_is_not_a_quantity_is_refused(text: object) -> None:
    with pytest.raises(InvalidInput):
        parse_quantity(text)


def test_a_gpu_node_becomes_a_worker_with_its_gpus_cpus_memory_and_driver() -> None:
    worker = node_worker(gpu_node())
    assert worker.name == worker.hostname == "gpu-a"
    assert [g.index for g in worker.gpus] == list(range(8))
    assert {(g.model, g.vram_total_mb, g.vram_free_mb) for g in worker.gpus} == {
        ("NVIDIA-A100-SXM4-80GB", 81920, 81920)
    }
    assert gpu_family(worker.gpus[0].model) == "A100"  # the label's dashes price like NVML's name
    assert (worker.cpus, worker.memory_mb) == (95, 1056 * 1024)
    assert (worker.region, worker.driver, worker.labels) == ("eu-west-1", "550.54.15", {"zone": "eu-west-1a"})
    assert worker.ready and not worker.cordoned and worker.problems == ()


def test_registration_carries_the_node_facts_and_the_dispatcher_identity() -> None:
    event = registration(
        node_worker(gpu_node()), provider="prov", pool="managed", owner_tenant="acme", version="d-1"
    )
    assert (event.provider, event.pool, event.owner_tenant, event.hostname) == (
        "prov",
        "managed",
        "acme",
        "gpu-a",
    )
    assert len(event.gpus) == 8 and event.memory_mb == 1056 * 1024 and event.cpus == 95
    assert event.labels["kubernetes_node"] == "gpu-a"
    assert event.sandbox == "kubernetes"  # every workload a pod: it takes work that names an image


def test_a_cpu_node_has_no_gpus_and_no_problem() -> None:
    node = gpu_node("cpu-a")
    del node["status"]["allocatable"]["nvidia.com/gpu"]
    node["metadata"]["labels"] = {}
    worker = node_worker(node)
    assert worker.gpus == () and worker.cpus == 95 and worker.problems == ()
    assert worker.hostname == "cpu-a" and worker.driver == ""


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "True"}], True),
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "Ready", "status": "Unknown"}], False),
        ([{"type": "DiskPressure", "status": "True"}], False),
        ([], False),
        ("garbage", False),
        ([None, 3, {"type": "Ready", "status": True}], False),  # a bool is not the string "True"
    ],
)
def test_liveness_is_the_ready_condition_being_true(conditions: object, ready: bool) -> None:
    assert is_ready(gpu_node(status__conditions=conditions)) is ready
    assert node_worker(gpu_node(status__conditions=conditions)).ready is ready


def test_a_vanished_node_is_lost_and_a_cordoned_one_says_so() -> None:
    assert is_ready(None) is False
    assert node_worker(gpu_node(spec__unschedulable=True)).cordoned
    assert not node_worker(gpu_node(spec__unschedulable="yes")).cordoned


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"nvidia.com/gpu.memory": str(10**9)}, "gpu.memory"),  # a label claiming 10^9 MiB per GPU
        ({"nvidia.com/gpu.memory": str(MAX_GPU_MEMORY_MB + 1)}, "gpu.memory"),
        ({"nvidia.com/gpu.memory": "0"}, "gpu.memory"),
        ({"nvidia.com/gpu.memory": "-80"}, "gpu.memory"),
        ({"nvidia.com/gpu.memory": "80GB"}, "gpu.memory"),
        ({"nvidia.com/gpu.memory": None}, "GPU feature discovery"),
        ({"nvidia.com/gpu.product": "A100\n; rm -rf /"}, "gpu.product"),
        ({"nvidia.com/gpu.product": "x" * 500}, "gpu.product"),
        ({"nvidia.com/gpu.product": ["A100"]}, "gpu.product"),
        ({"nvidia.com/gpu.product": None}, "GPU feature discovery"),
    ],
)
def test_gpus_without_a_valid_model_and_memory_are_left_out(labels: dict[str, Any], why: str) -> None:
    node = gpu_node()
    for key, value in labels.items():
        if value is None:
            del node["metadata"]["labels"][key]
        else:
            node["metadata"]["labels"][key] = value
    worker = node_worker(node)
    assert worker.gpus == ()
    assert any(why in problem for problem in worker.problems), worker.problems
    assert worker.cpus == 95  # the rest of the node still counts


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nvidia.com/gpu", "-8"),
        ("nvidia.com/gpu", "1000000"),
        ("nvidia.com/gpu", "lots"),
        ("nvidia.com/gpu", 8),
        ("cpu", "-4"),
        ("cpu", "1e30"),
        ("memory", "1Ei"),
        ("memory", "-16Gi"),
        ("memory", "16 gigs"),
    ],
)
def test_allocatable_out_of_bounds_or_garbage_counts_as_nothing(key: str, value: object) -> None:
    worker = node_worker(
        gpu_node(status__allocatable={"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"} | {key: value})
    )
    field = {"nvidia.com/gpu": len(worker.gpus), "cpu": worker.cpus, "memory": worker.memory_mb}
    assert field[key] == 0
    assert any(key in problem for problem in worker.problems), worker.problems


def test_fractional_cpus_round_down_and_decimal_memory_reads_in_mib() -> None:
    worker = node_worker(gpu_node(status__allocatable={"cpu": "3500m", "memory": "16G"}))
    assert (worker.cpus, worker.memory_mb) == (3, 16 * 10**9 // 2**20)


@pytest.mark.parametrize("name", [None, "", "Upper", "a" * 254, "-lead", 42, "has space"])
def test_a_node_without_a_valid_name_is_refused(name: object) -> None:
    with pytest.raises(InvalidInput):
        node_worker(gpu_node(metadata__name=name))


def test_invalid_labels_are_left_out_with_a_reason() -> None:
    node = gpu_node()
    labels = node["metadata"]["labels"]
    labels |= {"kubernetes.io/hostname": "Bad_Host!", "topology.kubernetes.io/region": "x" * 100}
    labels |= {"nvidia.com/cuda.driver.major": "550; reboot"}
    worker = node_worker(node)
    assert (worker.hostname, worker.region, worker.driver) == ("gpu-a", "", "")
    assert len(worker.problems) == 2  # the hostname and the region labels; the driver is optional


def test_garbage_shapes_do_not_crash() -> None:
    worker = node_worker({"metadata": {"name": "n", "labels": "nope"}, "spec": [], "status": 7})
    assert (worker.gpus, worker.cpus, worker.memory_mb, worker.ready) == ((), 0, 0, False)


def test_a_nodes_network_domains_come_from_its_labels() -> None:
    labels = {
        "nvidia.com/gpu.clique": "6c1f0e3a9b2d4e7f8a0b1c2d3e4f5a6b.7",
        "topology.resontech.io/rack": "r12",
        "topology.resontech.io/block": "b3",
        "topology.resontech.io/galaxy": "ignored",
        "topology.resontech.io/switch": "bad value!",
    }
    node = gpu_node(**{f"metadata__labels__{k}": v for k, v in labels.items()})
    worker = node_worker(node)
    assert worker.topology == {
        "clique": "6c1f0e3a9b2d4e7f8a0b1c2d3e4f5a6b.7",
        "rack": "r12",
        "block": "b3",
        "zone": "eu-west-1a",  # topology.kubernetes.io/zone when no resontech zone label
    }
    assert any("topology.resontech.io/switch" in p for p in worker.problems)
    event = registration(worker, provider="gpuco", pool="shared", owner_tenant=None, version="1")
    assert event.topology == worker.topology
