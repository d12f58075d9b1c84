"""A job spec checked against everything the gateway can check before it appends ``job.submitted``.

Shape and ranges are checked by msgspec while decoding (a 400). Here are the rules that need more
than one field or the kernel's state, each a 422 that says what to fix: what the kind needs, the
environment's names, the object keys, the tenant's quota and the fleet. A job the coordinator would
reject on sight (more than the tenant's whole quota, more than any worker could ever hold, a
managed or private pool where the tenant has no workers) is refused here, with the coordinator's own
reason (:func:`projections.admission.never_fits`), against the fleet as :class:`IdleFleet` keeps it
(endpoint deployments use the same).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from core import flare, flarejob
from core.placement.values import Candidate
from gateway.api import Call
from gateway.bodies import converted
from gateway.errors import ApiError
from gateway.references import key_problem
from projections.admission import Quotas, Wait, check_quota, idle_host, never_fits, request_for_job
from projections.registry import RegistryState, WorkerRecord
from projections.schedule import JobRecord
from schemas.api.jobs import FederatedSpec, SubmitJob
from schemas.jobs import FederatedTraining, JobSubmitted


class KindRule(NamedTuple):
    """What a job kind needs, and whether it can run yet."""

    available: bool
    needs_command: bool
    federated: bool


KINDS: dict[str, KindRule] = {
    "process": KindRule(available=True, needs_command=True, federated=False),
    "federated": KindRule(available=True, needs_command=False, federated=True),
    "ddp": KindRule(available=True, needs_command=True, federated=False),
}
"""Every kind the spec knows (a kind whose runtime is missing is refused with ``kind_unavailable``)."""
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
RESERVED_ENV_PREFIX = "RESONTECH_"


def invalid_spec(message: str, code: str = "invalid_spec") -> ApiError:
    return ApiError(422, code, message)


def _check_kind(spec: SubmitJob) -> None:
    rule = KINDS[spec.kind]
    if not rule.available:
        ready = ", ".join(k for k, r in KINDS.items() if r.available)
        raise invalid_spec(
            f"job kind {spec.kind!r} is not available yet; use one of: {ready}", "kind_unavailable"
        )
    if rule.needs_command and not (spec.command and spec.command[0]):
        raise invalid_spec(f"a {spec.kind} job needs a command: the argv each worker runs")
    if rule.federated and spec.rounds is None:
        raise invalid_spec("a federated job needs rounds")
    if rule.federated and spec.federated is None:
        raise invalid_spec("a federated job needs its training code: federated.script or job_folder")
    if not rule.federated and (spec.rounds is not None or spec.local_epochs is not None or spec.federated):
        raise invalid_spec("rounds, local_epochs and federated are for federated jobs only")
    if spec.federated is not None:
        _check_federated(spec.federated)
    if spec.kind == "ddp":
        _check_script(spec)
    if spec.strategy is not None and spec.kind != "ddp":
        raise invalid_spec("strategy is for ddp jobs only (how their script shards the model)")


def _check_federated(federated: FederatedSpec) -> None:
    if (federated.script is None) == (federated.job_folder is None):
        raise invalid_spec("federated needs exactly one of script (a Client API script) and job_folder")
    keys = [k for k in (federated.script, federated.job_folder, federated.initial_model) if k is not None]
    persistor = None
    if federated.persistor is not None:
        if federated.job_folder is not None:
            raise invalid_spec("federated.persistor is for a script: a job folder names its persistor itself")
        try:
            persistor = flarejob.persistor_ref(federated.persistor)
        except ValueError as exc:
            raise invalid_spec(f"federated.{exc}") from None
        keys.append(persistor.key)
    problems = [p for p in map(key_problem, keys) if p is not None]
    if problems:
        raise invalid_spec(f"bad key in federated: {'; '.join(problems)}", "invalid_key")
    if federated.job_folder is not None and not federated.job_folder.endswith("/"):
        raise invalid_spec(f"federated.job_folder {federated.job_folder!r} names a folder: end it with '/'")
    if any(key.endswith("/") for key in keys if key != federated.job_folder):
        raise invalid_spec(
            "federated.script, initial_model and persistor name files, not folders", "invalid_key"
        )
    if federated.script is not None and not federated.script.endswith(".py"):
        raise invalid_spec(f"federated.script {federated.script!r} must be a Python file (.py)")
    if federated.initial_model and not federated.initial_model.endswith((".npz", ".pt", ".pth")):
        raise invalid_spec("federated.initial_model must be a .npz of named arrays or a .pt state dict")
    if any(not arg or any(c.isspace() for c in arg) for arg in federated.args):
        raise invalid_spec("federated.args: each argument must be non-empty and without whitespace")


def _check_script(spec: SubmitJob) -> None:
    """A ddp job's command starts with its training script, a workspace key among its inputs (each
    node fetches its inputs and runs the script under torchrun)."""
    script = spec.command[0]
    if not any(script == key or (key.endswith("/") and script.startswith(key)) for key in spec.inputs):
        raise invalid_spec(
            f"a ddp job's command starts with its training script, a workspace key among its inputs: "
            f"add {script!r} to inputs (e.g. scripts/train.py, uploaded with resontech upload)"
        )


def _check_resources(spec: SubmitJob) -> None:
    r = spec.resources
    if r.gpus == 0 and (r.vram_mb or r.gpu_type):
        raise invalid_spec("resources.vram_mb and resources.gpu_type need resources.gpus of at least 1")


def _check_env(spec: SubmitJob) -> None:
    for name in spec.env:
        if not _ENV_NAME.match(name):
            raise invalid_spec(
                f"env name {name!r} must be uppercase letters, digits and '_' (not first a digit)"
            )
        if name.startswith(RESERVED_ENV_PREFIX):
            raise invalid_spec(f"env name {name!r}: names starting with {RESERVED_ENV_PREFIX} are reserved")


def _check_keys(spec: SubmitJob) -> None:
    problems = [p for p in map(key_problem, spec.inputs) if p is not None]
    if problems:
        raise invalid_spec(f"bad input key: {'; '.join(problems[:10])}", "invalid_key")
    prefix = spec.output_prefix
    if prefix:
        problem = key_problem(prefix)
        if problem is not None or not prefix.endswith("/"):
            detail = problem or f"{prefix!r} does not end with '/'"
            raise invalid_spec(f"bad output_prefix: {detail}", "invalid_key")


def job_event(spec: SubmitJob, submitted_by: str) -> JobSubmitted:
    """The ``job.submitted`` of a spec that passes every rule that needs no state; 422 otherwise."""
    _check_kind(spec)
    _check_resources(spec)
    _check_env(spec)
    _check_keys(spec)
    federated = spec.federated
    return converted(
        JobSubmitted,
        spec,
        inputs=list(dict.fromkeys([*spec.inputs, *federated_inputs(spec)])),
        submitted_by=submitted_by,
        federated=None
        if federated is None
        else converted(FederatedTraining, federated, script=federated.script or ""),
    )


def federated_inputs(spec: SubmitJob) -> list[str]:
    """What a federated job reads, checked to exist like its ``inputs``: its script or job folder, its
    initial model and its persistor's file. Not its shards' folder, which may be empty
    (:func:`check_shards`)."""
    if spec.federated is None:
        return []
    f = spec.federated
    persistor = flarejob.persistor_ref(f.persistor).key if f.persistor else None
    named = (f.script, f.job_folder, f.initial_model, persistor)
    return [key for key in named if key]


def shards_prefix(name: str) -> str:
    """Where a federated job's shard ZIPs are: shard ``i`` is the ``i``-th ZIP, by name."""
    return f"jobs/{name}/shards/"


