"""The job queue (:class:`ops.coordinator.job_queue.JobQueue`) built from fakes of what it uses: a
:class:`~ops.coordinator.appender.Appender` on a fake log, folded projections as its read-only
views, the live capacity of those states, a fake clock. No server."""

from __future__ import annotations

from core.errors import ConcurrencyConflict
from ops.coordinator.appender import Appender
from ops.coordinator.job_queue import RECHECK_S, JobQueue
from ops.coordinator.live_capacity import LiveCapacity
from schemas.commands import StopWork
from schemas.jobs import JobAssignmentRevoked, JobFailed, JobPlaced, JobQueued, JobResources
from tests.ops.coordinator.fakes import NOW, Ticks, World


class Queue:
    """A :class:`JobQueue` over a :class:`World`, as the coordinator wires it."""

    def __init__(self, world: World) -> None:
        self.world, self.ticks = world, Ticks()
        self.appender = Appender(world.log)
        self.live: LiveCapacity = world.capacity()
        self.changed: list[str] = []
        self.queue = JobQueue(
            appender=self.appender,
            schedule=world.schedule,
            tenants=world.tenants,
            endpoints=world.endpoints,
            capacity=lambda _now_ns: self.live,
            changed=self.changed.append,
            clock=self.ticks.clock(),
        )
        self.queue.build(world.schedule.state)

    def rebuild(self) -> None:
        """The capacity read again from the states (the coordinator's periodic rebuild)."""
        self.live = self.world.capacity()

    def settle(self, *keys: str) -> None:
        """The projections apply what was appended; the coordinator syncs the changed jobs."""
        self.world.catch_up()
        self.queue.sync(set(keys), self.world.schedule.state)


async def test_a_queued_job_that_fits_is_placed_expecting_its_last_sequence_and_counted() -> None:
    world = World()
    world.worker("w1")
    key = world.job("j1")
    q = Queue(world)
    await q.queue.place(NOW)
    [append] = world.log.appended
    assert append.subject == "job.acme.j1.placed" and isinstance(append.event, JobPlaced)
    assert append.expected_seq == world.schedule.state.jobs[key].last_seq
    assert [a.worker_id for a in append.event.assignments] == ["w1"]
    assert q.queue.placements == 1 and len(q.queue.decision_ms) == 1


async def test_a_placement_is_held_in_capacity_and_not_decided_again_until_applied() -> None:
    world = World()
    world.worker("w1")  # one GPU: room for one of the two jobs
    first, second = world.job("j1"), world.job("j2")
    q = Queue(world)
    await q.queue.place(NOW)
    assert [type(e) for e in world.log.events()] == [JobPlaced, JobQueued]  # j2 sees j1's GPU taken
    await q.queue.place(NOW, {first, second})  # j1's placement is not applied yet: held
    assert len(world.log.events(JobPlaced)) == 1 and q.queue.placements == 1
    q.settle(first, second)
    assert first not in q.queue.queued and second in q.queue.queued


async def test_a_conflict_loses_only_that_decision_and_marks_the_job_to_decide_again() -> None:
    world = World()
    world.worker("w1")
    key = world.job("j1")
    q = Queue(world)
    world.log.refuse["job.acme.j1."] = ConcurrencyConflict("taken", subject="job.acme.j1.placed", expected=1)
    await q.queue.place(NOW)
    assert world.log.appended == [] and q.queue.placements == 0
    assert q.appender.conflicts == 1 and q.changed == [key]
    del world.log.refuse["job.acme.j1."]
    q.rebuild()  # the coordinator's next step syncs the job: the capacity no longer holds it
    q.settle(key)
    await q.queue.place(NOW, {key})  # not held: decided again
    assert len(world.log.events(JobPlaced)) == 1 and q.queue.placements == 1


async def test_unchanged_queued_jobs_are_tried_again_after_recheck_s_or_when_capacity_was_freed() -> None:
    world = World()
    key = world.job("j1")
    q = Queue(world)
    await q.queue.place(NOW, {key})  # no worker yet: it waits
    assert [type(e) for e in world.log.events()] == [JobQueued]
    world.catch_up()
    world.worker("w1")
    q.rebuild()
    q.live.freed = False
    await q.queue.place(NOW, set())  # nothing changed and the recheck is not due: not tried
    assert len(world.log.appended) == 1
    q.ticks.monotonic += RECHECK_S
    await q.queue.place(NOW, set())
    assert len(world.log.events(JobPlaced)) == 1


async def test_freed_capacity_tries_every_queued_job_at_once() -> None:
    world = World()
    key = world.job("j1")
    q = Queue(world)
    await q.queue.place(NOW, {key})
    world.catch_up()
    world.worker("w1")
    q.rebuild()
    assert q.live.freed  # a worker came: capacity may have grown
    await q.queue.place(NOW, set())
    assert len(world.log.events(JobPlaced)) == 1 and not q.live.freed


async def test_a_job_that_never_fits_is_rejected_and_a_waiting_one_says_why_once() -> None:
    world = World()
    world.worker("w1")
    world.job("huge", resources=JobResources(gpus=16))
    busy = world.job("j1")
    world.job("j0", priority=0)
    q = Queue(world)
    await q.queue.place(NOW)
    [rejected] = world.log.events(JobFailed)
    assert rejected.reason.startswith("rejected: ") and not rejected.retryable
    [waiting] = [a for a in world.log.to("job.acme.j0.") if isinstance(a.event, JobQueued)]
    q.settle(busy)
    await q.queue.place(NOW, {"acme/j0"})  # still no room, for the same reason: nothing appended
    assert world.log.to("job.acme.j0.") == [waiting]


async def test_a_higher_priority_job_preempts_a_lower_one_of_its_tenant_with_a_checkpoint() -> None:
    world = World()
    world.worker("w1")
    low = world.job("low", priority=0)
    q = Queue(world)
    await q.queue.place(NOW)
    q.settle(low)
    high = world.job("high", priority=2)
    q.settle(high)
    await q.queue.place(NOW, {high})
    placed = world.log.events(JobPlaced)[0].assignments[0]
    [revoked] = world.log.to("job.acme.low.")[1:]
    assert isinstance(revoked.event, JobAssignmentRevoked)
    assert (
        revoked.event.assignment_id == placed.assignment_id
        and revoked.event.reason == "preempted by acme/high"
    )
    assert revoked.expected_seq == world.schedule.state.jobs[low].last_seq  # the victim as read
    assert len(world.log.events(JobPlaced)) == 1  # the high one is placed once the victim's GPU is free
    [stop] = world.log.to("cmd.w1")
    assert isinstance(stop.event, StopWork) and stop.event.checkpoint
    assert stop.event_id == f"preempt-{placed.assignment_id}"
