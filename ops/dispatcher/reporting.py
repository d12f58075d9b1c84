"""From what a cluster shows about one assignment's pod to the reports an agent would send. Pure.

The dispatcher speaks the agent protocol (docs/dispatcher.md): for each assignment it reads the pod's
state (:mod:`ops.dispatcher.podstate`) and log, and claims on ``intake.<node worker>.…`` exactly what
an agent would claim for the same situation, built by the same functions (:mod:`core.reports`, the
log lines parsed by :mod:`core.protocol`). What it already said is a small record, :class:`Reported`,
so that each report goes out once across polls and restarts (event ids are the agent's, derived from
the assignment id and the report's number, so a repeated claim is stored once).

=====================================  ===========================================================
the pod                                claims
=====================================  ===========================================================
Pending                                nothing; a replica: ``replica_starting`` (once)
Pending, its container cannot start    ``start_failed`` (``cannot start: <reason>``), not retryable
(:data:`START_FAILURES`)
Running                                ``started`` (once), then ``reported`` for each new protocol
                                       line (progress merged as the agent merges it, checkpoints
                                       already written to the workspace); a replica whose engine is
                                       ready: ``replica_ready`` with its address and key
Succeeded, the container exited 0      ``shard_completed`` (a replica: ``replica_lost``, exit 0)
Failed, the container exited 1..255    ``failed`` / ``replica_lost``: ``exit status N``, the log tail
Failed (or Succeeded) with no valid    ``failed``: :data:`UNKNOWN_EXIT`, the log tail
exit status
Failed before the workload ran         ``start_failed``, retryable (the inputs' fetch, an eviction)
a replica's container restarted        ``replica_lost`` (the engine exited, as the agent reports it)
vanished (``None``)                    ``lost``: failed, retryable, as the agent reports a workload
                                       it lost
=====================================  ===========================================================

What a pod shows is a claim of the cluster's, which may be a tenant's or a provider's: every claim is
built from the kernel's ``StartWork`` (tenant, work, assignment, epoch, slot), never from the pod; a
pod whose labels or namespace are not this assignment's is ignored; a replica's log is never read for
protocol lines (as the agent drops what an engine prints, an engine cannot claim an address or key);
an exit status outside 0..255 is no exit status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from core import reports
from core.protocol import LINE_LIMIT, CheckpointLine, ProgressLine, ProtocolError, ReadyLine, parse_line
from core.reports import Append
from ops.dispatcher.context import RenderContext
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.names import ASSIGNMENT, EPOCH, ROLE, label_value
from ops.dispatcher.podstate import ContainerState, PodState
from schemas.commands import StartWork

WORKLOAD_CONTAINER = {"job": "shard", "endpoint": "engine"}
"""The container that runs the work, by work kind (:mod:`ops.dispatcher.shards`, ``endpoints``)."""
ROLES = {"job": "shard", "endpoint": "replica"}
START_FAILURES = frozenset(
    {"InvalidImageName", "ErrImageNeverPull", "ImagePullBackOff", "CreateContainerConfigError"}
)
"""Reasons a container waits that mean it will not start (Kubernetes would retry them forever)."""
MAX_EXIT = 255
UNKNOWN_EXIT = "exit status unknown"
VANISHED = "pod vanished"


@dataclass(frozen=True)
class Reported:
    """What was already reported for one assignment.

    Attributes:
        started: ``started`` (``replica_starting``) went out.
        ready: a replica's ``replica_ready`` went out.
        lines: how many lines of the pod's log were read.
        reports: how many protocol reports were counted (the ``n`` of :func:`core.reports.reported`).
        ended: the end went out; nothing more is said about the assignment.
    """

    started: bool = False
    ready: bool = False
    lines: int = 0
    reports: int = 0
    ended: bool = False


def report(
    cmd: StartWork,
    pod: PodState | None,
    log: Sequence[str],
    done: Reported,
    *,
    worker_id: str,
    ctx: RenderContext,
    api_key: str = "",
    address: str = "",
) -> tuple[list[Append], Reported]:
    """The claims to publish about ``cmd``'s assignment now, and what will then have been reported.

    Args:
        cmd: the assignment, as the kernel sent it.
        pod: its pod, or ``None`` when it vanished.
        log: the pod's log lines so far, from its first (``done.lines`` of them were read before).
        done: what was reported before (``Reported()`` at first).
        worker_id: the node-worker the assignment was placed on.
        ctx: the dispatcher's rendering settings (a replica's address).
        api_key: a replica's key, as put in its Secret.
        address: where a replica serves (:func:`~ops.dispatcher.endpoints.replica_address`), once its
            Service has a node port; a replica is not reported ready before.
    """
    if done.ended:
        return [], done
    if pod is None:
        return [reports.lost(cmd, VANISHED, reports.tail_of(log))], replace(done, ended=True)
    if not belongs(cmd, pod, ctx):
        return [], done
    container = workload_container(cmd, pod)
    early = _before_running(cmd, pod, container, log, done)
    if early is not None:
        return early
    claims: list[Append] = []
    if not done.started and (pod.phase != "Pending" or cmd.work_kind == "endpoint"):
        claims.append(reports.started(cmd, worker_id))
        done = replace(done, started=True)
    if cmd.work_kind == "job":
        said, done = read_lines(cmd, log, done)
        claims += said
    elif _ready(pod, container) and address and not done.ready:
        ready = reports.reported(cmd, ReadyLine(address=address, api_key=api_key), done.reports + 1)
        claims += [ready] if ready is not None else []
        done = replace(done, ready=True, reports=done.reports + 1)
    end = _end(cmd, pod, container, log, worker_id)
    if end:
        done = replace(done, ended=True)
    return claims + end, done


def belongs(cmd: StartWork, pod: PodState, ctx: RenderContext) -> bool:
    """Whether ``pod`` is the one the dispatcher made for ``cmd``: its namespace, role, assignment and
    epoch labels."""
    labels = pod.labels
    return (
        pod.namespace == work_namespace(cmd.tenant, cmd.work_id, cmd.work_kind, ctx)
        and labels.get(ROLE) == ROLES[cmd.work_kind]
        and labels.get(ASSIGNMENT) == label_value(cmd.assignment_id)
        and labels.get(EPOCH) == str(cmd.epoch)
    )


def workload_container(cmd: StartWork, pod: PodState) -> ContainerState:
    """The container running the work (``unknown`` if the kubelet has not reported it)."""
    name = WORKLOAD_CONTAINER[cmd.work_kind]
    found = [c for c in pod.containers if c.name == name]
    return found[0] if found else ContainerState(name=name, state="unknown")


def read_lines(cmd: StartWork, log: Sequence[str], done: Reported) -> tuple[list[Append], Reported]:
    """The reports of the log's lines not read yet: progress lines in a row merge into one (as the
    agent coalesces them), sent before any other report and at the end; a malformed line, or one
    longer than :data:`LINE_LIMIT`, is skipped, as the agent skips it."""
    claims: list[Append] = []
    count = done.reports
    pending: ProgressLine | None = None

    def send(line: ProgressLine | CheckpointLine | ReadyLine | None) -> None:
        nonlocal count
        if line is not None:
            count += 1
            claim = reports.reported(cmd, line, count)
            claims.extend([claim] if claim is not None else [])

    for text in log[done.lines :]:
        line = _parse(text)
        if isinstance(line, ProgressLine):
            pending = line if pending is None else reports.merge_progress(pending, line)
        elif line is not None:
            send(pending)
            pending = None
            send(line)
    send(pending)
    return claims, replace(done, lines=max(done.lines, len(log)), reports=count)


def _parse(text: str) -> ProgressLine | CheckpointLine | ReadyLine | None:
    if len(text) > LINE_LIMIT or len(text.encode(errors="replace")) > LINE_LIMIT:
        return None
    try:
        return parse_line(text)
    except ProtocolError:
        return None


def _before_running(
    cmd: StartWork, pod: PodState, container: ContainerState, log: Sequence[str], done: Reported
) -> tuple[list[Append], Reported] | None:
    """The end of an assignment whose workload never ran, or ``None`` if it runs or may still."""
    ended = replace(done, ended=True)
    if container.state == "waiting" and container.reason in START_FAILURES:
        return [reports.start_failed(cmd, container.reason)], ended
    if pod.phase == "Failed" and container.state != "terminated":
        why = container.reason or "no reason given"
        if done.started:  # it ran (a replica is starting from Pending): lost, not its fault
            return [reports.lost(cmd, f"pod failed ({why})", reports.tail_of(log))], ended
        return [
            reports.start_failed(cmd, f"pod failed before its workload ran ({why})", retryable=True)
        ], ended
    return None


def _ready(pod: PodState, container: ContainerState) -> bool:
    return pod.phase == "Running" and container.state == "running" and container.ready


def _end(
    cmd: StartWork, pod: PodState, container: ContainerState, log: Sequence[str], worker_id: str
) -> list[Append]:
    """The end's claims, or none while the work runs."""
    over = pod.phase in ("Succeeded", "Failed")
    if cmd.work_kind == "endpoint":  # restarted in place by its Deployment: the engine exited
        over = over or container.state == "terminated" or container.restarts > 0
    if not over:
        return []
    code = _exit_code(container)
    if cmd.work_kind == "job" and code is not None and (pod.phase == "Succeeded") != (code == 0):
        code = None  # the phase and the exit status disagree: neither is believed
    if code is None:
        return [reports.failed(cmd, UNKNOWN_EXIT, reports.tail_of(log), retryable=False)]
    return reports.ended(cmd, "exited", code, reports.tail_of(log), worker_id=worker_id)


def _exit_code(container: ContainerState) -> int | None:
    """The container's exit status, if it terminated with one in 0..255."""
    code = container.exit_code
    if container.state != "terminated" or code is None or not 0 <= code <= MAX_EXIT:
        return None
    return code
