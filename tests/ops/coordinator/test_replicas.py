"""Endpoint replicas (:class:`ops.coordinator.replicas.Replicas`) built from fakes of what they use:
an :class:`~ops.coordinator.appender.Appender` on a fake log, folded projections as read-only views,
the live capacity of those states, a presigner without an object store, a fake clock. No server."""

from __future__ import annotations

from typing import Any

from core.placement.placing import assignment_id
from core.streams import endpoint_subject
from ops.coordinator.appender import Appender
from ops.coordinator.replicas import MAX_START_FAILURES, STOP_RESEND_S, Replicas, retirements, start_command
from projections.endpoints import EndpointRecord, ReplicaRecord
from schemas.commands import StartWork, StopWork
from schemas.endpoints import (
    EndpointDeployed,
    EndpointFailed,
    EndpointReplicaLost,
    EndpointReplicaPlaced,
    EndpointReplicaRevoked,
    EndpointScaled,
)
from schemas.values import Assignment, Provenance
from tests.ops.coordinator.fakes import NOW, FakePresigner, Ticks, World
from tests.support.projection_records import endpoint_record


class Upkeep:
    """A :class:`Replicas` over a :class:`World` with endpoint ``acme/e1``, as the coordinator wires it."""

    def __init__(self, world: World, presigner: FakePresigner | None = None, **deployed: Any) -> None:
        self.world, self.ticks = world, Ticks()
        self.replicas = Replicas(
            appender=Appender(world.log),
            registry=world.registry,
            liveness=world.liveness,
            schedule=world.schedule,
            endpoints=world.endpoints,
            capacity=lambda _now_ns: world.capacity(),
            presigner=presigner or FakePresigner(),
            clock=self.ticks.clock(),
        )
        given: dict[str, Any] = {
            "name": "e1",
            "model": "m",
            "min_replicas": 1,
            "max_replicas": 2,
            "vram_mb": 1000,
        } | deployed
        self(EndpointDeployed(**given))

    def __call__(self, event: Any) -> None:
        """Store and apply an event of ``acme/e1``."""
        self.world.endpoints(endpoint_subject("acme", "e1", event), event)

    def place(self, slot: int, epoch: int = 1, worker_id: str = "w1") -> Assignment:
        replica = _replica(slot, epoch, worker_id)
        self(EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1)))
        return replica

    @property
    def last_seq(self) -> int:
        return int(self.world.endpoints.state.endpoints["acme/e1"].last_seq)


def _replica(slot: int, epoch: int = 1, worker_id: str = "w1") -> Assignment:
    aid = assignment_id("e1", slot, epoch, tenant="acme", kind="endpoint")
    return Assignment(assignment_id=aid, worker_id=worker_id, slot=slot, epoch=epoch, gpus=1)


async def test_a_missing_replica_is_placed_expecting_the_endpoints_sequence() -> None:
    world = World()
    world.worker("w1")
    upkeep = Upkeep(world)
    await upkeep.replicas.step(NOW)
    [placed] = world.log.appended
    assert placed.subject == "endpoint.acme.e1.replica_placed" and placed.expected_seq == upkeep.last_seq
    assert [(a.slot, a.worker_id) for a in placed.event.assignments] == [(0, "w1")]
    assert world.log.to("cmd.") == []  # started once the projection shows it placed


async def test_a_placed_replica_gets_one_start_command_of_the_engine() -> None:
    world = World()
    world.worker("w1")
    upkeep = Upkeep(world)
    replica = upkeep.place(0)
    await upkeep.replicas.step(NOW)
    [start] = world.log.to("cmd.w1")
    assert start.event_id == f"start-{replica.assignment_id}"
    command = start.event
    assert isinstance(command, StartWork) and command.work_kind == "endpoint"
    assert command.spec.runtime == "vllm" and command.spec.options["served_name"] == "e1"
    await upkeep.replicas.step(NOW)
    assert len(world.log.to("cmd.")) == 1 and upkeep.replicas.commanded == {replica.assignment_id}


async def test_a_workspace_models_files_are_presigned_into_the_model_dir() -> None:
    world = World()
    world.worker("w1")
    upkeep = Upkeep(world, model="models/tiny.gguf", model_source="workspace")
    upkeep.place(0)
    await upkeep.replicas.step(NOW)
    [start] = world.log.to("cmd.w1")
    assert start.event.spec.downloads == {"model/tiny.gguf": "https://store/acme/models/tiny.gguf?get"}
    assert start.event.spec.options["model"] == "model"


async def test_a_replica_whose_workspace_model_is_missing_is_lost_expecting_the_endpoints_sequence() -> None:
    world = World()
    world.worker("w1")
    presigner = FakePresigner(missing=["models/tiny.gguf"])
    upkeep = Upkeep(world, presigner, model="models/tiny.gguf", model_source="workspace")
    replica = upkeep.place(0)
    await upkeep.replicas.step(NOW)
    [lost] = world.log.appended
    reason = "model missing at start: no object at models/tiny.gguf"
    assert lost.event == EndpointReplicaLost(assignment_id=replica.assignment_id, epoch=1, reason=reason)
    assert lost.expected_seq == upkeep.last_seq and upkeep.replicas.commanded == set()


