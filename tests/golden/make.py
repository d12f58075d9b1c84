"""The golden event history and the projections it must rebuild.

``python -m tests.golden.make`` rewrites ``history.jsonl`` from the scenario below (fixed times, fixed
ids: the same bytes on every run) and reports whether the committed projections still match it;
``--bless`` also rewrites ``projections/<name>.json`` and ``hashes.json`` from a fold of that file.
Bless only after reading the diff: the committed files are the contract that replay must honour.

The scenario, 2026-03-31 23:50 UTC to 2026-04-01 00:14 UTC (so billing spans two months):

* tenants ``acme`` and ``globex``; workers ``w-h100-a`` (platinum), ``w-4090-b`` (gold, lost at 7 min
  and recovered at 10) and ``w-l40s-c`` (silver, managed pool, cordoned and re-registered with a new
  driver);
* ``j-llama``: DDP, 2 shards, completed, then a late progress event that must not resurrect it;
* ``j-flmnist``: federated; slot 0 is revoked with its lost worker and re-placed at epoch 2; a zombie
  progress and checkpoint of epoch 1 and a repeated revocation must be ignored;
* ``j-berteval``: a retryable shard failure, re-placement, then a terminal job failure;
* ``j-sweep``: rejected by a provider policy, re-queued, cancelled;
* ``ep-chat``: 2 replicas, one lost with its worker and re-placed (its zombie ``ready`` ignored), the
  other lost at the end with its engine (a ``ready`` after that ignored);
* each worker verified after it registered (``w-h100-a`` after one failed challenge);
* metering ticks of every running assignment, one sent twice under a new event id, and a gateway's
  token counts of the endpoint's replicas, in the LEGACY layout of METERING (``meter.<tenant>.<worker>``
  and ``.tokens``, before one subject per assignment): old logs must still bill the same; heartbeats;
* provider ``gpuco``: keys, an enrolled agent whose credentials are revoked, a managed-pool
  enrollment token revoked unused.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from core.streams import (
    endpoint_subject,
    heartbeat_subject,
    job_subject,
    provider_subject,
    stream_for_subject,
    tenant_subject,
    worker_subject,
)
from projections import ALL
from projections.base import Projection, canonical_json, state_hash
from schemas._base import Event
from schemas.catalog import decode
from schemas.endpoints import (
    EndpointDeployed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaRevoked,
    EndpointReplicaStarting,
    EndpointScaled,
)
from schemas.envelope import Recorded
from schemas.jobs import (
    FederatedTraining,
    JobAssignmentRevoked,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobFederationReady,
    JobFederationRun,
    JobPlaced,
    JobProgress,
    JobQueued,
    JobRejected,
    JobResources,
    JobRoundCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
    ProviderCreated,
    ProviderKeyIssued,
    ProviderKeyRevoked,
)
from schemas.tenants import ApiKeyIssued, ApiKeyRevoked, QuotaSet, TenantCreated
from schemas.values import Assignment, Gpu, GpuTelemetry, Provenance, ScoreCard
from schemas.workers import (
    Heartbeat,
    WorkerCordoned,
    WorkerLost,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRecovered,
    WorkerRegistered,
    WorkerUncordoned,
    WorkerVerificationFailed,
    WorkerVerificationRequested,
    WorkerVerified,
)

HERE = Path(__file__).resolve().parent
HISTORY = HERE / "history.jsonl"
PROJECTIONS = HERE / "projections"
HASHES = HERE / "hashes.json"

T0_MS = 1_775_001_000_000
"""2026-03-31T23:50:00Z: every time in the scenario is minutes after this."""
TICK_MS = 90_000
"""The agents' metering interval in the scenario."""


def _ms(minute: float) -> int:
    return T0_MS + round(minute * 60_000)


