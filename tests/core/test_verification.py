"""Pure unit tests of the verification job: the benchmark (:func:`core.verification.answer`), the
kernel's judgement of a report, and the workload program ``agent.verify`` (NVML through a fake module,
torch without CUDA, and the real program as a subprocess)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agent import verify
from core import verification
from core.pricing import CPU_GPU_TYPE, PRICE_TABLES
from core.verification import GPU_TFLOPS_FLOOR, P, answer, judge, new_challenge, validate
from schemas.values import Gpu
from schemas.workers import WorkerVerificationReported, WorkerVerificationRequested
from tests.support import REPO

SEED = "00112233445566778899aabbccddeeff"
GOLDEN = "ecd7bf28de92099850644855a3661e3fa29694779782de091f4a4b7c64c88f23"
"""answer(SEED) at the defaults (256 x 5), version 1: an agent and a kernel of any version must agree."""
H100 = "NVIDIA H100 80GB HBM3"
SMALL: dict[str, Any] = {"seed": SEED, "size": 16, "rounds": 2}


# -- the benchmark ---------------------------------------------------------------------------------


def test_answer_is_deterministic_and_pinned() -> None:
    assert (verification.SIZE, verification.ROUNDS) == (256, 5)
    assert answer(SEED, 256, 5) == answer(SEED, 256, 5) == GOLDEN
    assert answer(SEED.upper(), 256, 5) == GOLDEN  # hex digits, whatever their case


def test_answer_differs_with_seed_size_and_rounds() -> None:
    base = answer(SEED, 32, 3)
    others = {answer("f" + SEED[1:], 32, 3), answer(SEED, 33, 3), answer(SEED, 32, 2), answer(SEED, 32, 4)}
    assert base not in others and len(others) == 4


def _reference(seed: str, size: int, rounds: int) -> str:
    """The benchmark as its docstring specifies it, in Python integers (no overflow possible)."""
    stream = hashlib.shake_256(b"resontech-verification-v1" + size.to_bytes(4, "little") + seed.encode())
    raw = stream.digest(8 * size * size)
    words = [int.from_bytes(raw[i : i + 4], "little") % P for i in range(0, len(raw), 4)]
    a = [words[r * size : (r + 1) * size] for r in range(size)]
    b = [words[size * size + r * size : size * size + (r + 1) * size] for r in range(size)]
    x = a
    for i in range(rounds):
        y = [[sum(x[r][k] * b[k][c] for k in range(size)) % P for c in range(size)] for r in range(size)]
        x = [[((v ^ (v >> 13)) + i + 1) % P for v in row] for row in y]
    return hashlib.sha256(b"".join(v.to_bytes(4, "little") for row in x for v in row)).hexdigest()


def test_answer_is_the_exact_integer_computation() -> None:
    assert answer(SEED, 16, 3) == _reference(SEED, 16, 3)
    assert answer("ab" * 32, 24, 2) == _reference("ab" * 32, 24, 2)


def test_the_split_product_never_overflows_at_the_largest_size() -> None:
    # Every entry P-1 (= -1 mod P), 1024 terms: each entry of the product is 1024 mod P. An unsplit
    # int64 product would overflow (1024 * (2**31 - 2)**2 > 2**63).
    x = np.full((1, 1024), P - 1, dtype=np.int64)
    b = np.full((1024, 1024), P - 1, dtype=np.int64)
    product = verification._product_mod_p(x, b & 0xFFFF, b >> 16)
    assert (product == 1024).all()


@pytest.mark.parametrize(
    ("seed", "size", "rounds", "message"),
    [
        ("0011", 16, 1, "seed"),
        ("0" * 65, 16, 1, "seed"),
        ("g" * 16, 16, 1, "seed"),
        (" " + SEED, 16, 1, "seed"),
        (b"0" * 16, 16, 1, "seed"),
        (SEED, 15, 1, "size"),
        (SEED, 1025, 1, "size"),
        (SEED, 16.0, 1, "size"),
        (SEED, True, 1, "size"),
        (SEED, 16, 0, "rounds"),
        (SEED, 16, 65, "rounds"),
    ],
)
def test_invalid_parameters_are_refused(seed: Any, size: Any, rounds: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(seed, size, rounds)
    with pytest.raises(ValueError, match=message):
        answer(seed, size, rounds)


def test_the_limits_are_valid() -> None:
    validate("0" * 16, 16, 1)
    validate("F" * 64, 1024, 64)


def test_new_challenge_fills_in_the_defaults() -> None:
    event = new_challenge("ch-1", SEED, requested_by="coordinator-1")
    assert (event.challenge_id, event.seed, event.size, event.rounds, event.deadline_s) == (
        "ch-1",
        SEED,
        256,
        5,
        120.0,
    )
    with pytest.raises(ValueError, match="deadline"):
        new_challenge("ch-1", SEED, deadline_s=0)
    with pytest.raises(ValueError, match="size"):
        new_challenge("ch-1", SEED, size=8)


# -- the judgement ---------------------------------------------------------------------------------


def _gpu(index: int, model: str = H100, vram: int = 81_559, uuid: str = "") -> Gpu:
    return Gpu(
        index=index, model=model, vram_total_mb=vram, vram_free_mb=vram - 500, uuid=uuid or f"GPU-{index}"
    )


def _judge(report: WorkerVerificationReported, registered: list[Gpu], **over: Any) -> str | None:
    """:func:`judge` of ``report``; ``over`` changes the challenge's fields or the other facts."""
    challenge: dict[str, Any] = {**SMALL, "challenge_id": "ch-1", "deadline_s": 120.0}
    facts: dict[str, Any] = {
        "requested_ns": 1_000_000_000_000,
        "received_ns": 1_000_000_000_000 + 5_000_000_000,
        "report": report,
        "registered_gpus": registered,
        "expected_checksum": answer(**SMALL),
    }
    for name, value in over.items():
        (challenge if name in WorkerVerificationRequested.__struct_fields__ else facts)[name] = value
    return judge(WorkerVerificationRequested(**challenge), **facts)


