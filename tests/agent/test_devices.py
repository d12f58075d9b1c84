"""The agent's devices (:mod:`agent.devices`): NVML through a fake module, a failing device, no NVML,
simulated devices only when chosen."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.devices import NO_NVML_MESSAGE, NoGpu, NvmlDevices, SimulatedDevices, select_devices
from agent.settings import AgentSettings
from schemas.values import Gpu, GpuTelemetry


class FakeNvml:
    """The parts of the pynvml API the agent uses: GPU 0 supports everything, GPU 1 (a consumer card)
    reports no power, no ECC, no utilisation."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    MIB = 1024 * 1024

    def __init__(self) -> None:
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> Any:
        return b"NVIDIA A100-SXM4-80GB" if h == "h0" else "NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = (81_920 if h == "h0" else 24_564) * self.MIB
        return SimpleNamespace(total=total, free=total - 1024 * self.MIB, used=1024 * self.MIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 64

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        return 312_456  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, h: str, error_type: int, counter: int) -> int:
        if h == "h1":
            raise self.NVMLError_NotSupported()
        assert (error_type, counter) == (1, 0)
        return 2

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"


def test_nvml_devices_read_inventory_telemetry_and_driver_through_the_api() -> None:
    fake = FakeNvml()
    devices = NvmlDevices.open(fake)
    assert devices.inventory() == [
        Gpu(index=0, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81_920, vram_free_mb=80_896, uuid="GPU-h0"),
        Gpu(
            index=1, model="NVIDIA GeForce RTX 4090", vram_total_mb=24_564, vram_free_mb=23_540, uuid="GPU-h1"
        ),
    ]
    assert devices.telemetry() == [
        GpuTelemetry(index=0, util_pct=87.0, mem_used_mb=1024, temp_c=64.0, power_w=312.5, ecc_errors=2),
        GpuTelemetry(index=1, util_pct=None, mem_used_mb=1024, temp_c=64.0, power_w=None, ecc_errors=None),
    ]
    assert devices.driver() == "550.54.15"
    devices.close()
    assert fake.shut_down


def test_nvml_devices_survive_a_failing_device() -> None:
    fake = FakeNvml()

    def lost(h: str) -> Any:
        raise fake.NVMLError("GPU is lost")

    fake.nvmlDeviceGetMemoryInfo = lost  # type: ignore[method-assign]
    devices = NvmlDevices(fake)
    assert [g.vram_total_mb for g in devices.inventory()] == [0, 0]
    assert all(t.mem_used_mb is None for t in devices.telemetry())


def test_no_nvml_means_zero_gpus_and_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = AgentSettings(name="a", state_dir=str(tmp_path), work_dir=str(tmp_path / "w"))
    with caplog.at_level(logging.INFO, logger="resontech.agent"):
        devices = select_devices(settings)  # the real pynvml: NVMLError_LibraryNotFound on this host
    assert isinstance(devices, NoGpu)
    assert (devices.inventory(), devices.telemetry(), devices.driver()) == ([], [], "")
    assert [r.getMessage() for r in caplog.records] == [NO_NVML_MESSAGE]


def test_simulated_devices_only_when_chosen(tmp_path: Path) -> None:
    settings = AgentSettings(
        name="a",
        state_dir=str(tmp_path),
        work_dir=str(tmp_path),
        device_source="simulated",
        simulated_gpus=2,
        simulated_gpu_model="NVIDIA H100 80GB HBM3",
        simulated_vram_mb=81_559,
    )
    devices = select_devices(settings)
    assert isinstance(devices, SimulatedDevices)
    assert [g.model for g in devices.inventory()] == ["NVIDIA H100 80GB HBM3"] * 2
    assert len(devices.telemetry()) == 2


class FabricNvml(FakeNvml):
    """Two GPUs of an NVLink domain (a GB200 NVL72 tray): fabric info as NVML fills it in."""

    NVML_SUCCESS = 0
    NVML_GPU_FABRIC_STATE_COMPLETED = 3
    c_nvmlGpuFabricInfo_t = __import__("pynvml").c_nvmlGpuFabricInfo_t

    def __init__(self, cliques: list[int | None], state: int = 3) -> None:
        super().__init__()
        self.cliques, self.state = cliques, state

    def nvmlDeviceGetGpuFabricInfo(self, h: str, out: Any) -> int:
        clique = self.cliques[int(h[-1])]
        if clique is None:
            raise self.NVMLError_NotSupported()
        info = out._obj  # ctypes.byref(...)
        info.clusterUuid[:] = list(bytes.fromhex("6c1f0e3a9b2d4e7f8a0b1c2d3e4f5a6b"))
        info.cliqueId, info.state, info.status = clique, self.state, 0
        return 0


@pytest.mark.parametrize(
    ("cliques", "state", "clique"),
    [
        ([7, 7], 3, "6c1f0e3a9b2d4e7f8a0b1c2d3e4f5a6b.7"),
        ([7, 8], 3, ""),  # GPUs in two domains: none claimed
        ([7, None], 3, ""),  # one GPU without fabric info
        ([None, None], 3, ""),  # no NVSwitch fabric (NVML: not supported)
        ([7, 7], 1, ""),  # the fabric manager has not placed them yet
    ],
)
def test_the_nvlink_domain_comes_from_nvml_fabric_info(
    cliques: list[int | None], state: int, clique: str
) -> None:
    assert NvmlDevices(FabricNvml(cliques, state)).clique() == clique
    assert NoGpu().clique() == ""
