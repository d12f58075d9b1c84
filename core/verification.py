"""The verification job: its computation and the kernel's judgement of a worker's report.

A new provider earns nothing and gets only test work until it is verified. Every new (or
hardware-changed) worker gets one verification job before it takes tenant work. The job is:

* a short integer benchmark (:func:`answer`) whose input is derived from a fresh seed, so no answer
  can be prepared in advance, and whose result is bit-exact on any machine, so the kernel can
  recompute it and compare checksums;
* on GPU hosts, the GPUs NVML shows the workload (cross-checked with the registration) and an FP16
  matrix-multiply throughput of GPU 0 (compared with a floor per GPU family,
  :data:`GPU_TFLOPS_FLOOR`).

What it proves, and what it does not: the checksum proves that the host ran the benchmark (on its
CPU) within the deadline. The GPU list and the throughput are the host's own claims (a host is
untrusted, and so is its NVML): the checks catch a host whose NVML disagrees with its own
registration, and a spoofed card that computes like a laptop, not a host that lies consistently.

The benchmark (version 1; changing it breaks every agent of the old version, so a change needs a new
version): ``A`` and ``B`` are ``size x size`` matrices of integers modulo the prime ``P = 2**31 - 1``,
read as little-endian ``uint32`` words from SHAKE-256 of ``"resontech-verification-v1"``, the
size and the (lower-case) seed. ``X_0 = A`` and, for ``i`` in ``0 .. rounds-1``,
``Y = X_i @ B mod P`` and ``X_{i+1} = ((Y xor (Y >> 13)) + i + 1) mod P`` (the non-linear step keeps
the chain sequential: no shortcut through powers of ``B``). The answer is the SHA-256 hex of
``X_rounds`` as little-endian ``uint32`` in row-major order. Every product is computed in ``int64``
with ``B`` split into its low 16 and high 15 bits, so no intermediate reaches 2**63 for any size up
to 1024 (``a < 2**31``, a half ``< 2**16``, at most 2**10 terms: each partial sum ``< 2**57``).
numpy's integer ``matmul`` does not use BLAS: it is exact and single-threaded.

Pure: no I/O, no clock, no randomness (the caller draws the seed).
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import numpy.typing as npt

from core.pricing import gpu_family
from schemas.values import Gpu
from schemas.workers import WorkerVerificationReported, WorkerVerificationRequested

P = 2**31 - 1
"""The modulus: a (Mersenne) prime below 2**31."""
SIZE = 256
"""Default matrix size. With :data:`ROUNDS`, one :func:`answer` takes about 0.19 s on one core of
the development machine (numpy 2.3, 37 ms per round), once on the worker and once in the kernel."""
ROUNDS = 5
"""Default number of chained products."""
DEADLINE_S = 120.0
"""Default seconds a worker has to report (the GPU benchmark, process start and NVML included)."""
SEED_HEX_CHARS = 32
"""The seed length the kernel draws (``secrets.token_hex(16)``); any 16-64 hex digits are valid."""

_DOMAIN = b"resontech-verification-v1"
_SEED = re.compile(r"[0-9a-fA-F]{16,64}")
_LOW_BITS = 16
_LOW_MASK = (1 << _LOW_BITS) - 1
_VRAM_TOLERANCE = 0.02
_QUOTE_LIMIT = 120  # characters of a worker's own text (its error, its challenge id) quoted in a reason

Matrix = npt.NDArray[np.int64]

# Dense FP16 tensor-core peak of the family's weakest variant, in TFLOPS, from the vendor's
# datasheets and architecture whitepapers (FP32 accumulation where the vendor gives both, which is
# what torch's half matmul uses; never the "with sparsity" figure), divided by a safety factor of 5:
# a real card in a simple torch benchmark reaches 40-80% of peak (the T4, power-capped at 70 W, the
# least), so each floor sits well below what a real card of the family measures.
_VENDOR_PEAK_TFLOPS = {
    "H100": 756.0,  # H100 PCIe (H100 SXM: 989)
    "A100": 312.0,  # A100 SXM and PCIe, 40 and 80 GB
    "L40S": 362.0,  # L40S datasheet
    "RTX4090": 147.0,  # RTX 4090 D (114 SMs); RTX 4090: 165 (Ada whitepaper, FP32 accumulate)
    "RTX3090": 71.0,  # RTX 3090 (Ampere GA102 whitepaper, FP32 accumulate); 3090 Ti: 80
    "T4": 65.0,  # T4 datasheet, FP16 mixed precision
}
_SAFETY_FACTOR = 5.0

GPU_TFLOPS_FLOOR: dict[str, float] = {
    family: float(math.floor(peak / _SAFETY_FACTOR)) for family, peak in _VENDOR_PEAK_TFLOPS.items()
}
"""Per GPU family (:func:`core.pricing.gpu_family`): the FP16 matmul TFLOPS a real card certainly
exceeds (H100 151, A100 62, L40S 72, RTX4090 29, RTX3090 14, T4 13): the vendor's dense peak of the
family's weakest variant divided by 5. A family not listed has no floor."""