class _Scenario:
    """Events placed on a timeline; :meth:`records` orders them and gives them sequences and ids."""

    def __init__(self) -> None:
        self._entries: list[tuple[int, int, str, Event]] = []

    def at(self, minute: float, subject: str, event: Event) -> None:
        self._entries.append((_ms(minute), len(self._entries), subject, event))

    def at_ms(self, ms: int, subject: str, event: Event) -> None:
        self._entries.append((ms, len(self._entries), subject, event))

    def on(self, subject: Callable[[Event], str]) -> At:
        """A function placing events of one aggregate (``subject`` names it) on the timeline."""
        return lambda minute, event: self.at(minute, subject(event), event)

    def records(self) -> list[Recorded[Any]]:
        seqs: dict[str, int] = {}
        out: list[Recorded[Any]] = []
        for n, (ms, _, subject, event) in enumerate(sorted(self._entries, key=lambda e: (e[0], e[1]))):
            stream = stream_for_subject(subject).name
            seq = seqs[stream] = seqs.get(stream, 0) + 1
            out.append(
                Recorded(
                    stream=stream,
                    seq=seq,
                    subject=subject,
                    time_ns=ms * 1_000_000 + n,
                    msg_id=f"evt-{n + 1:05d}",
                    event=event,
                )
            )
        return out


H100 = Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81559, vram_free_mb=80800)
L40S = Gpu(index=0, model="NVIDIA L40S", vram_total_mb=46068, vram_free_mb=45500)
RTX4090 = Gpu(index=0, model="NVIDIA GeForce RTX 4090", vram_total_mb=24564, vram_free_mb=24000)
PROVIDERS = {
    "w-h100-a": ("nordic-gpu", "platinum"),
    "w-4090-b": ("garage-labs", "gold"),
    "w-l40s-c": ("halcyon-compute", "silver"),
}
GPU_TYPES = {"w-h100-a": "H100", "w-4090-b": "RTX4090", "w-l40s-c": "L40S"}
At = Callable[[float, Event], None]


def _gpus(gpu: Gpu, n: int, host: str) -> list[Gpu]:
    return [msgspec.structs.replace(gpu, index=i, uuid=f"GPU-{host}-{i}") for i in range(n)]


def _workers(s: _Scenario) -> None:
    a, b, c = (s.on(functools.partial(worker_subject, w)) for w in ("w-h100-a", "w-4090-b", "w-l40s-c"))
    common: dict[str, Any] = {"driver": "550.54.15", "agent_version": "0.1.0"}
    a(
        0,
        WorkerRegistered(
            provider="nordic-gpu",
            hostname="h100a.nordic.example",
            region="eu-north",
            gpus=_gpus(H100, 4, "h100a"),
            cpus=96,
            memory_mb=1_031_000,
            labels={"interconnect": "nvlink"},
            **common,
        ),
    )
    b(
        0,
        WorkerRegistered(
            provider="garage-labs",
            hostname="rig-b.garage.example",
            region="us-east",
            gpus=_gpus(RTX4090, 1, "4090b"),
            cpus=16,
            memory_mb=64_000,
            **common,
        ),
    )
    l40s: dict[str, Any] = {
        "provider": "halcyon-compute",
        "hostname": "l40s-c.halcyon.example",
        "region": "eu-west",
        "pool": "managed",
        "owner_tenant": "globex",
        "gpus": _gpus(L40S, 2, "l40sc"),
        "cpus": 64,
        "memory_mb": 512_000,
    }
    c(0, WorkerRegistered(driver="535.161.08", agent_version="0.1.0", **l40s))
    challenge = {"seed": "9f86d081884c7d659a2feaa0c55ad015", "size": 256, "rounds": 5, "deadline_s": 120.0}
    a(0.01, WorkerVerificationRequested(challenge_id="vc-a1", requested_by="intake", **challenge))
    a(0.02, WorkerVerificationFailed(reason="wrong checksum", challenge_id="vc-a1", by="intake"))
    a(0.03, WorkerVerificationRequested(challenge_id="vc-a2", requested_by="intake", **challenge))
    a(0.04, WorkerVerified(challenge_id="vc-a2", elapsed_ms=190, gpu_tflops=640.0, by="intake"))
    b(0.04, WorkerVerified(challenge_id="vc-b1", elapsed_ms=240, gpu_tflops=150.0, by="intake"))
    c(0.04, WorkerVerified(challenge_id="vc-c1", elapsed_ms=210, gpu_tflops=300.0, by="intake"))
    a(
        0.1,
        WorkerPolicySet(
            policy=WorkerPolicy(
                allowed_pools=["shared", "managed"], min_price_micros_per_gpu_hour=2_000_000, max_concurrent=6
            )
        ),
    )
    b(0.1, WorkerPolicySet(policy=WorkerPolicy(allowed_tenants=["acme", "initech"], max_vram_fraction=0.9)))
    c(2.9, WorkerCordoned(reason="driver upgrade", by="ops@halcyon-compute"))
    c(3.2, WorkerRegistered(driver="550.54.15", agent_version="0.1.1", **l40s))  # restarted, still cordoned
    c(3.5, WorkerUncordoned(by="ops@halcyon-compute"))
    b(7, WorkerLost(silent_s=3.4, last_heartbeat_seq=5))
    b(10, WorkerRecovered(down_s=180.0))


