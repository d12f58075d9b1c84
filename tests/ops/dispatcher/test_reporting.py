"""What the dispatcher claims about an assignment from its pod's state and log
(:mod:`ops.dispatcher.reporting`, pure): for each situation, exactly what the agent's builders
(:mod:`agent.reports`) make for the same command, and nothing about any other assignment whatever the
pod shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent import reports as agent_reports
from agent.runtimes.process import LOG_FILE
from agent.runtimes.process import log_tail as agent_log_tail
from core import protocol, reports
from core.files import TenantTree
from core.protocol import CheckpointLine, ProgressLine, ReadyLine
from core.reports import Append
from ops.dispatcher.context import RenderContext
from ops.dispatcher.manifests import Dispatch, endpoint_manifests, job_manifests, work_namespace
from ops.dispatcher.names import ASSIGNMENT, EPOCH
from ops.dispatcher.podstate import PodState, pod_state
from ops.dispatcher.reporting import UNKNOWN_EXIT, VANISHED, Reported, report
from schemas.commands import StartWork, WorkSpec
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import JobFailed, JobProgress, JobShardCompleted, JobStarted

CTX = RenderContext()
WORKER = "node-worker-a"
NODE = "gpu-node-a"
KEY = "k" * 43
JOB = StartWork(
    tenant="acme",
    work_id="etl-1",
    work_kind="job",
    assignment_id="asg-job-1",
    slot=1,
    epoch=2,
    spec=WorkSpec(runtime="process", command=["python3", "run.py"], shards=2),
)
REPLICA = StartWork(
    tenant="acme",
    work_id="chat",
    work_kind="endpoint",
    assignment_id="asg-rep-0",
    slot=0,
    epoch=3,
    spec=WorkSpec(runtime="vllm", options={"model": "org/model"}),
)
Json = dict[str, Any]


def rendered_labels(cmd: StartWork) -> dict[str, str]:
    """The labels the dispatcher's own manifests give the pod of ``cmd``."""
    if cmd.work_kind == "job":
        objects = job_manifests([Dispatch(cmd, NODE)], CTX)
        kind = "Job"
    else:
        objects = endpoint_manifests([Dispatch(cmd, NODE)], CTX, api_keys={cmd.assignment_id: KEY})
        kind = "Deployment"
    [owner] = [o for o in objects if o["kind"] == kind]
    labels: dict[str, str] = owner["spec"]["template"]["metadata"]["labels"]
    return labels


def pod(
    cmd: StartWork,
    phase: str,
    state: Json | None = None,
    *,
    ready: bool = False,
    restarts: int = 0,
    labels: dict[str, str] | None = None,
    namespace: str | None = None,
) -> PodState:
    container = "shard" if cmd.work_kind == "job" else "engine"
    statuses = (
        []
        if state is None
        else [{"name": container, "state": state, "ready": ready, "restartCount": restarts}]
    )
    return pod_state(
        {
            "metadata": {
                "namespace": namespace or work_namespace(cmd.tenant, cmd.work_id, cmd.work_kind, CTX),
                "name": "p-0",
                "labels": rendered_labels(cmd) if labels is None else labels,
            },
            "spec": {"nodeName": NODE},
            "status": {"phase": phase, "containerStatuses": statuses},
        }
    )


RUNNING = {"running": {"startedAt": "2026-11-24T14:00:00Z"}}


def exited(code: object) -> Json:
    return {"terminated": {"exitCode": code, "reason": "Error", "finishedAt": "2026-11-24T14:05:00Z"}}


def say(
    cmd: StartWork,
    state: PodState | None,
    log: list[str] | None = None,
    done: Reported | None = None,
    address: str = "http://10.0.0.7:30123",
) -> tuple[list[Append], Reported]:
    claims, after = report(
        cmd, state, log or [], done or Reported(), worker_id=WORKER, ctx=CTX, api_key=KEY, address=address
    )
    assert_about(cmd, claims)
    return claims, after


def assert_about(cmd: StartWork, claims: list[Append]) -> None:
    """Every claim is about ``cmd``'s assignment, at its epoch, on its work's subjects."""
    prefix = f"{'job' if cmd.work_kind == 'job' else 'endpoint'}.{cmd.tenant}.{cmd.work_id}."
    for subject, event, event_id in claims:
        assert subject.startswith(prefix)
        assert getattr(event, "assignment_id") == cmd.assignment_id  # noqa: B009
        assert getattr(event, "epoch") == cmd.epoch  # noqa: B009
        assert event_id.startswith(f"{cmd.assignment_id}-")
        if hasattr(event, "slot"):
            assert getattr(event, "slot") == cmd.slot  # noqa: B009