def validate(seed: str, size: int, rounds: int) -> None:
    """Check a challenge's parameters.

    Raises:
        ValueError: ``seed`` is not 16-64 hex digits, ``size`` not in 16..1024 or ``rounds`` not in
            1..64.
    """
    if not isinstance(seed, str) or _SEED.fullmatch(seed) is None:
        raise ValueError("seed must be 16 to 64 hex digits")
    if not _is_int(size) or not 16 <= size <= 1024:
        raise ValueError(f"size must be an integer from 16 to 1024, not {size!r}")
    if not _is_int(rounds) or not 1 <= rounds <= 64:
        raise ValueError(f"rounds must be an integer from 1 to 64, not {rounds!r}")


def new_challenge(
    challenge_id: str,
    seed: str,
    *,
    size: int = SIZE,
    rounds: int = ROUNDS,
    deadline_s: float = DEADLINE_S,
    requested_by: str = "",
) -> WorkerVerificationRequested:
    """The ``worker.verification_requested`` event of a new challenge, with the defaults filled in.

    Args:
        challenge_id: a fresh id the report must name.
        seed: fresh hex from the caller (``secrets.token_hex(16)``); this module draws nothing.

    Raises:
        ValueError: as :func:`validate`, or a deadline that is not a positive number of seconds.
    """
    validate(seed, size, rounds)
    if not deadline_s > 0 or not math.isfinite(deadline_s):
        raise ValueError(f"deadline_s must be a positive number of seconds, not {deadline_s!r}")
    return WorkerVerificationRequested(
        challenge_id=challenge_id,
        seed=seed,
        size=size,
        rounds=rounds,
        deadline_s=deadline_s,
        requested_by=requested_by,
    )


def answer(seed: str, size: int = SIZE, rounds: int = ROUNDS) -> str:
    """The benchmark's result for a challenge: a SHA-256 hex digest (see the module docstring).

    CPU-bound (about 0.19 s at the defaults here); deterministic and bit-exact on any machine. A caller
    on an event loop runs it in a thread.

    Raises:
        ValueError: as :func:`validate`.
    """
    validate(seed, size, rounds)
    x, b = _matrices(seed, size)
    b_low = b & _LOW_MASK
    b_high = b >> _LOW_BITS
    for i in range(rounds):
        y = _product_mod_p(x, b_low, b_high)
        x = ((y ^ (y >> 13)) + (i + 1)) % P
    return hashlib.sha256(x.astype("<u4").tobytes(order="C")).hexdigest()


def _matrices(seed: str, size: int) -> tuple[Matrix, Matrix]:
    """``A`` and ``B`` of a challenge, entries in ``[0, P)``."""
    words = size * size
    stream = hashlib.shake_256(_DOMAIN + size.to_bytes(4, "little") + seed.lower().encode("ascii"))
    raw = np.frombuffer(stream.digest(8 * words), dtype="<u4").astype(np.int64) % P
    return raw[:words].reshape(size, size), raw[words:].reshape(size, size)


def _product_mod_p(x: Matrix, b_low: Matrix, b_high: Matrix) -> Matrix:
    # x @ b == (x @ b_high) * 2**16 + x @ b_low; each partial product stays below 2**57.
    high = (x @ b_high) % P
    return ((high << _LOW_BITS) + x @ b_low) % P


