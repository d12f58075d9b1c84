"""A node's verification as a Job (:mod:`ops.dispatcher.verification`): what is rendered for a challenge,
and a challenge from ``verify_worker`` to its claimed report, with the fake cluster of
:mod:`tests.support.fake_cluster` (the test is the kubelet) and the real verification program's
output. No NATS, no Kubernetes."""

from __future__ import annotations

import kubernetes_validate
import pytest

from agent.verify import format_report, run
from core.reports import Append
from core.streams import worker_subject
from core.verification import answer
from ops.dispatcher.cluster import ClusterRefused, ClusterUnreachable, Namespace
from ops.dispatcher.context import RenderContext
from ops.dispatcher.podstate import pod_state
from ops.dispatcher.reconcile import owned_work
from ops.dispatcher.verification import (
    CONTAINER,
    JOB,
    Verifications,
    verification_manifests,
    verification_namespace,
)
from schemas.commands import VerifyWorker
from schemas.workers import WorkerVerificationReported
from tests.support.fake_cluster import K8S, FakeCluster

CTX = RenderContext()
WORKER, NODE = "kernel-kc-gpu-a", "gpu-a"
CHALLENGE = VerifyWorker(challenge_id="vc-1f2e3d", seed="ab" * 16, size=32, rounds=2, deadline_s=120.0)
NS = verification_namespace(CHALLENGE.challenge_id, CTX)
T0 = 1_800_000_000_000


def objects(gpus: int = 2) -> dict[str, dict]:  # type: ignore[type-arg]
    return {m["kind"]: m for m in verification_manifests(CHALLENGE, WORKER, NODE, gpus, CTX)}