def _report(**over: Any) -> WorkerVerificationReported:
    fields: dict[str, Any] = {"challenge_id": "ch-1", "checksum": answer(**SMALL), "elapsed_ms": 3}
    fields.update(over)
    return WorkerVerificationReported(**fields)


TWO_H100 = [_gpu(0), _gpu(1)]


def test_an_honest_report_passes() -> None:
    assert _judge(_report(), []) is None  # a CPU host
    assert _judge(_report(gpus=TWO_H100, gpu_tflops=612.3), TWO_H100) is None
    # the GPUs in another order, VRAM within 2%, a uuid the registration did not know: still the same
    seen = [_gpu(1), _gpu(0, vram=81_559 - 1_000, uuid="GPU-x")]
    no_uuid = Gpu(index=0, model=H100, vram_total_mb=81_559, vram_free_mb=0)
    assert _judge(_report(gpus=seen, gpu_tflops=612.3), [no_uuid, _gpu(1)]) is None
    # a Kubernetes node registered from its GPU feature discovery label, which writes spaces as dashes
    labelled = [
        _gpu(0, model="NVIDIA-H100-80GB-HBM3", uuid=""),
        _gpu(1, model="NVIDIA-H100-80GB-HBM3", uuid=""),
    ]
    assert _judge(_report(gpus=TWO_H100, gpu_tflops=612.3), labelled) is None
    # exactly at the deadline
    assert _judge(_report(), [], received_ns=1_000_000_000_000 + 120_000_000_000) is None


@pytest.mark.parametrize(
    ("report", "over", "reason"),
    [
        (_report(challenge_id="ch-0"), {}, "wrong challenge id: the report names 'ch-0', not 'ch-1'"),
        (
            _report(),
            {"received_ns": 1_000_000_000_000 + 121_000_000_000},
            "answered after the deadline: 121.0 s",
        ),
        (_report(error="MemoryError: "), {}, "the verification workload failed: 'MemoryError: '"),
        (_report(checksum="00" * 32), {}, "wrong checksum for the 16x16 x 2 rounds benchmark"),
        (_report(checksum=""), {}, "wrong checksum"),
        (_report(elapsed_ms=0), {}, "elapsed_ms must be positive, not 0"),
        (_report(elapsed_ms=-5), {}, "elapsed_ms must be positive, not -5"),
        (_report(gpus=[_gpu(0)]), {}, "the workload saw 1 GPU(s), the registration has 0"),
    ],
)
def test_each_mismatch_of_a_cpu_host_is_named(
    report: WorkerVerificationReported, over: dict[str, Any], reason: str
) -> None:
    result = _judge(report, [], **over)
    assert result is not None and result.startswith(reason), result


