"""The verification workload: ``python -m agent.verify --challenge-id ID --seed HEX --size N --rounds R``.

It computes the challenge's answer (:func:`core.verification.answer`, timed on the monotonic clock),
lists the GPUs NVML shows this process (none where NVML is missing), and on a GPU host measures
GPU 0's FP16 matrix-multiply throughput with torch. It prints exactly one line on stdout and exits 0,
whatever happened (a failure is the report's ``error``)::

    RESONTECH_VERIFICATION {"type":"worker.verification_reported","challenge_id":...,"checksum":...,
    "elapsed_ms":...,"gpus":[...],"gpu_tflops":...,"error":""}

Bad arguments (missing, not integers, out of range) exit 2 with one line on stderr and no report.
The agent reads the line back with :func:`parse_report`. torch is imported only on a host where NVML
reported GPUs, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that torch's device 0 is NVML's GPU 0 (the
GPU the kernel's floor is looked up for); run it with every GPU visible.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import msgspec

from agent.devices import NoGpu, NvmlDevices
from core.verification import answer, validate
from schemas.commands import VerifyWorker
from schemas.values import Gpu
from schemas.workers import WorkerVerificationReported

REPORT_KEYWORD = "RESONTECH_VERIFICATION"
"""The first word of the report line."""
TFLOPS_SIZE = 8192
"""Matrix size of the FP16 benchmark (three 128 MiB matrices on the GPU)."""
TFLOPS_WARMUP = 3
TFLOPS_ITERATIONS = 10
ERROR_LIMIT = 1000
"""Characters of an error message kept in the report."""

_DECODER = msgspec.json.Decoder(WorkerVerificationReported)


def list_gpus(nvml: Any | None = None) -> list[Gpu]:
    """The GPUs NVML shows this process; none when NVML cannot start (no library, no driver).

    Args:
        nvml: the pynvml module or one with its API (tests); default: import ``pynvml``.
    """
    try:
        devices = NvmlDevices.open(nvml)
    except Exception:  # ImportError, NVMLError_LibraryNotFound, any NVMLError: no GPUs here
        return NoGpu().inventory()
    try:
        return devices.inventory()
    finally:
        devices.close()


def measure_tflops(
    device: int = 0,
    *,
    size: int = TFLOPS_SIZE,
    warmup: int = TFLOPS_WARMUP,
    iterations: int = TFLOPS_ITERATIONS,
    torch: Any | None = None,
) -> tuple[float | None, str]:
    """FP16 dense matmul throughput of CUDA device ``device``, in TFLOPS (``2 * size**3`` per product).

    Args:
        torch: the torch module (tests); default: import it here, so that CPU hosts never do.

    Returns:
        ``(tflops, "")``, or ``(None, why)`` when torch or CUDA is missing or the benchmark failed.
    """
    try:
        torch = torch if torch is not None else importlib.import_module("torch")
    except ImportError as exc:
        return None, f"torch is not installed: {exc}"
    try:
        if not torch.cuda.is_available():
            return None, "CUDA is not available to torch"
        where = f"cuda:{device}"
        a = torch.randn(size, size, dtype=torch.float16, device=where)
        b = torch.randn(size, size, dtype=torch.float16, device=where)
        out = torch.empty(size, size, dtype=torch.float16, device=where)
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize(where)
        start = time.perf_counter()
        for _ in range(iterations):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize(where)
        seconds = time.perf_counter() - start
    except Exception as exc:  # out of memory, a CUDA error, a broken driver: the report says which
        return None, f"the GPU benchmark failed: {type(exc).__name__}: {exc}"
    if seconds <= 0:
        return None, "the GPU benchmark took no measurable time"
    return round(2 * size**3 * iterations / seconds / 1e12, 1), ""


def run(
    challenge_id: str,
    seed: str,
    size: int,
    rounds: int,
    *,
    nvml: Any | None = None,
    measure: Callable[[], tuple[float | None, str]] = measure_tflops,
) -> WorkerVerificationReported:
    """Answer a challenge on this host: checksum and its time, the GPUs, GPU 0's throughput.

    Args:
        nvml / measure: the NVML module and the GPU benchmark (tests); defaults: the real ones.

    Raises:
        ValueError: invalid ``seed``, ``size`` or ``rounds`` (:func:`core.verification.validate`).
    """
    start_ns = time.monotonic_ns()
    checksum = answer(seed, size, rounds)
    elapsed_ms = math.ceil((time.monotonic_ns() - start_ns) / 1e6)
    gpus = list_gpus(nvml)
    tflops, error = measure() if gpus else (None, "")
    return WorkerVerificationReported(
        challenge_id=challenge_id,
        checksum=checksum,
        elapsed_ms=elapsed_ms,
        gpus=gpus,
        gpu_tflops=tflops,
        error=error[:ERROR_LIMIT],
    )


def format_report(report: WorkerVerificationReported) -> str:
    """The report line, without a newline."""
    return f"{REPORT_KEYWORD} {msgspec.json.encode(report).decode()}"


def parse_report(line: str) -> WorkerVerificationReported | None:
    """The report in one line of the workload's output; ``None`` for any other line, or a report line
    whose JSON is not a valid report."""
    keyword, _, payload = line.strip().partition(" ")
    if keyword != REPORT_KEYWORD:
        return None
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError:  # ValidationError included
        return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


async def run_verification(cmd: VerifyWorker) -> WorkerVerificationReported:
    """Run this program as a workload of the agent for ``cmd`` (a clean environment: none of the
    agent's credentials) and parse its report; a failure is a report whose ``error`` says what
    happened (the kernel decides what it means)."""
    argv = [
        sys.executable, "-m", "agent.verify", "--challenge-id", cmd.challenge_id,
        "--seed", cmd.seed, "--size", str(cmd.size), "--rounds", str(cmd.rounds),
    ]  # fmt: skip
    failed = functools.partial(WorkerVerificationReported, challenge_id=cmd.challenge_id)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_clean_env()
        )
    except OSError as exc:
        return failed(error=f"cannot run: {exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), cmd.deadline_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return failed(error=f"no answer within {cmd.deadline_s:g}s")
    for line in reversed(out.decode(errors="replace").splitlines()):
        report = parse_report(line)
        if report is not None:
            return msgspec.structs.replace(report, challenge_id=cmd.challenge_id)
    tail = err.decode(errors="replace")[-500:]
    return failed(error=f"no report (exit status {proc.returncode}): {tail}")


def _clean_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "LD_LIBRARY_PATH")
    return {k: v for k, v in os.environ.items() if k in keep}


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="agent.verify", description="Answer a resontech verification challenge.")
    p.add_argument("--challenge-id", required=True, help="the challenge's id, named in the report")
    p.add_argument("--seed", required=True, help="16-64 hex digits")
    p.add_argument("--size", required=True, type=int, help="matrix size, 16-1024")
    p.add_argument("--rounds", required=True, type=int, help="chained products, 1-64")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload; 0 after printing the report line, 2 for bad arguments."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if not args.challenge_id:
            raise ValueError("the challenge id is empty")
        validate(args.seed, args.size, args.rounds)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch starts CUDA: cuda:0 is NVML's GPU 0
    try:
        report = run(args.challenge_id, args.seed, args.size, args.rounds)
    except Exception as exc:
        report = WorkerVerificationReported(
            challenge_id=args.challenge_id, error=f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT]
        )
    print(format_report(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
