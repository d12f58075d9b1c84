"""Start commands (:class:`ops.coordinator.starts.Starts`) built from fakes of what they use: an
:class:`~ops.coordinator.appender.Appender` on a fake log, folded schedule and registry as read-only
views, a presigner without an object store, a fake clock. No server."""

from __future__ import annotations

from core.errors import AppendTimeout
from core.streams import job_subject
from ops.coordinator.appender import Appender
from ops.coordinator.starts import Starts
from schemas.commands import StartWork
from schemas.jobs import JobCancelled, JobFailed, JobPlaced, JobResources, JobStarted
from schemas.values import Assignment, Provenance
from tests.ops.coordinator.fakes import FakePresigner, Ticks, World, shard


def _starts(world: World, presigner: FakePresigner | None = None) -> Starts:
    return Starts(
        appender=Appender(world.log),
        schedule=world.schedule,
        registry=world.registry,
        presigner=presigner or FakePresigner(),
        clock=Ticks().clock(),
    )


def _place(world: World, job_id: str, *assignments: Assignment) -> None:
    placed = JobPlaced(assignments=list(assignments), provenance=Provenance(candidates=len(assignments)))
    world.schedule(job_subject("acme", job_id, placed), placed)


def _commands(world: World) -> list[StartWork]:
    return [a.event for a in world.log.to("cmd.") if isinstance(a.event, StartWork)]


async def test_each_placed_shard_gets_one_start_command_with_its_inputs_presigned() -> None:
    world = World()
    world.worker("w1")
    world.worker("w2")
    world.job("j1", shards=2, inputs=["data/a.csv"], resources=JobResources(gpus=1, gpu_type="A100"))
    s0, s1 = shard("j1", 0, "w1"), shard("j1", 1, "w2")
    _place(world, "j1", s0, s1)
    starts = _starts(world)
    await starts.send()
    sent = {a.subject: a for a in world.log.to("cmd.")}
    assert set(sent) == {"cmd.w1", "cmd.w2"}
    assert sent["cmd.w1"].event_id == f"start-{s0.assignment_id}"  # stored once, however often sent
    command = sent["cmd.w1"].event
    assert isinstance(command, StartWork) and (command.work_id, command.slot, command.epoch) == ("j1", 0, 1)
    assert command.spec.downloads == {"data/a.csv": "https://store/acme/data/a.csv?get"}
    assert command.spec.runtime == "process" and command.price_micros_per_gpu_hour > 0
    assert starts.commanded == {s0.assignment_id, s1.assignment_id}
    await starts.send()  # already commanded by this process: not sent again
    assert len(world.log.appended) == 2


async def test_a_started_shard_and_an_ended_job_get_no_command() -> None:
    world = World()
    world.worker("w1")
    world.job("j1", shards=2)
    world.job("j2")
    s0, s1 = shard("j1", 0, "w1"), shard("j1", 1, "w1")
    _place(world, "j1", s0, s1)
    started = JobStarted(assignment_id=s0.assignment_id, worker_id="w1", slot=0, epoch=1)
    world.schedule(job_subject("acme", "j1", started), started)
    _place(world, "j2", shard("j2", 0, "w1"))
    cancelled = JobCancelled(by="acme", reason="no longer wanted")
    world.schedule(job_subject("acme", "j2", cancelled), cancelled)
    await _starts(world).send()
    assert [(c.work_id, c.slot) for c in _commands(world)] == [("j1", 1)]


async def test_a_missing_input_fails_the_job_for_good_expecting_its_sequence() -> None:
    world = World()
    world.worker("w1")
    key = world.job("j1", inputs=["data/gone.csv"])
    _place(world, "j1", shard("j1", 0, "w1"))
    await _starts(world, FakePresigner(missing=["data/gone.csv"])).send()
    [failed] = world.log.appended
    assert isinstance(failed.event, JobFailed) and not failed.event.retryable
    assert failed.event.reason == "input missing at start: no object at data/gone.csv"
    assert failed.expected_seq == world.schedule.state.jobs[key].last_seq
    assert _commands(world) == []


async def test_an_unreachable_store_is_tried_again_at_the_next_step_without_a_change() -> None:
    world = World()
    world.worker("w1")
    key = world.job("j1", inputs=["data/a.csv"])
    _place(world, "j1", shard("j1", 0, "w1"))
    presigner = FakePresigner()
    presigner.down = True
    starts = _starts(world, presigner)
    await starts.send({key})
    assert world.log.appended == [] and starts.commanded == set()  # nothing failed: the store is down
    presigner.down = False
    await starts.send(set())  # the job did not change: tried again all the same
    assert len(_commands(world)) == 1


async def test_a_command_the_log_did_not_take_is_sent_again_at_the_next_step() -> None:
    world = World()
    world.worker("w1")
    key = world.job("j1")
    _place(world, "j1", shard("j1", 0, "w1"))
    starts = _starts(world)
    world.log.refuse["cmd."] = AppendTimeout("no acknowledgement")
    await starts.send({key})
    assert starts.commanded == set()
    del world.log.refuse["cmd."]
    await starts.send(set())
    assert len(_commands(world)) == 1 and len(starts.commanded) == 1


async def test_a_ddp_shard_meets_at_shard_0s_worker_and_fails_when_that_worker_is_unknown() -> None:
    world = World()
    world.worker("w1")
    world.worker("w2")
    world.job("j1", kind="ddp", shards=2)
    _place(world, "j1", shard("j1", 0, "w1"), shard("j1", 1, "w2"))
    world.job("j2", kind="ddp", shards=2)
    _place(world, "j2", shard("j2", 0, "ghost"), shard("j2", 1, "w2"))
    starts = _starts(world)
    await starts.send()
    by_job = {(c.work_id, c.slot): c for c in _commands(world)}
    assert set(by_job) == {("j1", 0), ("j1", 1)}
    rendezvous = by_job[("j1", 1)].spec.rendezvous
    assert rendezvous is not None and rendezvous.master_addr == "w1" and rendezvous.node_rank == 1
    assert all(url.endswith("?put") for url in by_job[("j1", 0)].spec.checkpoint_urls.values())
    [failed] = world.log.events(JobFailed)  # the other shard's failure expected the same sequence
    assert failed.reason.startswith("cannot start: ") and starts.appender.conflicts == 1