@pytest.mark.parametrize(
    ("gpus", "tflops", "reason"),
    [
        ([_gpu(0)], 612.3, "the workload saw 1 GPU(s), the registration has 2"),
        ([], None, "the workload saw 0 GPU(s), the registration has 2"),
        ([_gpu(0), _gpu(2)], 612.3, "GPU 1: the workload saw no GPU of that index (it saw GPU 2)"),
        (
            [_gpu(0), _gpu(1, model="NVIDIA GeForce RTX 4090")],
            612.3,
            "GPU 1: the workload saw model 'NVIDIA GeForce RTX 4090', registered 'NVIDIA H100 80GB HBM3'",
        ),
        (
            [_gpu(0, vram=24_564), _gpu(1)],
            612.3,
            "GPU 0: the workload saw 24564 MiB of VRAM, registered 81559 MiB (tolerance 2%)",
        ),
        ([_gpu(0), _gpu(1, vram=81_559 + 1_700)], 612.3, "GPU 1: the workload saw 83259 MiB"),
        ([_gpu(0, uuid="GPU-other"), _gpu(1)], 612.3, "GPU 0: the workload saw uuid 'GPU-other', registered"),
        (TWO_H100, None, "a GPU host reported no FP16 throughput (gpu_tflops=None)"),
        (TWO_H100, 0.0, "a GPU host reported no FP16 throughput (gpu_tflops=0.0)"),
        (TWO_H100, float("nan"), "a GPU host reported no FP16 throughput"),
        (
            TWO_H100,
            2.5,
            "GPU 0 (NVIDIA H100 80GB HBM3) measured 2.5 FP16 TFLOPS, below the H100 floor of 151",
        ),
        (TWO_H100, 150.9, "GPU 0 (NVIDIA H100 80GB HBM3) measured 150.9 FP16 TFLOPS, below the H100 floor"),
    ],
)
def test_each_mismatch_of_a_gpu_host_is_named(gpus: list[Gpu], tflops: float | None, reason: str) -> None:
    result = _judge(_report(gpus=gpus, gpu_tflops=tflops), TWO_H100)
    assert result is not None and result.startswith(reason), result


def test_a_gpu_host_below_its_family_floor_is_refused_and_above_it_passes() -> None:
    cases = {
        "NVIDIA A100-SXM4-80GB": "A100",
        "NVIDIA L40S": "L40S",
        "NVIDIA GeForce RTX 4090": "RTX4090",
        "NVIDIA GeForce RTX 3090": "RTX3090",
        "Tesla T4": "T4",
        H100: "H100",
    }
    for model, family in cases.items():
        gpus = [_gpu(0, model=model)]
        floor = GPU_TFLOPS_FLOOR[family]
        refused = _judge(_report(gpus=gpus, gpu_tflops=floor * 0.9), gpus)
        assert refused is not None and f"below the {family} floor" in refused
        assert _judge(_report(gpus=gpus, gpu_tflops=floor), gpus) is None


def test_an_unknown_family_has_no_floor_but_must_report_a_throughput() -> None:
    gpus = [_gpu(0, model="NVIDIA B200")]
    assert _judge(_report(gpus=gpus, gpu_tflops=0.5), gpus) is None
    assert _judge(_report(gpus=gpus), gpus) == "a GPU host reported no FP16 throughput (gpu_tflops=None)"


def test_the_floors_cover_every_priced_family_and_sit_well_below_the_vendor_peaks() -> None:
    families = {f for table in PRICE_TABLES for f in table.gpu_hour_micros if f != CPU_GPU_TYPE}
    assert set(GPU_TFLOPS_FLOOR) == families
    for family, floor in GPU_TFLOPS_FLOOR.items():
        assert 0 < floor <= verification._VENDOR_PEAK_TFLOPS[family] / 5
    # a CPU (well under 5 TFLOPS of FP16) is below every floor; a real H100 (PCIe, 40% of peak) above
    assert min(GPU_TFLOPS_FLOOR.values()) > 5
    assert GPU_TFLOPS_FLOOR["H100"] < 756 * 0.4


