"""What the agent reports (:mod:`agent.reports`, :mod:`agent.protocol`): protocol lines, meter ticks,
coalesced progress, log tails, end reports, lines as events."""

from __future__ import annotations

import pytest

from agent import reports
from agent.protocol import CheckpointLine, ProgressLine, ProtocolError, ReadyLine, parse_line
from schemas.endpoints import EndpointReplicaLost
from schemas.jobs import JobFailed, JobShardCompleted
from tests.support.agent_commands import cmd


def test_protocol_lines() -> None:
    assert parse_line('RESONTECH_PROGRESS {"round": 1, "loss": 0.5, "train_epoch": 1, "step": 10}') == (
        ProgressLine(round=1, loss=0.5, train_epoch=1, step=10)
    )
    assert parse_line('RESONTECH_PROGRESS {"metrics": {"acc": 0.9}, "extra": true}') == ProgressLine(
        metrics={"acc": 0.9}
    )
    assert parse_line('RESONTECH_CHECKPOINT {"object_key": "ckpt/r1.pt", "round": 1}\r\n') == CheckpointLine(
        object_key="ckpt/r1.pt", round=1
    )
    assert parse_line('RESONTECH_READY {"address": "http://127.0.0.1:8000"}') == ReadyLine(
        address="http://127.0.0.1:8000"
    )
    assert parse_line("epoch 1 loss 0.5") is None
    assert parse_line("RESONTECH_SOMETHING_ELSE {}") is None
    for bad in (
        "RESONTECH_PROGRESS {not json",
        'RESONTECH_PROGRESS {"loss": "low"}',
        "RESONTECH_CHECKPOINT {}",
        'RESONTECH_CHECKPOINT {"object_key": ""}',
        "RESONTECH_PROGRESS",
    ):
        with pytest.raises(ProtocolError):
            parse_line(bad)


def test_meter_ticks_are_contiguous_gpu_or_cpu_milliseconds() -> None:
    """The agent claims time only: who pays, who is paid and at which price are the kernel's."""
    cpu = reports.Meter(cmd(cpus=2.0, tier="gold"), worker_id="w-1", start_ms=1_000)
    subject, first, event_id = cpu.tick(11_000)  # type: ignore[misc]
    assert (subject, event_id) == ("meter.acme.w-1.a1.tick", "a1-tick-1")
    assert (first.start_ms, first.end_ms, first.cpu_ms, first.gpu_ms, first.epoch) == (
        1_000,
        11_000,
        20_000,
        0,
        1,
    )
    assert (first.provider, first.gpu_type, first.tier) == ("", "", "unverified")  # nothing of its own
    assert cpu.tick(11_000) is None  # empty interval
    _, second, _ = cpu.tick(12_500)  # type: ignore[misc]
    assert (second.start_ms, second.end_ms, second.cpu_ms) == (11_000, 12_500, 3_000)

    gpu = reports.Meter(cmd(gpus=4, pool="managed"), worker_id="w-1", start_ms=0)
    _, tick, _ = gpu.tick(10_000)  # type: ignore[misc]
    assert (tick.gpu_ms, tick.cpu_ms) == (40_000, 0)


def test_progress_is_coalesced_to_one_report_a_second_per_assignment() -> None:
    coalescer = reports.ProgressCoalescer(interval_s=1.0)
    assert coalescer.offer(ProgressLine(step=1, loss=0.9), 10.0) == ProgressLine(step=1, loss=0.9)
    assert coalescer.offer(ProgressLine(step=2, loss=0.8), 10.1) is None
    for step in range(3, 1000):  # a workload printing a line per step
        assert coalescer.offer(ProgressLine(step=step, metrics={"acc": step / 1000}), 10.5) is None
    assert coalescer.due_in(10.5) == pytest.approx(0.5)
    merged = coalescer.take(11.0)
    assert merged == ProgressLine(step=999, loss=0.8, metrics={"acc": 0.999})  # loss kept from step 2
    assert coalescer.take(11.0) is None and coalescer.due_in(11.0) == 0.0
    many = ProgressLine(metrics={f"m{i}": float(i) for i in range(200)})
    assert len(reports.merge_progress(ProgressLine(), many).metrics) == reports.MAX_METRICS


def test_log_tails_are_cut_to_their_last_bytes() -> None:
    assert reports.cut_tail("short") == "short"
    cut = reports.cut_tail("x" * 100_000 + "the end")
    assert (
        cut.startswith("[...]")
        and cut.endswith("the end")
        and len(cut.encode()) <= reports.LOG_TAIL_BYTES + 6
    )


def test_end_reports() -> None:
    one_shard = cmd()
    done = JobShardCompleted(assignment_id="a1", worker_id="w1", slot=0, epoch=1)
    assert reports.ended(one_shard, "exited", 0, worker_id="w1") == [
        ("job.acme.j1.shard_completed", done, "a1-shard-completed")
    ]
    assert reports.ended(one_shard, "stopped", -15) == []
    assert reports.ended(one_shard, "superseded", -9) == []
    [(subject, failed, _)] = reports.ended(cmd(slot=2, epoch=5), "exited", 3, "tail")
    assert subject == "job.acme.j1.failed"
    assert failed == JobFailed(
        reason="exit status 3", epoch=5, slot=2, log_tail="tail", retryable=False, assignment_id="a1"
    )
    [(_, killed, _)] = reports.ended(cmd(), "exited", -9)
    assert killed.reason == "killed by SIGKILL"
    [(_, stopped, _)] = reports.ended(cmd(), "agent_stopped", -15)
    assert (stopped.reason, stopped.retryable) == ("agent stopped", True)
    [(subject, lost, _)] = reports.ended(cmd(work_kind="endpoint"), "exited", 1, "oops")
    assert subject == "endpoint.acme.j1.replica_lost"
    assert lost == EndpointReplicaLost(assignment_id="a1", epoch=1, reason="exit status 1", log_tail="oops")


def test_reported_lines_become_events_of_the_right_kind() -> None:
    job = cmd(epoch=3, slot=1)
    subject, progress, event_id = reports.reported(job, ProgressLine(loss=0.1, step=5), 2)  # type: ignore[misc]
    assert (subject, event_id) == ("job.acme.j1.progress", "a1-progress-2")
    assert (progress.epoch, progress.slot, progress.loss, progress.step) == (3, 1, 0.1, 5)
    subject, checkpoint, _ = reports.reported(job, CheckpointLine(object_key="k", round=2), 3)  # type: ignore[misc]
    assert (subject, checkpoint.object_key, checkpoint.epoch, checkpoint.slot) == (
        "job.acme.j1.checkpointed",
        "k",
        3,
        1,
    )
    assert reports.reported(job, ReadyLine(address="http://x"), 4) is None
    endpoint = cmd(work_kind="endpoint")
    subject, ready, _ = reports.reported(endpoint, ReadyLine(address="http://x:1"), 1)  # type: ignore[misc]
    assert (subject, ready.address) == ("endpoint.acme.j1.replica_ready", "http://x:1")