def _heartbeats(s: _Scenario) -> None:
    for minute in (0.5, 5, 10, 15, 20):
        for worker, util in (("w-h100-a", 91.5), ("w-4090-b", 78.0), ("w-l40s-c", 64.25)):
            if worker == "w-4090-b" and 5 < minute < 10:
                continue
            gpu = GpuTelemetry(index=0, util_pct=util, mem_used_mb=12_000, temp_c=61.0, power_w=280.5)
            beat = Heartbeat(interval_s=1.0, gpus=[gpu], cpu_pct=22.5, memory_used_mb=48_000)
            s.at(minute, heartbeat_subject(worker), beat)


def _provenance(worker: str, score: float) -> Provenance:
    terms = {"uptime": 1.0, "tier": 1.0, "geo": 0.95, "load": round(score / 0.95, 4)}
    return Provenance(
        candidates=3, filtered={"vram": 1}, top=[ScoreCard(worker_id=worker, score=score, terms=terms)]
    )


def _a(work: str, slot: int, epoch: int, worker: str, gpus: int = 1) -> Assignment:
    return Assignment(
        assignment_id=f"a-{work}-{slot}-{epoch}", worker_id=worker, slot=slot, epoch=epoch, gpus=gpus
    )


def _placed(*assignments: Assignment) -> JobPlaced:
    return JobPlaced(assignments=list(assignments), provenance=_provenance(assignments[0].worker_id, 0.9))


def _started(a: Assignment) -> JobStarted:
    return JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch)


def _revoked(a: Assignment, reason: str) -> JobAssignmentRevoked:
    return JobAssignmentRevoked(
        assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=a.epoch, reason=reason
    )


def _llama(s: _Scenario) -> None:
    at = s.on(lambda e: job_subject("acme", "j-llama", e))
    at(
        1,
        JobSubmitted(
            name="llama-ft",
            kind="ddp",
            shards=2,
            priority=1,
            submitted_by="alice@acme",
            resources=JobResources(gpus=1, vram_mb=40_000, gpu_type="H100", cpus=8, memory_mb=64_000),
            command=["torchrun", "train.py", "--config", "ft.yaml"],
            inputs=["data/llama-ft/"],
            max_price_micros_per_gpu_hour=3_000_000,
        ),
    )
    shards = [_a("llama", 0, 1, "w-h100-a"), _a("llama", 1, 1, "w-h100-a")]
    at(1.1, _placed(*shards))
    for a in shards:
        at(1.5, _started(a))
    at(5, JobProgress(epoch=1, slot=0, train_epoch=1, step=500, loss=1.82, gpu_util_pct=93.0))
    at(8, JobCheckpointed(epoch=1, slot=0, step=1000, object_key="checkpoints/llama-ft/step-1000.pt"))
    at(12, JobProgress(epoch=1, slot=1, train_epoch=2, step=1500, loss=1.41, metrics={"lr": 0.0002}))
    at(16, JobCompleted(outputs=["model_out/llama-ft/", "files_out/llama-ft/metrics.json"]))
    at(16.2, JobProgress(epoch=1, slot=0, step=1600, loss=1.38))  # a straggler: terminal stays terminal