def test_the_first_mismatch_wins_and_a_workers_text_is_bounded() -> None:
    report = _report(challenge_id="x" * 10_000, checksum="bad", error="boom")
    reason = _judge(report, TWO_H100)
    assert reason is not None and reason.startswith("wrong challenge id") and len(reason) < 200
    reason = _judge(_report(error="line one\nline two " + "y" * 10_000), [])
    assert reason is not None and "\n" not in reason and len(reason) < 200


def test_a_challenge_the_kernel_could_not_have_made_is_a_bug() -> None:
    with pytest.raises(ValueError, match="rounds"):
        _judge(_report(), [], rounds=0)


# -- the workload program --------------------------------------------------------------------------


class FakeNvml:
    """The pynvml calls agent.devices makes for an inventory: two H100s."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, init_fails: bool = False) -> None:
        self.init_fails = init_fails
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return H100.encode()

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-{h[1:]}"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = 81_559 * 1024 * 1024
        return SimpleNamespace(total=total, free=total - 500 * 1024 * 1024, used=500 * 1024 * 1024)


def test_the_workload_lists_the_gpus_nvml_shows_it() -> None:
    nvml = FakeNvml()
    assert verify.list_gpus(nvml) == TWO_H100
    assert nvml.shut_down
    assert verify.list_gpus(FakeNvml(init_fails=True)) == []


def test_a_gpu_host_reports_its_gpus_and_throughput_and_passes() -> None:
    measured: list[int] = []

    def measure() -> tuple[float | None, str]:
        measured.append(1)
        return 701.4, ""

    report = verify.run("ch-1", **SMALL, nvml=FakeNvml(), measure=measure)
    assert (report.gpus, report.gpu_tflops, report.error, measured) == (TWO_H100, 701.4, "", [1])
    assert report.checksum == answer(**SMALL) and report.elapsed_ms > 0
    assert _judge(report, TWO_H100) is None
    assert _judge(report, [_gpu(0)]) == "the workload saw 2 GPU(s), the registration has 1"


def test_a_cpu_host_never_measures_a_gpu() -> None:
    def measure() -> tuple[float | None, str]:
        raise AssertionError("no GPU: torch must not be touched")

    report = verify.run("ch-1", **SMALL, nvml=FakeNvml(init_fails=True), measure=measure)
    assert (report.gpus, report.gpu_tflops, report.error) == ([], None, "")


def test_torch_without_cuda_is_an_error_in_the_report_not_a_crash() -> None:
    pytest.importorskip("torch")
    assert verify.measure_tflops() == (None, "CUDA is not available to torch")
    # NVML says GPUs, torch cannot reach them: the report says why, and the kernel refuses it
    report = verify.run("ch-1", **SMALL, nvml=FakeNvml())
    assert (report.gpus, report.gpu_tflops, report.error) == (
        TWO_H100,
        None,
        "CUDA is not available to torch",
    )
    assert _judge(report, TWO_H100) == "the verification workload failed: 'CUDA is not available to torch'"


def test_no_torch_is_an_error_in_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    tflops, error = verify.measure_tflops()
    assert tflops is None and error.startswith("torch is not installed")


class FakeTorch:
    """What measure_tflops calls on torch, on a host that (pretends to) have CUDA."""

    float16 = "float16"

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[str, Any]] = []
        self.cuda = SimpleNamespace(is_available=lambda: True, synchronize=self._synchronize)

    def _synchronize(self, device: str) -> None:
        self.calls.append(("synchronize", device))

    def randn(self, *shape: int, dtype: str, device: str) -> tuple[int, ...]:
        self.calls.append(("randn", (shape, dtype, device)))
        return shape

    def empty(self, *shape: int, dtype: str, device: str) -> tuple[int, ...]:
        return shape

    def matmul(self, a: Any, b: Any, *, out: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append(("matmul", a))
        time.sleep(0.001)


def test_the_gpu_benchmark_runs_half_matmuls_on_the_device_and_counts_2n3_flops() -> None:
    torch = FakeTorch()
    tflops, error = verify.measure_tflops(1, size=64, warmup=2, iterations=3, torch=torch)
    assert error == "" and tflops is not None and 0 <= tflops < 2 * 64**3 * 3 / 0.003 / 1e12 + 0.1
    assert torch.calls[0] == ("randn", ((64, 64), "float16", "cuda:1"))
    assert [c[0] for c in torch.calls[2:]] == ["matmul"] * 2 + ["synchronize"] + ["matmul"] * 3 + [
        "synchronize"
    ]


def test_a_failing_gpu_benchmark_is_an_error_in_the_report() -> None:
    torch = FakeTorch(fail=RuntimeError("CUDA out of memory. Tried to allocate 128.00 MiB"))
    assert verify.measure_tflops(torch=torch) == (
        None,
        "the GPU benchmark failed: RuntimeError: CUDA out of memory. Tried to allocate 128.00 MiB",
    )


def test_report_lines_round_trip_and_other_lines_are_not_reports() -> None:
    report = _report(gpus=TWO_H100, gpu_tflops=612.3)
    line = verify.format_report(report)
    assert line.startswith("RESONTECH_VERIFICATION {") and "\n" not in line
    assert verify.parse_report(line + "\n") == report
    assert verify.parse_report('RESONTECH_VERIFICATION {"challenge_id": "c"}') == WorkerVerificationReported(
        challenge_id="c"
    )
    for other in (
        "",
        "loading...",
        "RESONTECH_PROGRESS {}",
        "RESONTECH_VERIFICATION",
        "RESONTECH_VERIFICATION {not json",
        'RESONTECH_VERIFICATION {"checksum": "ab"}',  # no challenge id
        'RESONTECH_VERIFICATION {"challenge_id": "c", "elapsed_ms": "fast"}',
        'RESONTECH_VERIFICATION {"type": "worker.verified", "challenge_id": "c"}',
        'RESONTECH_VERIFICATION ["c"]',
    ):
        assert verify.parse_report(other) is None, other


def test_an_exception_in_the_workload_is_still_one_report_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> WorkerVerificationReported:
        raise MemoryError("cannot allocate")

    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # main sets it; monkeypatch restores it
    monkeypatch.setattr(verify, "run", broken)
    assert verify.main(["--challenge-id", "ch-1", "--seed", SEED, "--size", "16", "--rounds", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert verify.parse_report(out[0]) == WorkerVerificationReported(
        challenge_id="ch-1", error="MemoryError: cannot allocate"
    )


def _workload(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.verify", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_real_workload_answers_on_this_host_and_the_kernel_accepts_it() -> None:
    requested_ns = time.monotonic_ns()
    challenge = new_challenge("ch-real", SEED)
    done = _workload(
        "--challenge-id",
        challenge.challenge_id,
        "--seed",
        challenge.seed,
        "--size",
        str(challenge.size),
        "--rounds",
        str(challenge.rounds),
    )
    received_ns = time.monotonic_ns()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    report = verify.parse_report(lines[0])
    assert report is not None
    assert (report.challenge_id, report.checksum, report.gpus, report.gpu_tflops, report.error) == (
        "ch-real",
        GOLDEN,
        [],  # no NVML on this host
        None,
        "",
    )
    assert 0 < report.elapsed_ms < 60_000
    verdict = judge(
        challenge,
        requested_ns=requested_ns,
        received_ns=received_ns,
        report=report,
        registered_gpus=[],
        expected_checksum=answer(challenge.seed, challenge.size, challenge.rounds),
    )
    assert verdict is None
    # the same report against a registration that claims a GPU is refused
    assert _judge(report, [_gpu(0)], challenge_id="ch-real", expected_checksum=GOLDEN) == (
        "the workload saw 0 GPU(s), the registration has 1"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--seed", SEED, "--size", "16", "--rounds", "1"],
            "the following arguments are required: --challenge-id",
        ),
        (
            ["--challenge-id", "c", "--seed", SEED, "--size", "big", "--rounds", "1"],
            "invalid int value: 'big'",
        ),
        (
            ["--challenge-id", "c", "--seed", "xyz", "--size", "16", "--rounds", "1"],
            "seed must be 16 to 64 hex",
        ),
        (
            ["--challenge-id", "c", "--seed", SEED, "--size", "2048", "--rounds", "1"],
            "size must be an integer",
        ),
        (
            ["--challenge-id", "", "--seed", SEED, "--size", "16", "--rounds", "1"],
            "the challenge id is empty",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line_on_stderr(args: list[str], message: str) -> None:
    done = _workload(*args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("agent.verify: error: "), done.stderr
    assert message in done.stderr
