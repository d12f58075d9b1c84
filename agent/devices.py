"""GPU devices behind one small Protocol: NVML for real, none on a host without NVML, simulated for
load tests only.

Every NVML query that the device or driver does not support (``NVMLError_NotSupported``), or that
fails for any other NVML reason, reads as ``None``: telemetry is best effort and never stops the
agent. A host where ``nvmlInit()`` fails (no library, no driver) reports zero GPUs and takes CPU work.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol, TypeVar

from agent.settings import AgentSettings
from schemas.values import Gpu, GpuTelemetry

log = logging.getLogger("resontech.agent")
T = TypeVar("T")
MIB = 1024 * 1024
NO_NVML_MESSAGE = "no NVML: reporting zero GPUs, CPU work only"


class DeviceSource(Protocol):
    """Where the agent learns about its GPUs."""

    def inventory(self) -> list[Gpu]:
        """The GPUs, as registered: model, VRAM total and free (MiB), index, uuid."""
        ...

    def telemetry(self) -> list[GpuTelemetry]:
        """Current readings per GPU, ``None`` where unknown."""
        ...

    def driver(self) -> str:
        """The driver version (empty when there is none)."""
        ...

    def clique(self) -> str:
        """The NVLink domain the GPUs belong to (``<fabric cluster uuid>.<clique id>``), empty when
        NVML has no fabric info (no NVSwitch fabric, or it is not ready)."""
        ...


class NoGpu:
    """A host without NVML: zero GPUs, empty telemetry, no driver, no NVLink domain."""

    def inventory(self) -> list[Gpu]:
        return []

    def telemetry(self) -> list[GpuTelemetry]:
        return []

    def driver(self) -> str:
        return ""

    def clique(self) -> str:
        return ""


class NvmlDevices:
    """GPUs read through NVML (``pynvml`` from nvidia-ml-py, or any module with its API).

    Args:
        nvml: the module, already initialised (``nvmlInit()`` succeeded); see :meth:`open`.
    """

    def __init__(self, nvml: ModuleType | Any) -> None:
        self._nvml = nvml
        self._error: type[Exception] = nvml.NVMLError
        count = self._call(nvml.nvmlDeviceGetCount) or 0
        handles = [self._call(nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self._handles = [(i, h) for i, h in enumerate(handles) if h is not None]

    @classmethod
    def open(cls, nvml: ModuleType | Any | None = None) -> NvmlDevices:
        """Import ``pynvml`` (unless given) and initialise NVML.

        Raises:
            ImportError: pynvml is not installed.
            pynvml.NVMLError: NVML is missing or cannot start (e.g. ``NVMLError_LibraryNotFound``).
        """
        module = nvml if nvml is not None else importlib.import_module("pynvml")
        module.nvmlInit()
        return cls(module)

    def _call(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._error:
            return None

    def inventory(self) -> list[Gpu]:
        nvml = self._nvml
        gpus = []
        for index, handle in self._handles:
            memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
            gpus.append(
                Gpu(
                    index=index,
                    model=_text(self._call(nvml.nvmlDeviceGetName, handle)) or "unknown",
                    vram_total_mb=int(memory.total // MIB) if memory is not None else 0,
                    vram_free_mb=int(memory.free // MIB) if memory is not None else 0,
                    uuid=_text(self._call(nvml.nvmlDeviceGetUUID, handle)),
                )
            )
        return gpus

    def telemetry(self) -> list[GpuTelemetry]:
        return [self._reading(index, handle) for index, handle in self._handles]

    def _reading(self, index: int, handle: Any) -> GpuTelemetry:
        nvml = self._nvml
        rates = self._call(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
        temp = self._call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._call(nvml.nvmlDeviceGetPowerUsage, handle)
        ecc = self._call(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        return GpuTelemetry(
            index=index,
            util_pct=float(rates.gpu) if rates is not None else None,
            mem_used_mb=int(memory.used // MIB) if memory is not None else None,
            temp_c=float(temp) if temp is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            ecc_errors=int(ecc) if ecc is not None else None,
        )

    def driver(self) -> str:
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def clique(self) -> str:
        """Every GPU's fabric info (``nvmlDeviceGetGpuFabricInfo``): the one NVLink domain they share,
        once the fabric manager has placed them (state ``COMPLETED``); empty when any GPU has none,
        or they disagree."""
        nvml, seen = self._nvml, set()
        for _, handle in self._handles:
            info = nvml.c_nvmlGpuFabricInfo_t()
            if self._call(nvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info)) is None:
                return ""
            if info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nvml.NVML_SUCCESS:
                return ""
            seen.add(f"{bytes(info.clusterUuid).hex()}.{info.cliqueId}")
        return seen.pop() if len(seen) == 1 else ""

    def close(self) -> None:
        """Shut NVML down (safe to call twice)."""
        self._call(self._nvml.nvmlShutdown)


class SimulatedDevices:
    """Made-up GPUs for load tests: ``count`` x ``model`` with ``vram_mb`` each. Never a default.

    Telemetry is drawn from a seeded generator, so two runs with the same seed report the same.
    """

    def __init__(self, count: int, model: str, vram_mb: int, *, seed: int = 0) -> None:
        self._gpus = [
            Gpu(index=i, model=model, vram_total_mb=vram_mb, vram_free_mb=vram_mb, uuid=f"SIM-{seed}-{i}")
            for i in range(count)
        ]
        self._random = random.Random(seed)

    def inventory(self) -> list[Gpu]:
        return list(self._gpus)

    def telemetry(self) -> list[GpuTelemetry]:
        r = self._random
        return [
            GpuTelemetry(
                index=g.index,
                util_pct=float(r.randint(0, 100)),
                mem_used_mb=r.randint(0, g.vram_total_mb),
                temp_c=float(r.randint(35, 80)),
                power_w=float(r.randint(60, 400)),
                ecc_errors=0,
            )
            for g in self._gpus
        ]

    def driver(self) -> str:
        return "simulated"

    def clique(self) -> str:
        return ""


def select_devices(settings: AgentSettings) -> DeviceSource:
    """The device source the settings ask for: NVML, or none when NVML cannot start; simulated only
    when ``device_source`` says so."""
    if settings.device_source == "simulated":
        log.info(
            "simulated devices: %d x %s (load tests only)",
            settings.simulated_gpus,
            settings.simulated_gpu_model,
        )
        return SimulatedDevices(
            settings.simulated_gpus, settings.simulated_gpu_model, settings.simulated_vram_mb
        )
    try:
        return NvmlDevices.open()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, any NVMLError: no GPUs here
        log.info(NO_NVML_MESSAGE)
        log.debug("nvmlInit failed: %s: %s", type(exc).__name__, exc)
        return NoGpu()


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