async def test_an_endpoint_whose_replicas_keep_failing_is_given_up_and_nothing_else_decided() -> None:
    world = World()
    world.worker("w1")
    upkeep = Upkeep(world)
    for epoch in range(1, MAX_START_FAILURES + 1):
        replica = upkeep.place(0, epoch)
        upkeep(EndpointReplicaLost(assignment_id=replica.assignment_id, epoch=epoch, reason="exit status 3"))
        upkeep(
            EndpointReplicaRevoked(
                assignment_id=replica.assignment_id, worker_id="w1", slot=0, epoch=epoch, reason="lost"
            )
        )
    await upkeep.replicas.step(NOW)
    [failed] = world.log.appended
    assert isinstance(failed.event, EndpointFailed) and failed.expected_seq == upkeep.last_seq


async def test_a_replica_a_worker_runs_but_no_longer_current_is_stopped_again_every_stop_resend_s() -> None:
    world = World()
    upkeep = Upkeep(world, min_replicas=0)
    stray = _replica(5)
    world.worker("w1", running=[stray.assignment_id])
    await upkeep.replicas.step(NOW)
    [stop] = world.log.to("cmd.w1")
    assert isinstance(stop.event, StopWork) and stop.event.assignment_id == stray.assignment_id
    assert stop.event_id == f"stop-{stray.assignment_id}"
    upkeep.ticks.monotonic += STOP_RESEND_S - 1
    await upkeep.replicas.step(NOW)  # sent a moment ago: not again yet
    assert len(world.log.to("cmd.")) == 1
    upkeep.ticks.monotonic += 1
    await upkeep.replicas.step(NOW)  # still running after STOP_RESEND_S: sent again
    assert len(world.log.to("cmd.")) == 2
    world.beat("w1")  # it stopped
    await upkeep.replicas.step(NOW)
    assert upkeep.replicas.stopping == {} and len(world.log.to("cmd.")) == 2


async def test_a_decision_on_a_stale_endpoint_is_a_counted_conflict_and_appends_nothing() -> None:
    world = World()
    world.worker("w1")
    upkeep = Upkeep(world)
    scaled = EndpointScaled(replicas=2, reason="rps")
    world.endpoints.store(endpoint_subject("acme", "e1", scaled), scaled)  # stored, not yet applied
    await upkeep.replicas.step(NOW)
    assert world.log.appended == [] and upkeep.replicas.appender.conflicts == 1


def _endpoint(**changes: object) -> EndpointRecord:
    replicas = {
        "0": ReplicaRecord(assignment_id="a0", worker_id="w0", slot=0, epoch=1, state="ready"),
        "1": ReplicaRecord(
            assignment_id="a1", worker_id="w1", slot=1, epoch=1, state="lost", reason="exit status 1"
        ),
        "2": ReplicaRecord(assignment_id="a2", worker_id="w2", slot=2, epoch=1, state="starting"),
    }
    fields: dict[str, Any] = {
        "tenant": "acme",
        "endpoint_id": "ep1",
        "name": "chat",
        "model": "smollm2-135m-instruct",
        "desired_replicas": 3,
        "replicas": replicas,
    }
    return endpoint_record(**{**fields, **changes})


def test_lost_replicas_gone_workers_and_scaled_in_slots_are_retired() -> None:
    endpoint = _endpoint()
    assert [(r.slot, why) for r, why in retirements(endpoint, set())] == [(1, "exit status 1")]
    assert [r.slot for r, _ in retirements(endpoint, {"w0"})] == [0, 1]
    scaled = _endpoint(desired_replicas=1)
    expected = [(1, "exit status 1"), (2, "scaled to 1")]
    assert [(r.slot, why) for r, why in retirements(scaled, set())] == expected


def test_a_replica_start_serves_the_model_under_the_endpoint_name() -> None:
    endpoint = _endpoint()
    cmd = start_command(endpoint, endpoint.replicas["2"], "gold")
    assert cmd.work_kind == "endpoint" and cmd.spec.runtime == "vllm"
    assert cmd.spec.options == {"model": "smollm2-135m-instruct", "served_name": "chat"}
    workspace = _endpoint(model_source="workspace", model="model_out/run-1/")
    urls = {"model_out/run-1/config.json": "http://u1", "model_out/run-1/w/model.safetensors": "http://u2"}
    cmd = start_command(workspace, workspace.replicas["2"], downloads=urls)
    assert cmd.spec.options["model"] == "model"
    assert cmd.spec.downloads == {"model/config.json": "http://u1", "model/w/model.safetensors": "http://u2"}