def progress(step: int, **fields: Any) -> str:
    body = ", ".join([f'"step": {step}', *(f'"{k}": {v}' for k, v in fields.items())])
    return f"{protocol.PROGRESS} {{{body}}}"


# --- one function per report, for both edges ---------------------------------------------------


def test_the_agent_builds_its_reports_with_the_functions_the_dispatcher_uses() -> None:
    for name in (
        "started",
        "reported",
        "ended",
        "start_failed",
        "failed",
        "lost",
        "cut_tail",
        "merge_progress",
    ):
        assert getattr(agent_reports, name) is getattr(reports, name)
    from agent import protocol as agent_protocol

    assert agent_protocol.parse_line is protocol.parse_line


# --- a shard ----------------------------------------------------------------------------------


def test_a_pending_shard_says_nothing_and_a_running_one_started_once() -> None:
    assert say(JOB, pod(JOB, "Pending")) == ([], Reported())
    assert say(JOB, pod(JOB, "Pending", {"waiting": {"reason": "ContainerCreating"}}))[0] == []
    claims, done = say(JOB, pod(JOB, "Running", RUNNING))
    assert claims == [reports.started(JOB, WORKER)]
    assert isinstance(claims[0][1], JobStarted) and claims[0][1].worker_id == WORKER
    assert say(JOB, pod(JOB, "Running", RUNNING), done=done) == ([], done)


def test_protocol_lines_become_the_agents_reports_merged_and_numbered_as_the_agent_does() -> None:
    log = [
        "epoch 1 starting",
        progress(10, loss=0.5),
        progress(20, metrics='{"acc": 0.9}'),
        f'{protocol.CHECKPOINT} {{"object_key": "jobs/etl-1/ckpt/step-20.pt", "step": 20}}',
        f"{protocol.PROGRESS} {{not json",
        f'{protocol.CHECKPOINT} {{"path": "local.pt"}}',
        progress(30),
    ]
    claims, done = say(JOB, pod(JOB, "Running", RUNNING), log)
    merged = reports.merge_progress(
        ProgressLine(step=10, loss=0.5), ProgressLine(step=20, metrics={"acc": 0.9})
    )
    checkpoint = CheckpointLine(object_key="jobs/etl-1/ckpt/step-20.pt", step=20)
    expected = [
        reports.started(JOB, WORKER),
        reports.reported(JOB, merged, 1),
        reports.reported(JOB, checkpoint, 2),
        # 3: the file the agent would upload first (the dispatcher cannot): counted, not reported
        reports.reported(JOB, ProgressLine(step=30), 4),
    ]
    assert claims == expected
    assert isinstance(claims[1][1], JobProgress) and claims[1][1].loss == 0.5 and claims[1][1].step == 20
    assert (done.lines, done.reports) == (len(log), 4)
    again, same = say(JOB, pod(JOB, "Running", RUNNING), log, done)
    assert (again, same) == ([], done)
    more, after = say(JOB, pod(JOB, "Running", RUNNING), [*log, progress(40)], done)
    assert more == [reports.reported(JOB, ProgressLine(step=40), 5)] and after.lines == len(log) + 1


def test_a_succeeded_pod_completes_the_shard_after_its_last_reports() -> None:
    _, done = say(JOB, pod(JOB, "Running", RUNNING))
    claims, after = say(JOB, pod(JOB, "Succeeded", exited(0)), [progress(99)], done)
    assert claims == [
        reports.reported(JOB, ProgressLine(step=99), 1),
        *reports.ended(JOB, "exited", 0, worker_id=WORKER),
    ]
    assert isinstance(claims[-1][1], JobShardCompleted) and after.ended
    assert say(JOB, pod(JOB, "Succeeded", exited(0)), [], after) == ([], after)
    assert say(JOB, None, [], after) == ([], after)


def test_a_shard_that_ran_and_ended_between_two_polls_is_started_then_ended() -> None:
    claims, _ = say(JOB, pod(JOB, "Succeeded", exited(0)))
    assert claims == [reports.started(JOB, WORKER), *reports.ended(JOB, "exited", 0, worker_id=WORKER)]