def _flmnist(s: _Scenario) -> None:
    at = s.on(lambda e: job_subject("acme", "j-flmnist", e))
    at(
        2,
        JobSubmitted(
            name="fl-mnist",
            kind="federated",
            shards=2,
            rounds=5,
            local_epochs=2,
            submitted_by="bob@acme",
            resources=JobResources(gpus=1, vram_mb=8_000),
            inputs=["jobs/fl-mnist/shards/", "jobs/fl-mnist/scripts/train.py"],
            federated=FederatedTraining(script="jobs/fl-mnist/scripts/train.py", framework="pytorch"),
        ),
    )
    shards = ["jobs/fl-mnist/shards/a.zip", "jobs/fl-mnist/shards/b.zip"]
    ready = JobFederationReady(
        server="fl.resontech.net:8102",
        sites=["site-1", "site-2"],
        kit_bucket="resontech-federations",
        kits=["acme/j-flmnist/site-1.zip", "acme/j-flmnist/site-2.zip"],
        shards=shards,
    )
    first, second, replacement = (
        _a("flmnist", 0, 1, "w-4090-b"),
        _a("flmnist", 1, 1, "w-h100-a"),
        _a("flmnist", 0, 2, "w-h100-a"),
    )
    at(2.1, _placed(first, second))
    at(2.2, ready)
    at(2.5, _started(first))
    at(2.5, _started(second))
    at(2.8, JobFederationRun(run_id="fl-run-1", first_round=1, rounds=5))
    at(4, JobRoundCompleted(round=1, metrics={"accuracy": 0.91}))
    at(4.1, JobProgress(epoch=1, round=2, loss=0.9))
    at(6, JobCheckpointed(epoch=1, round=2, object_key="checkpoints/fl-mnist/round-2.pt"))
    at(6.5, JobRoundCompleted(round=2, metrics={"accuracy": 0.95}))
    at(7.01, _revoked(first, "worker lost"))
    at(7.1, _placed(replacement))
    at(7.3, _started(replacement))
    # A zombie: the lost worker's client, cut off but still training, reports with its old epoch...
    at(7.5, JobProgress(epoch=1, slot=0, round=2, step=40, loss=9.99, train_epoch=7))
    # ...and a second coordinator instance repeats the old revocation: the new assignment survives it.
    at(7.6, _revoked(first, "worker lost"))
    resumed = "checkpoints/fl-mnist/round-2.pt"
    at(
        7.8,
        JobFederationRun(
            run_id="fl-run-2", first_round=3, rounds=3, reason="site-1 lost", resume_from=resumed
        ),
    )
    at(9, JobProgress(epoch=2, slot=0, round=3, step=120, loss=0.61))
    for n, minute in ((3, 9.5), (4, 11.5), (5, 13.5)):
        at(minute, JobRoundCompleted(round=n, metrics={"accuracy": 0.95 + n / 100}))
    at(12, JobCheckpointed(epoch=2, round=4, object_key="checkpoints/fl-mnist/round-4.pt"))
    # The zombie uploads a checkpoint too: recovery must never resume from it.
    at(12.5, JobCheckpointed(epoch=1, slot=0, round=2, object_key="checkpoints/fl-mnist/zombie-round-2.pt"))
    at(14.5, JobCompleted(outputs=["model_out/fl-mnist/global.pt", "files_out/fl-mnist/rounds.csv"]))


def _berteval(s: _Scenario) -> None:
    at = s.on(lambda e: job_subject("globex", "j-berteval", e))
    at(
        3,
        JobSubmitted(
            name="bert-eval",
            kind="process",
            shards=1,
            pool="managed",
            priority=2,
            submitted_by="carol@globex",
            resources=JobResources(gpus=1, vram_mb=20_000, gpu_type="L40S"),
            command=["python", "eval.py"],
            env={"BATCH": "64"},
        ),
    )
    at(3.1, JobQueued(reason="no available managed worker with an L40S (w-l40s-c cordoned)"))
    first, second = _a("berteval", 0, 1, "w-l40s-c"), _a("berteval", 0, 2, "w-l40s-c")
    at(3.6, _placed(first))
    at(3.7, _started(first))
    at(
        5.9,
        JobFailed(
            reason="CUDA error: an illegal memory access was encountered",
            epoch=1,
            slot=0,
            retryable=True,
            log_tail="RuntimeError: CUDA error: an illegal memory access\n",
        ),
    )
    at(6, _revoked(first, "shard failed"))
    at(6.2, _placed(second))
    at(6.3, _started(second))
    at(8, JobProgress(epoch=2, slot=0, step=300, metrics={"f1": 0.874}))
    at(
        9,
        JobFailed(reason="evaluation script exited with code 2", log_tail="FileNotFoundError: labels.csv\n"),
    )
    at(9.5, JobProgress(epoch=2, slot=0, step=310, metrics={"f1": 0.9}))