def test_a_challenge_is_a_hardened_job_pinned_to_its_node_with_every_gpu_and_no_network() -> None:
    made = objects(gpus=2)
    assert set(made) == {"Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "Job"}
    job = made["Job"]["spec"]
    pod = job["template"]["spec"]
    [container] = pod["containers"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": NODE}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"  # all of them, as on a host
    assert container["command"] == [
        "python3", "-m", "agent.verify", "--challenge-id", "vc-1f2e3d", "--seed", "ab" * 16,
        "--size", "32", "--rounds", "2",
    ]  # fmt: skip
    assert container["image"] == CTX.default_image and container["name"] == CONTAINER
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False and pod["initContainers"] == []
    assert job["activeDeadlineSeconds"] == 120 and job["backoffLimit"] == 0
    deny = made["NetworkPolicy"]["spec"]
    assert deny["ingress"] == [] and deny["egress"] == [] and deny["podSelector"] == {}
    assert made["ResourceQuota"]["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"  # the surge
    cpu_only = objects(gpus=0)["Job"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_only["containers"][0]["resources"]["limits"]
    assert "tolerations" not in cpu_only


@pytest.mark.parametrize("gpus", [0, 8])
def test_every_object_passes_strict_validation(gpus: int) -> None:
    for obj in verification_manifests(CHALLENGE, WORKER, NODE, gpus, CTX):
        kubernetes_validate.validate(obj, K8S, strict=True)


def test_a_verification_namespace_is_the_dispatchers_own_and_is_never_current() -> None:
    meta = objects()["Namespace"]["metadata"]
    ns = Namespace(meta["name"], meta["labels"], meta["annotations"], terminating=False)
    owned = owned_work(ns, lambda tenant, work, kind: verification_namespace(work, CTX))
    assert owned == ("kernel", CHALLENGE.challenge_id, "verify")
    assert meta["annotations"]["resontech.io/worker-id"] == WORKER


class Claims:
    def __init__(self) -> None:
        self.made: list[tuple[str, list[Append]]] = []
        self.stored = True

    async def __call__(self, worker_id: str, items: list[Append]) -> bool:
        self.made.append((worker_id, items))
        return self.stored

    def reports(self) -> list[WorkerVerificationReported]:
        return [event for _, items in self.made for _, event, _ in items]


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


def verifications(cluster: FakeCluster, claims: Claims, now: list[int]) -> Verifications:
    return Verifications(cluster, CTX, claims, clock_ms=lambda: now[0])


def pod_ended(cluster: FakeCluster, phase: str, log: str) -> None:
    """Be the kubelet: the Job's pod ended in ``phase`` with ``log``."""
    state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 137}}
    item = {
        "metadata": {"namespace": NS, "name": f"{JOB}-pod", "labels": {}},
        "spec": {"nodeName": NODE},
        "status": {"phase": phase, "containerStatuses": [{"name": CONTAINER, "state": state}]},
    }
    cluster.pod_list.append(pod_state(item))
    cluster.logs[(NS, f"{JOB}-pod")] = log


async def test_the_programs_report_is_claimed_as_the_workers_and_the_namespace_goes(
    cluster: FakeCluster,
) -> None:
    claims, now = Claims(), [T0]
    v = verifications(cluster, claims, now)
    await v.start(WORKER, NODE, 0, CHALLENGE)
    assert ("batch/v1", "Job", NS, JOB) in cluster.stored
    await v.poll()
    assert claims.made == []  # still running
    c = CHALLENGE
    printed = format_report(run("whatever-id", c.seed, c.size, c.rounds))  # the real program's line
    pod_ended(cluster, "Succeeded", f"some warning on stderr\n{printed}\n")
    await v.poll()
    [(worker, [(subject, report, claim_id)])] = claims.made
    assert (
        worker == WORKER
        and subject == worker_subject(WORKER, report)
        and claim_id == f"verify-{c.challenge_id}"
    )
    assert report.challenge_id == c.challenge_id  # the kernel's id, whatever the line said
    assert report.checksum == answer(c.seed, c.size, c.rounds) and report.error == ""
    assert f"Namespace {NS}" in cluster.deleted and v.pending == {}
    await v.start(WORKER, NODE, 0, CHALLENGE)  # the same command again: a new namespace, run again
    assert ("batch/v1", "Job", NS, JOB) in cluster.stored


async def test_the_report_is_found_after_a_long_log(cluster: FakeCluster) -> None:
    claims = Claims()
    v = verifications(cluster, claims, [T0])
    await v.start(WORKER, NODE, 0, CHALLENGE)
    c = CHALLENGE
    warnings = "".join(f"UserWarning: line {n} of what torch says first\n" for n in range(5000))
    pod_ended(cluster, "Succeeded", warnings + format_report(run(c.challenge_id, c.seed, c.size, c.rounds)))
    await v.poll()
    [report] = claims.reports()
    assert report.error == "" and report.checksum == answer(c.seed, c.size, c.rounds)


@pytest.mark.parametrize(
    ("phase", "log", "unreadable", "error"),
    [
        ("Failed", "Killed\n", False, "no report (pod Failed)"),
        ("Succeeded", 'RESONTECH_VERIFICATION {"not": "a report"}\n', False, "no report (pod Succeeded)"),
        ("Succeeded", "", True, "its log could not be read: log of pod"),
    ],
)
async def test_an_ended_pod_without_a_readable_report_is_answered_with_the_error(
    cluster: FakeCluster, phase: str, log: str, unreadable: bool, error: str
) -> None:
    claims = Claims()
    v = verifications(cluster, claims, [T0])
    await v.start(WORKER, NODE, 1, CHALLENGE)
    pod_ended(cluster, phase, log)
    if unreadable:
        cluster.unreadable.add(f"{NS}/{JOB}-pod")
    await v.poll()
    [report] = claims.reports()
    assert report.error.startswith(error) and report.challenge_id == CHALLENGE.challenge_id


async def test_the_deadline_answers_a_challenge_whose_pod_never_ran(cluster: FakeCluster) -> None:
    claims, now = Claims(), [T0]
    v = verifications(cluster, claims, now)
    await v.start(WORKER, NODE, 8, CHALLENGE)  # the node's GPUs are taken: the pod stays Pending
    now[0] = T0 + 119_999
    await v.poll()
    assert claims.made == []
    now[0] = T0 + 120_000
    await v.poll()
    assert [r.error for r in claims.reports()] == ["no answer within 120s"]


async def test_a_refused_apply_is_tried_again_and_an_unstored_claim_again_next_round(
    cluster: FakeCluster,
) -> None:
    claims, now = Claims(), [T0]
    v = verifications(cluster, claims, now)
    cluster.failure = ClusterRefused("namespaces is forbidden", status=403, reason="Forbidden")
    await v.start(WORKER, NODE, 0, CHALLENGE)
    assert not v.pending[CHALLENGE.challenge_id].applied and not cluster.stored
    cluster.failure = None
    await v.poll()
    assert v.pending[CHALLENGE.challenge_id].applied and ("batch/v1", "Job", NS, JOB) in cluster.stored
    pod_ended(cluster, "Failed", "")
    claims.stored = False  # the log is away: claimed again next round
    await v.poll()
    assert CHALLENGE.challenge_id in v.pending and f"Namespace {NS}" not in cluster.deleted
    claims.stored = True
    await v.poll()
    assert len(claims.made) == 2 and v.pending == {} and f"Namespace {NS}" in cluster.deleted


async def test_a_node_whose_name_cannot_be_rendered_is_answered_at_once(cluster: FakeCluster) -> None:
    claims = Claims()
    await verifications(cluster, claims, [T0]).start(WORKER, "Not A Label!", 0, CHALLENGE)
    [report] = claims.reports()
    assert report.error.startswith("cannot run on node 'Not A Label!'") and not cluster.stored


async def test_a_cluster_that_does_not_answer_holds_up_no_other_challenge(cluster: FakeCluster) -> None:
    claims = Claims()
    v = verifications(cluster, claims, [T0])
    cluster.failure = ClusterUnreachable("connection refused")
    await v.start(WORKER, NODE, 0, CHALLENGE)  # logged; applied next round
    other = VerifyWorker(challenge_id="vc-other", seed="cd" * 16, size=32, rounds=2, deadline_s=120.0)
    cluster.failure = None
    await v.start("kernel-kc-gpu-b", "gpu-b", 0, other)
    cluster.unreadable.add(f"{NS}/{JOB}-pod")
    pod_ended(cluster, "Succeeded", "")  # the first challenge's pod: its log read fails
    await v.poll()
    assert f"Namespace {NS}" in cluster.deleted  # applied in this round, then answered and deleted
    assert [r.challenge_id for r in claims.reports()] == [CHALLENGE.challenge_id]  # answered with the error
    assert "vc-other" in v.pending  # still running, unharmed