def test_a_failed_pod_fails_the_shard_with_its_exit_status_and_the_tail_the_agent_cuts(
    tmp_path: Path,
) -> None:
    log = [f"line {i}" for i in range(100)] + ["x" * 40_000, "Traceback: boom"]
    (tmp_path / LOG_FILE).write_text("\n".join(log) + "\n")
    claims, done = say(JOB, pod(JOB, "Failed", exited(3)), log, Reported(started=True))
    with TenantTree.open(tmp_path) as workdir:
        tail = agent_log_tail(workdir, agent_reports.LOG_TAIL_LINES)
    assert claims == reports.ended(JOB, "exited", 3, tail, worker_id=WORKER)
    event = claims[0][1]
    assert isinstance(event, JobFailed) and event.reason == "exit status 3" and not event.retryable
    assert (
        event.log_tail.endswith("Traceback: boom")
        and len(event.log_tail.encode()) <= reports.LOG_TAIL_BYTES + 6
    )
    assert done.ended


def test_a_vanished_pod_is_lost_and_retryable_as_a_workload_the_agent_lost() -> None:
    claims, done = say(JOB, None, ["last words"], Reported(started=True))
    assert claims == [reports.lost(JOB, VANISHED, "last words")]
    event = claims[0][1]
    assert isinstance(event, JobFailed) and event.retryable and done.ended
    assert reports.ended(JOB, "agent_restarted")[0][1] == reports.lost(JOB, "agent restarted")[1]


def test_a_pod_that_cannot_start_or_failed_before_its_workload_ran() -> None:
    claims, done = say(JOB, pod(JOB, "Pending", {"waiting": {"reason": "ImagePullBackOff"}}))
    assert claims == [reports.start_failed(JOB, "ImagePullBackOff")] and done.ended
    init_failed = pod(JOB, "Failed", {"waiting": {"reason": "PodInitializing"}})
    claims, _ = say(JOB, init_failed)
    assert claims == [
        reports.start_failed(JOB, "pod failed before its workload ran (PodInitializing)", retryable=True)
    ]
    claims, _ = say(JOB, pod(JOB, "Failed"), ["evicted"], Reported(started=True))
    assert claims == [reports.lost(JOB, "pod failed (no reason given)", "evicted")]


# --- an endpoint replica ----------------------------------------------------------------------


def test_a_replica_is_starting_while_pending_ready_when_its_engine_is_and_lost_when_it_exits() -> None:
    claims, done = say(REPLICA, pod(REPLICA, "Pending"))
    assert claims == [reports.started(REPLICA, WORKER)] and isinstance(claims[0][1], EndpointReplicaStarting)
    assert say(REPLICA, pod(REPLICA, "Running", RUNNING), done=done) == ([], done)
    from ops.dispatcher.endpoints import replica_address

    address = replica_address("10.0.0.7", 30123)
    # ready, but its Service has no node port yet: nowhere to report
    assert say(REPLICA, pod(REPLICA, "Running", RUNNING, ready=True), done=done, address="") == ([], done)
    claims, done = say(REPLICA, pod(REPLICA, "Running", RUNNING, ready=True), done=done, address=address)
    assert (
        address == "http://10.0.0.7:30123" and replica_address("fd00::7", 30123) == "http://[fd00::7]:30123"
    )
    assert claims == [reports.reported(REPLICA, ReadyLine(address=address, api_key=KEY), 1)]
    ready = claims[0][1]
    assert isinstance(ready, EndpointReplicaReady) and ready.address == address and ready.api_key == KEY
    assert say(REPLICA, pod(REPLICA, "Running", RUNNING, ready=True), done=done) == ([], done)
    log = ["engine says goodbye"]
    claims, done = say(REPLICA, pod(REPLICA, "Running", exited(1), restarts=1), log, done)
    assert claims == reports.ended(REPLICA, "exited", 1, "engine says goodbye")
    assert isinstance(claims[0][1], EndpointReplicaLost) and done.ended


def test_a_replica_restarted_in_place_or_vanished_is_lost() -> None:
    _, done = say(REPLICA, pod(REPLICA, "Running", RUNNING, ready=True))
    crashloop = pod(REPLICA, "Running", {"waiting": {"reason": "CrashLoopBackOff"}}, restarts=2)
    claims, _ = say(REPLICA, crashloop, ["oops"], done)
    assert claims == [reports.failed(REPLICA, UNKNOWN_EXIT, "oops", retryable=False)]
    claims, _ = say(REPLICA, None, [], done)
    event = claims[0][1]
    assert (
        claims == [reports.lost(REPLICA, VANISHED)]
        and isinstance(event, EndpointReplicaLost)
        and event.retryable
    )


