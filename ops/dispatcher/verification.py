"""A node's verification as a Job: the kernel's challenge (``verify_worker``) answered on the node itself
by the agent's own verification program (:mod:`agent.verify`), its report claimed on the intake as an
agent claims it. The intake judges the answer (the checksum, the GPUs NVML shows, the throughput floor)
exactly as it judges an agent's: the dispatcher only carries it, and the cluster may be a stranger's.

Each challenge gets a namespace of its own (:func:`verification_namespace`: kind ``verify``, the
challenge id as the work, tenant ``kernel``), fenced like a work's (restricted pod security, a quota of
the one pod, default deny with no allow rule: the program needs no network), and in it one Job:

* pinned to the node, requesting every GPU the node lists (the program measures GPU 0 with all of them
  visible, as on an agent's host), 1 CPU and :data:`MEMORY_MB`;
* the project's image (:attr:`~ops.dispatcher.context.RenderContext.default_image`), hardened as every
  pod the dispatcher makes, with no credential of any kind;
* ``activeDeadlineSeconds`` the challenge's deadline: a pod that cannot be scheduled (the node's GPUs
  are taken) or hangs fails, and its report says so.

Every round, each pending challenge's pod is looked at: once it ended, the report line of its log
(the last one) is claimed; no report, a log that cannot be read or a deadline passed is claimed as an
answer with the error (the kernel decides what it means: a failed verification, tried again later).
The namespace is deleted once the claim is stored. A dispatcher that restarts forgets what was
pending: its reconcile deletes the namespace, the kernel's challenge expires, and the kernel
challenges the worker again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from agent.verify import parse_report
from core.errors import ResontechError
from core.streams import worker_subject
from ops.dispatcher import names, pods
from ops.dispatcher.context import RenderContext
from ops.dispatcher.policies import PodSize, default_deny, limit_range, metadata, namespace, resource_quota
from ops.dispatcher.rounds import Claim, ClusterPort
from schemas.commands import VerifyWorker
from schemas.workers import WorkerVerificationReported

log = logging.getLogger("resontech.dispatcher")
Manifest = dict[str, Any]
KIND = "verify"
"""The work kind of a verification namespace (its label and the hash of its name)."""
TENANT = "kernel"
"""The tenant a verification namespace is named for: the kernel's own work, no tenant's."""
CONTAINER = "verify"
MEMORY_MB = 4096
"""The verification container's memory: torch and CUDA's context on a GPU node, the 1 GiB ``/tmp``."""
JOB = "verify"
TAIL_LINES = 100
"""The lines of the program's log read for its report (its last line; torch's warnings may precede it)."""
WORKER_ID = f"{names.DOMAIN}/worker-id"
"""An annotation of the verification namespace: the worker the challenge is for."""


def verification_namespace(challenge_id: str, ctx: RenderContext) -> str:
    """The namespace of one challenge."""
    return names.namespace_name(ctx.namespace_prefix, TENANT, challenge_id, KIND)


def verification_manifests(
    cmd: VerifyWorker, worker_id: str, node: str, gpus: int, ctx: RenderContext
) -> list[Manifest]:
    """The objects of one challenge on ``node``, which lists ``gpus`` GPUs (module docstring).

    Raises:
        ManifestError: the node's name or the challenge's id cannot be rendered.
    """
    ns = verification_namespace(cmd.challenge_id, ctx)
    labels = names.work_labels(TENANT, cmd.challenge_id, KIND, 1)
    annotations = {**names.work_annotations(TENANT, cmd.challenge_id), WORKER_ID: worker_id}
    size = PodSize(1.0, MEMORY_MB, gpus)
    argv = [
        ctx.python, "-m", "agent.verify", "--challenge-id", cmd.challenge_id,
        "--seed", cmd.seed, "--size", str(cmd.size), "--rounds", str(cmd.rounds),
    ]  # fmt: skip
    env = pods.env_list({"HOME": "/tmp"})
    argv = [pods.escape(arg) for arg in argv]
    container = pods.main_container(CONTAINER, ctx.default_image, argv, env, size, ctx)
    spec = pods.pod_spec(ctx, [container], init=[], inputs_secret=None, restart="Never", gpus=gpus, node=node)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(JOB, ns, labels, {}),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, round(cmd.deadline_s)),
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }
    return [
        namespace(ns, labels, annotations),
        resource_quota(ns, labels, [size], 0, ctx),
        limit_range(ns, labels, [size], ctx),
        default_deny(ns, labels),
        job,
    ]


def report_of(log_text: str, challenge_id: str) -> WorkerVerificationReported | None:
    """The last report line of the program's log, for ``challenge_id`` (the id is the kernel's, whatever
    the line says), or ``None``."""
    for line in reversed(log_text.splitlines()):
        report = parse_report(line)
        if report is not None:
            return msgspec.structs.replace(report, challenge_id=challenge_id)
    return None


@dataclass
class Pending:
    """A challenge the dispatcher runs: its objects, whether they were applied, and its deadline."""

    cmd: VerifyWorker
    worker_id: str
    objects: list[Manifest]
    deadline_ms: int
    applied: bool = False


class Verifications:
    """The challenges of the cluster's nodes, from ``verify_worker`` to the claimed report.

    Args:
        cluster: the cluster's API server.
        ctx: the operator's rendering settings.
        claim: how a report is claimed on the intake (as the node-worker).
        clock_ms: the wall clock, Unix ms (tests move it).
    """

    def __init__(
        self,
        cluster: ClusterPort,
        ctx: RenderContext,
        claim: Claim,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.cluster = cluster
        self.ctx = ctx
        self.claim = claim
        self.clock_ms = clock_ms
        self.pending: dict[str, Pending] = {}
        """challenge id -> the challenge, until its report is claimed."""

    async def start(self, worker_id: str, node: str, gpus: int, cmd: VerifyWorker) -> None:
        """Run ``cmd`` on ``node``; a challenge that cannot be rendered is answered with the reason."""
        if cmd.challenge_id in self.pending:
            return
        try:
            objects = verification_manifests(cmd, worker_id, node, gpus, self.ctx)
        except ResontechError as exc:
            await self._answer(worker_id, cmd, _failed(cmd, f"cannot run on node {node!r}: {exc.message}"))
            return
        deadline = self.clock_ms() + round(cmd.deadline_s * 1000)
        self.pending[cmd.challenge_id] = Pending(cmd, worker_id, objects, deadline)
        log.info("worker %s: verification %s runs as a Job on node %s", worker_id, cmd.challenge_id, node)
        await self._apply(self.pending[cmd.challenge_id])

    async def poll(self) -> None:
        """Apply what is not applied yet, and claim the reports of the challenges that ended; a
        challenge the cluster cannot answer about now waits for the next round, the others go on."""
        for challenge in list(self.pending.values()):
            try:
                if not challenge.applied:
                    await self._apply(challenge)
                report = await self._ended(challenge)
                if report is not None:
                    await self._answer(challenge.worker_id, challenge.cmd, report)
            except ResontechError as exc:
                log.warning("verification %s: %s", challenge.cmd.challenge_id, exc.message)

    async def _apply(self, challenge: Pending) -> None:
        try:
            await self.cluster.apply(challenge.objects)
            challenge.applied = True
        except ResontechError as exc:  # refused or away: tried again next round, until the deadline
            log.warning("verification %s: not applied: %s", challenge.cmd.challenge_id, exc.message)

    async def _ended(self, challenge: Pending) -> WorkerVerificationReported | None:
        """The report of a challenge that ended (its pod, or its deadline), else ``None``."""
        cmd = challenge.cmd
        ns = verification_namespace(cmd.challenge_id, self.ctx)
        done = [p for p in await self.cluster.pods(ns) if p.phase in ("Succeeded", "Failed")]
        if done:
            pod = done[0]
            try:
                text = await self.cluster.pod_log(
                    ns, pod.name, CONTAINER, tail_lines=TAIL_LINES, timestamps=False
                )
            except ResontechError as exc:
                return _failed(cmd, f"its log could not be read: {exc.message}")
            return report_of(text, cmd.challenge_id) or _failed(cmd, f"no report (pod {pod.phase})")
        if self.clock_ms() >= challenge.deadline_ms:
            return _failed(cmd, f"no answer within {cmd.deadline_s:g}s")
        return None

    async def _answer(self, worker_id: str, cmd: VerifyWorker, report: WorkerVerificationReported) -> None:
        """Claim ``report`` (once stored, the challenge and its namespace go)."""
        item = (worker_subject(worker_id, report), report, f"verify-{cmd.challenge_id}")
        if not await self.claim(worker_id, [item]):
            return
        verdict = f"error: {report.error}" if report.error else f"answered in {report.elapsed_ms} ms"
        log.info("worker %s: verification %s claimed (%s)", worker_id, cmd.challenge_id, verdict)
        if self.pending.pop(cmd.challenge_id, None) is not None:
            await self.cluster.delete_namespace(verification_namespace(cmd.challenge_id, self.ctx))


def _failed(cmd: VerifyWorker, error: str) -> WorkerVerificationReported:
    return WorkerVerificationReported(challenge_id=cmd.challenge_id, error=error)