def judge(
    challenge: WorkerVerificationRequested,
    *,
    requested_ns: int,
    received_ns: int,
    report: WorkerVerificationReported,
    registered_gpus: list[Gpu],
    expected_checksum: str,
    tflops_floor: dict[str, float] = GPU_TFLOPS_FLOOR,
) -> str | None:
    """Judge a worker's verification report against the kernel's own facts.

    Cheap: the caller computes ``expected_checksum = answer(seed, size, rounds)`` once (in a thread).

    Args:
        challenge: the challenge, as the kernel requested it.
        requested_ns / received_ns: when the kernel requested it and received the report (the
            kernel's clock, nanoseconds).
        report: the worker's claim.
        registered_gpus: the GPUs of the worker's registration (empty on a CPU host).
        expected_checksum: the kernel's own :func:`answer` for the challenge.
        tflops_floor: FP16 TFLOPS floors by GPU family (default :data:`GPU_TFLOPS_FLOOR`).

    Returns:
        ``None`` when the report passes, else one human-readable reason naming the first mismatch,
        checked in this order: challenge id, deadline, the workload's error, checksum, elapsed time,
        GPU count, each GPU's model, VRAM total (2% tolerance) and uuid (when both sides name one),
        and on a GPU host the throughput of GPU 0 against its family's floor.

    Raises:
        ValueError: the challenge's own parameters are invalid (as :func:`validate`): a kernel bug.
    """
    validate(challenge.seed, challenge.size, challenge.rounds)
    checks = (
        _challenge_reason(challenge.challenge_id, requested_ns, challenge.deadline_s, received_ns, report),
        _answer_reason(challenge.size, challenge.rounds, report, expected_checksum),
        _gpus_reason(report.gpus, registered_gpus),
        _throughput_reason(report.gpu_tflops, registered_gpus, tflops_floor),
    )
    return next((reason for reason in checks if reason is not None), None)


def _challenge_reason(
    challenge_id: str,
    requested_ns: int,
    deadline_s: float,
    received_ns: int,
    report: WorkerVerificationReported,
) -> str | None:
    if report.challenge_id != challenge_id:
        return f"wrong challenge id: the report names {_quote(report.challenge_id)}, not {challenge_id!r}"
    waited_s = (received_ns - requested_ns) / 1e9
    if waited_s > deadline_s:
        return f"answered after the deadline: {waited_s:.1f} s after the request, deadline {deadline_s:g} s"
    return None


def _answer_reason(
    size: int, rounds: int, report: WorkerVerificationReported, expected_checksum: str
) -> str | None:
    if report.error:
        return f"the verification workload failed: {_quote(report.error)}"
    if report.checksum != expected_checksum:
        return f"wrong checksum for the {size}x{size} x {rounds} rounds benchmark: {_quote(report.checksum)}"
    if report.elapsed_ms <= 0:
        return f"elapsed_ms must be positive, not {report.elapsed_ms}"
    return None


def _gpus_reason(reported: list[Gpu], registered: list[Gpu]) -> str | None:
    if len(reported) != len(registered):
        return f"the workload saw {len(reported)} GPU(s), the registration has {len(registered)}"
    by_index = sorted(registered, key=lambda g: g.index)
    for mine, theirs in zip(by_index, sorted(reported, key=lambda g: g.index), strict=True):
        where = f"GPU {mine.index}"
        if theirs.index != mine.index:
            return f"{where}: the workload saw no GPU of that index (it saw GPU {theirs.index})"
        if _model(theirs.model) != _model(mine.model):
            return f"{where}: the workload saw model {_quote(theirs.model)}, registered {mine.model!r}"
        if abs(theirs.vram_total_mb - mine.vram_total_mb) > _VRAM_TOLERANCE * mine.vram_total_mb:
            return (
                f"{where}: the workload saw {theirs.vram_total_mb} MiB of VRAM, registered "
                f"{mine.vram_total_mb} MiB (tolerance 2%)"
            )
        if theirs.uuid and mine.uuid and theirs.uuid != mine.uuid:
            return f"{where}: the workload saw uuid {_quote(theirs.uuid)}, registered {mine.uuid!r}"
    return None


def _model(name: str) -> str:
    """A GPU model as compared: a Kubernetes node's GPU feature discovery label writes NVML's spaces as
    dashes (``NVIDIA-A100-SXM4-80GB`` for ``NVIDIA A100-SXM4-80GB``), and either may be registered."""
    return "-".join(name.split())


def _throughput_reason(tflops: float | None, registered: list[Gpu], floors: dict[str, float]) -> str | None:
    if not registered:
        return None  # a CPU host: there is nothing to measure
    if tflops is None or not math.isfinite(tflops) or tflops <= 0:
        return f"a GPU host reported no FP16 throughput (gpu_tflops={tflops!r})"
    gpu0 = min(registered, key=lambda g: g.index)
    family = gpu_family(gpu0.model)
    floor = floors.get(family)
    if floor is not None and tflops < floor:
        return (
            f"GPU {gpu0.index} ({gpu0.model}) measured {tflops:.1f} FP16 TFLOPS, below the "
            f"{family} floor of {floor:g}"
        )
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _quote(text: str) -> str:
    """A worker's own text in a reason: quoted, on one line, at most ~120 characters."""
    if len(text) > _QUOTE_LIMIT:
        text = text[:_QUOTE_LIMIT] + "..."
    return repr(text)