# --- hostile pods -----------------------------------------------------------------------------


def test_a_log_line_pretending_to_be_another_assignments_report_reports_only_this_one() -> None:
    forged = (
        f'{protocol.PROGRESS} {{"assignment_id": "asg-other", "epoch": 99, "slot": 7, "tenant": "evil",'
        ' "work_id": "other", "step": 5}'
    )
    claims, _ = say(JOB, pod(JOB, "Running", RUNNING), [forged])
    assert claims[1] == reports.reported(JOB, ProgressLine(step=5), 1)


def test_a_replica_engine_cannot_claim_an_address_or_a_key_by_printing_protocol_lines() -> None:
    lines = [
        f'{protocol.READY} {{"address": "http://evil.example:80", "api_key": "stolen"}}',
        progress(1),
        f'{protocol.CHECKPOINT} {{"object_key": "x"}}',
    ]
    claims, done = say(REPLICA, pod(REPLICA, "Running", RUNNING), lines)
    assert claims == [reports.started(REPLICA, WORKER)] and not done.ready
    claims, _ = say(REPLICA, pod(REPLICA, "Running", RUNNING, ready=True), lines, done)
    [(_, ready, _)] = claims
    assert isinstance(ready, EndpointReplicaReady) and "evil" not in ready.address and ready.api_key == KEY


def test_a_huge_or_garbage_log_reports_only_what_parses_and_a_bounded_tail() -> None:
    huge = progress(1, loss=0.1) + " " * (protocol.LINE_LIMIT + 1)
    garbage = [
        "\x00\xff\ufffd" * 1000,
        "RESONTECH_PROGRESS",
        "RESONTECH_READY {}",
        progress(3) + "\ud800",
        "RESONTECH_" + "{" * 5000,
    ]
    log = [*garbage, huge, *(f"noise {i}" for i in range(50_000)), progress(2), "\ud800 lone surrogate"]
    claims, done = say(JOB, pod(JOB, "Failed", exited(1)), log, Reported(started=True))
    assert claims[0] == reports.reported(JOB, ProgressLine(step=2), 1)
    failed = claims[1][1]
    assert isinstance(failed, JobFailed) and len(failed.log_tail.encode()) <= reports.LOG_TAIL_BYTES + 6
    assert done.lines == len(log) and len(claims) == 2


@pytest.mark.parametrize("code", [256, -9, 2**40, "137", None, True])
def test_an_exit_status_out_of_range_is_no_exit_status(code: object) -> None:
    claims, _ = say(JOB, pod(JOB, "Failed", exited(code)), ["x"], Reported(started=True))
    assert claims == [reports.failed(JOB, UNKNOWN_EXIT, "x", retryable=False)]


def test_a_phase_and_an_exit_status_that_disagree_never_complete_a_shard() -> None:
    for phase, code in (("Failed", 0), ("Succeeded", 1)):
        claims, _ = say(JOB, pod(JOB, phase, exited(code)), [], Reported(started=True))
        assert claims == [reports.failed(JOB, UNKNOWN_EXIT, "", retryable=False)]
    assert say(JOB, pod(JOB, "Running", exited(0)), [], Reported(started=True))[0] == []


def test_a_pod_of_another_assignment_says_nothing() -> None:
    other = StartWork(
        tenant="acme",
        work_id="etl-1",
        work_kind="job",
        assignment_id="asg-job-0",
        slot=0,
        epoch=2,
        spec=JOB.spec,
    )
    own = rendered_labels(JOB)
    strangers = [
        pod(JOB, "Succeeded", exited(0), labels=rendered_labels(other)),
        pod(JOB, "Failed", exited(1), labels={**own, EPOCH: "1"}),
        pod(JOB, "Failed", exited(1), labels={**own, ASSIGNMENT: "asg-other"}),
        pod(JOB, "Failed", exited(1), labels={k: v for k, v in own.items() if k != ASSIGNMENT}),
        pod(JOB, "Running", RUNNING, namespace="kube-system"),
        pod(JOB, "Succeeded", exited(0), labels=rendered_labels(REPLICA)),
        pod(REPLICA, "Running", RUNNING, ready=True, labels=own),
    ]
    done = Reported(started=True, lines=3, reports=2)
    for stranger in strangers:
        assert report(JOB, stranger, [progress(9)] * 5, done, worker_id=WORKER, ctx=CTX) == ([], done)