def _sweep(s: _Scenario) -> None:
    at = s.on(lambda e: job_subject("globex", "j-sweep", e))
    at(
        4.5,
        JobSubmitted(
            name="sweep-lr",
            kind="process",
            shards=1,
            priority=5,
            submitted_by="dave@globex",
            resources=JobResources(gpus=0, cpus=8, memory_mb=16_000),
            command=["python", "sweep.py"],
        ),
    )
    offer = _a("sweep", 0, 1, "w-4090-b", gpus=0)
    at(4.6, _placed(offer))
    at(
        4.65,
        JobRejected(
            assignment_id=offer.assignment_id,
            worker_id="w-4090-b",
            epoch=1,
            reason="tenant globex not allowed",
        ),
    )
    at(4.7, _revoked(offer, "rejected by worker"))
    at(4.8, JobQueued(reason="no worker accepts tenant globex for CPU work"))
    at(11, JobCancelled(by="dave@globex", reason="superseded by sweep-lr-2"))


def _endpoint(s: _Scenario) -> None:
    at = s.on(lambda e: endpoint_subject("acme", "ep-chat", e))

    def up(start: float, a: Assignment, address: str, ready: float) -> None:
        at(start, EndpointReplicaPlaced(assignments=[a], provenance=_provenance(a.worker_id, 0.85)))
        at(
            start + 0.1,
            EndpointReplicaStarting(assignment_id=a.assignment_id, worker_id=a.worker_id, epoch=a.epoch),
        )
        at(ready, EndpointReplicaReady(assignment_id=a.assignment_id, epoch=a.epoch, address=address))

    at(
        1.2,
        EndpointDeployed(
            name="chat-small",
            model="models/qwen2.5-0.5b-instruct/",
            vram_mb=6_000,
            min_replicas=1,
            max_replicas=2,
            target_rps_per_replica=8.0,
            scale_to_zero_after_s=600,
            engine="vllm",
            deployed_by="alice@acme",
        ),
    )
    first, second, replacement = (
        _a("chat", 0, 1, "w-4090-b"),
        _a("chat", 1, 2, "w-h100-a"),
        _a("chat", 0, 3, "w-h100-a"),
    )
    up(1.3, first, "http://10.0.2.15:8001", ready=2)
    at(2.2, EndpointScaled(replicas=2, reason="rps above target", inputs={"rps": 14.2, "replicas": 1.0}))
    up(2.3, second, "http://10.0.1.7:8002", ready=3)
    at(
        7.02,
        EndpointReplicaLost(assignment_id=first.assignment_id, epoch=1, reason="worker lost", retryable=True),
    )
    at(
        7.03,
        EndpointReplicaRevoked(
            assignment_id=first.assignment_id, worker_id="w-4090-b", slot=0, epoch=1, reason="worker lost"
        ),
    )
    up(7.2, replacement, "http://10.0.1.7:8003", ready=8)
    # The old replica's engine comes back on the recovered host and reports ready: fenced off.
    at(
        7.35,
        EndpointReplicaReady(assignment_id=first.assignment_id, epoch=1, address="http://10.0.2.15:8001"),
    )
    at(
        21,
        EndpointReplicaLost(
            assignment_id=second.assignment_id,
            epoch=2,
            reason="engine exited with code 137",
            log_tail="Killed\n",
        ),
    )
    # The agent restarts the engine on its own: a lost replica stays lost until it is revoked.
    at(
        21.5,
        EndpointReplicaReady(assignment_id=second.assignment_id, epoch=2, address="http://10.0.1.7:8002"),
    )