def check_shards(event: JobSubmitted, objects: list[tuple[str, int]]) -> None:
    """422 ``missing_objects`` when the listing of a federated job's shards folder holds some shard
    ZIPs but fewer than its ``shards`` (:func:`core.flare.shard_keys`). None at all is fine: the
    sites start with an empty data folder."""
    try:
        flare.shard_keys((key for key, _ in objects), shards_prefix(event.name), event.shards)
    except flare.ShardsMissing as exc:
        raise invalid_spec(str(exc), "missing_objects") from None


def check_job_folder(prefix: str, objects: list[tuple[str, int]]) -> None:
    """422 ``invalid_job_folder`` when the listing of a job folder (``(key, size)`` under ``prefix``)
    shows that it cannot run (:func:`core.flarejob.folder_problems`); what its files say is checked
    when the job starts."""
    problems = flarejob.folder_problems(objects, prefix)
    if problems:
        raise invalid_spec(
            f"federated.job_folder {prefix} is not an NVFlare job folder: {'; '.join(problems)}",
            "invalid_job_folder",
        )


class IdleFleet:
    """Every registered worker as an idle placement candidate (:func:`idle_host`), kept per gateway.

    Building a candidate costs tens of microseconds (tiers, uptime), too much to repeat for a whole
    fleet on every submission: candidates are rebuilt only when the registry moved, and then only
    for workers whose (frozen, replaced-on-change) record is a new object.
    """

    def __init__(self) -> None:
        self._seq = -1
        self._by_id: dict[str, tuple[WorkerRecord, Candidate]] = {}
        self._hosts: list[Candidate] = []

    def hosts(self, registry: RegistryState, now_ns: int) -> list[Candidate]:
        """The candidates of ``registry`` as of now."""
        if registry.seq != self._seq:
            fresh: dict[str, tuple[WorkerRecord, Candidate]] = {}
            for worker_id, record in registry.workers.items():
                old = self._by_id.get(worker_id)
                fresh[worker_id] = (
                    old if old is not None and old[0] is record else (record, idle_host(record, now_ns))
                )
            self._by_id = fresh
            self._hosts = [candidate for _, candidate in fresh.values()]
            self._seq = registry.seq
        return self._hosts


def idle_fleet(call: Call[Any, Any]) -> IdleFleet:
    """This gateway's :class:`IdleFleet` (kept on the app's state)."""
    state = call.request.app.state
    fleet: IdleFleet | None = getattr(state, "idle_fleet", None)
    if fleet is None:
        fleet = state.idle_fleet = IdleFleet()
    return fleet


def check_admission(
    tenant: str, job_id: str, event: JobSubmitted, quotas: Quotas, hosts: list[Candidate], now_ns: int
) -> None:
    """422 when the job could never run: over the tenant's whole quota, or never placeable."""
    gpus = event.shards * event.resources.gpus
    verdict = check_quota(tenant, event.pool, gpus, quotas, {}, whole=gpus)
    if isinstance(verdict, Wait) and verdict.permanent:
        limit = quotas.get(tenant, {}).get(event.pool)
        raise invalid_spec(
            f"the job needs {gpus} GPUs at once but tenant {tenant}'s quota in the {event.pool} pool "
            f"is {limit}; use fewer shards or GPUs, or ask the operator to raise the quota",
            "over_quota",
        )
    reason = never_fits(request_for_job(JobRecord(tenant=tenant, job_id=job_id, spec=event)), hosts, now_ns)
    if reason is not None:
        alternatives = "less per shard, fewer shards" + (
            ", another pool or no image" if event.image else " or another pool"
        )
        raise invalid_spec(f"this job could never be placed: {reason}; ask for {alternatives}", "unplaceable")