_USAGE: tuple[tuple[str, str, str, str, str, int, int, float, float, int], ...] = (
    # tenant, work kind, work id, assignment id, worker, epoch, gpus, start, end (minutes), tokens/tick
    ("acme", "job", "j-llama", "a-llama-0-1", "w-h100-a", 1, 1, 1.5, 16, 0),
    ("acme", "job", "j-llama", "a-llama-1-1", "w-h100-a", 1, 1, 1.5, 16, 0),
    ("acme", "job", "j-flmnist", "a-flmnist-0-1", "w-4090-b", 1, 1, 2.5, 6.5, 0),
    ("acme", "job", "j-flmnist", "a-flmnist-1-1", "w-h100-a", 1, 1, 2.5, 14.5, 0),
    ("acme", "job", "j-flmnist", "a-flmnist-0-2", "w-h100-a", 2, 1, 7.3, 14.5, 0),
    ("globex", "job", "j-berteval", "a-berteval-0-1", "w-l40s-c", 1, 1, 3.7, 5.9, 0),
    ("globex", "job", "j-berteval", "a-berteval-0-2", "w-l40s-c", 2, 1, 6.3, 9, 0),
    ("acme", "endpoint", "ep-chat", "a-chat-0-1", "w-4090-b", 1, 1, 1.4, 6.6, 5_200),
    ("acme", "endpoint", "ep-chat", "a-chat-1-2", "w-h100-a", 2, 1, 2.4, 21, 7_900),
    ("acme", "endpoint", "ep-chat", "a-chat-0-3", "w-h100-a", 3, 1, 7.4, 22, 6_100),
)
_POOLS = {"j-berteval": "managed"}
_DUPLICATED = ("a-llama-0-1", 3)
"""The tick (assignment, index) the agent sends twice: the retry carries a new event id."""


def _ticks(s: _Scenario) -> None:
    for tenant, kind, work, assignment, worker, epoch, gpus, start, end, tokens in _USAGE:
        provider, tier = PROVIDERS[worker]
        end_ms = _ms(end)
        for index, tick_start in enumerate(range(_ms(start), end_ms, TICK_MS)):
            tick_end = min(tick_start + TICK_MS, end_ms)
            tick = UsageTick(
                work_id=work,
                work_kind="job" if kind == "job" else "endpoint",
                assignment_id=assignment,
                epoch=epoch,
                provider=provider,
                gpu_type=GPU_TYPES[worker],
                pool="managed" if _POOLS.get(work) == "managed" else "shared",
                start_ms=tick_start,
                end_ms=tick_end,
                gpu_ms=gpus * (tick_end - tick_start),
                tier=tier,
            )
            subject = f"meter.{tenant}.{worker}"  # the legacy layout (see the module docstring)
            s.at_ms(tick_end + 250, subject, tick)
            if (assignment, index) == _DUPLICATED:
                s.at_ms(tick_end + 4_250, subject, tick)
            if tokens:  # a gateway's count of the tokens the replica served, on the kernel's subject
                counted = msgspec.structs.replace(
                    tick, gpu_ms=0, tokens=tokens * (tick_end - tick_start) // TICK_MS, source="gateway-g1"
                )
                s.at_ms(tick_end + 500, f"meter.{tenant}.{worker}.tokens", counted)


def _tenants(s: _Scenario) -> None:
    acme, globex = (s.on(functools.partial(tenant_subject, t)) for t in ("acme", "globex"))
    acme(0, TenantCreated(display_name="Acme ML", bucket="rt-acme", created_by="operator"))
    globex(0, TenantCreated(display_name="Globex", bucket="rt-globex", plan="managed", created_by="operator"))
    acme(0.05, ApiKeyIssued(key_id="k1", key_sha256="a" * 64, role="admin", label="ci", issued_by="operator"))
    acme(0.06, ApiKeyIssued(key_id="k2", key_sha256="b" * 64, role="viewer", issued_by="alice"))
    acme(0.07, QuotaSet(pool="shared", gpus=8, set_by="operator"))
    globex(0.07, QuotaSet(pool="managed", gpus=4, set_by="operator"))
    acme(9, ApiKeyRevoked(key_id="k2", revoked_by="alice"))
    acme(9.5, QuotaSet(pool="shared", gpus=None, set_by="operator"))  # limit removed
    s.at(10, tenant_subject("initech", ApiKeyRevoked), ApiKeyRevoked(key_id="kx"))  # unknown tenant: ignored


def _providers(s: _Scenario) -> None:
    gpuco = s.on(functools.partial(provider_subject, "gpuco"))
    gpuco(0, ProviderCreated(display_name="GPU Co", created_by="operator"))
    gpuco(0.02, ProviderKeyIssued(key_id="pk1", key_sha256="c" * 64, label="ops", issued_by="operator"))
    gpuco(0.03, EnrollmentTokenIssued(token_id="et1", token_sha256="d" * 64, expires_ns=_ms(60) * 1_000_000))
    gpuco(
        0.04,
        AgentEnrolled(
            token_id="et1",
            worker_id="w-a100-1",
            hostname="a100-1",
            nats_user="agent-w-a100-1",
            nats_password_bcrypt="$2b$08$" + "x" * 53,
        ),
    )
    gpuco(8, ProviderKeyRevoked(key_id="pk1", revoked_by="provider:gpuco"))
    gpuco(9, AgentCredentialsRevoked(worker_id="w-a100-1", revoked_by="provider:gpuco"))
    s.at(
        10, provider_subject("nobody", ProviderKeyRevoked), ProviderKeyRevoked(key_id="pk9")
    )  # unknown: ignored


def _managed_token(s: _Scenario) -> None:
    """Added after the rest, so that the ids and times of what came before stay as committed."""
    gpuco = s.on(functools.partial(provider_subject, "gpuco"))
    token = EnrollmentTokenIssued(
        token_id="et2",
        token_sha256="e" * 64,
        expires_ns=_ms(60) * 1_000_000,
        pool="managed",
        owner_tenant="globex",
        region="eu-north",
    )
    gpuco(23, token)
    gpuco(23.5, EnrollmentTokenRevoked(token_id="et2", revoked_by="provider:gpuco"))


def build_history() -> list[Recorded[Any]]:
    """The golden history, in store order (sequences per stream)."""
    s = _Scenario()
    for part in (
        _tenants,
        _providers,
        _workers,
        _heartbeats,
        _llama,
        _flmnist,
        _berteval,
        _sweep,
        _endpoint,
        _ticks,
        _managed_token,
    ):
        part(s)
    return s.records()


class _Line(msgspec.Struct):
    stream: str
    seq: int
    subject: str
    time_ns: int
    msg_id: str
    event: msgspec.Raw


def dump_history(records: Iterable[Recorded[Any]]) -> str:
    """One JSON object per line: the envelope, with the event (``type`` tag included) under ``event``."""
    return "".join(msgspec.json.encode(r).decode() + "\n" for r in records)


def load_history(path: Path = HISTORY) -> list[Recorded[Any]]:
    """Decode a history file through the catalog (the family's decoder and its upcasters)."""
    records: list[Recorded[Any]] = []
    for text in path.read_text().splitlines():
        line = msgspec.json.decode(text, type=_Line)
        event = decode(line.subject.split(".", 1)[0], bytes(line.event))
        records.append(
            Recorded(
                stream=line.stream,
                seq=line.seq,
                subject=line.subject,
                time_ns=line.time_ns,
                msg_id=line.msg_id,
                event=event,
            )
        )
    return records


def stream_records(projection: Projection[Any], records: Iterable[Recorded[Any]]) -> list[Recorded[Any]]:
    """The records a projection folds: those of its stream, in sequence order."""
    return sorted((r for r in records if r.stream == projection.stream), key=lambda r: r.seq)


def render(state: msgspec.Struct) -> str:
    """The committed form of a state: its canonical JSON, pretty-printed with sorted keys."""
    return json.dumps(json.loads(canonical_json(state)), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _iter_golden(records: list[Recorded[Any]]) -> Iterator[tuple[str, str, str]]:
    for projection in ALL:
        state = projection.fold(stream_records(projection, records))
        yield projection.name, render(state), state_hash(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.make", description=__doc__.split("\n")[0])
    parser.add_argument("--bless", action="store_true", help="rewrite the golden projections and hashes")
    args = parser.parse_args(argv)

    HISTORY.write_text(dump_history(build_history()))
    records = load_history()
    golden = list(_iter_golden(records))
    if args.bless:
        PROJECTIONS.mkdir(exist_ok=True)
        for name, text, _ in golden:
            (PROJECTIONS / f"{name}.json").write_text(text)
        hashes = {name: digest for name, _, digest in golden}
        HASHES.write_text(json.dumps(hashes, indent=2, sort_keys=True) + "\n")
        print(f"blessed {len(golden)} projections from {len(records)} records")
        return 0
    committed = json.loads(HASHES.read_text()) if HASHES.exists() else {}
    stale = [name for name, _, digest in golden if committed.get(name) != digest]
    for name in stale:
        print(f"{name}: differs from the committed projection (run with --bless after checking the diff)")
    print(f"{len(records)} records; {len(golden) - len(stale)}/{len(golden)} projections match")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
