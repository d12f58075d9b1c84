"""Sharded checkpoints in the schedule: a set counts only when every node's part of one step is stored
at the current epoch, in one folder; the kernel's ``job.checkpointed`` names it, and a restart
resumes from it."""

from __future__ import annotations

from projections import SCHEDULE
from projections.checkpoints import completed, part_keys
from schemas.jobs import JobCheckpointed, JobCheckpointPartStored
from schemas.values import Assignment
from tests.support.reducer_builders import Job, Log, asg

PREFIX = "jobs/j1/checkpoints/j1/"


def part(a: Assignment, step: int, n: int, slot: int | None = None) -> JobCheckpointPartStored:
    slot = a.slot if slot is None else slot
    key = f"{PREFIX}e{a.epoch}-{n}/node-{slot}.tar"
    return JobCheckpointPartStored(
        epoch=a.epoch, slot=a.slot, step=step, object_key=key, assignment_id=a.assignment_id
    )


def gang() -> Job:
    job = Job(Log(SCHEDULE))
    job.submit(shards=2)
    job.place(asg(0, 1, "w1"), asg(1, 1, "w2"))
    return job


def test_a_set_counts_only_once_every_nodes_part_of_one_step_is_stored() -> None:
    job = gang()
    a0, a1 = asg(0, 1, "w1"), asg(1, 1, "w2")
    assert part_keys(job.record, 1, 1) == [f"{PREFIX}e1-{n}/node-1.tar" for n in range(3)]
    job(part(a0, 32, 0))
    assert completed(job.record) is None and job.record.last_checkpoint is None
    job(part(a0, 64, 1))
    job(part(a1, 32, 0))
    ready = completed(job.record)
    assert ready == JobCheckpointed(
        epoch=1, object_key=f"{PREFIX}e1-0/", step=32, parts=[f"{PREFIX}e1-0/node-{s}.tar" for s in (0, 1)]
    )
    job(part(a1, 64, 1))
    assert completed(job.record) is not None and completed(job.record).step == 64  # the newest whole set
    job(completed(job.record))
    last = job.record.last_checkpoint
    assert (last.step, last.parts, last.object_key) == (
        64,
        [f"{PREFIX}e1-1/node-0.tar", f"{PREFIX}e1-1/node-1.tar"],
        f"{PREFIX}e1-1/",
    )
    assert job.record.checkpoint_parts == {} and completed(job.record) is None  # step 32 never counts now
    job(part(a0, 64, 1))  # told again: the job has that step whole
    assert job.record.checkpoint_parts == {}


def test_parts_that_disagree_or_come_from_a_former_placement_never_make_a_set() -> None:
    job = gang()
    a0, a1 = asg(0, 1, "w1"), asg(1, 1, "w2")
    job(part(a0, 32, 0))
    job(part(a1, 32, 1))  # another folder: the nodes lost step with each other
    assert completed(job.record) is None
    job.revoke(a1)
    job(part(a1, 40, 0))  # revoked: not a current node
    assert "40" not in job.record.checkpoint_parts
    job.revoke(a0)
    b0, b1 = asg(0, 2, "w1"), asg(1, 2, "w3")
    job.place(b0, b1)
    assert job.record.checkpoint_parts == {}  # a new placement's parts start afresh
    job(part(a0, 48, 0))  # the former placement's node
    assert job.record.checkpoint_parts == {}
    for step in range(100, 100 + 20):
        job(part(b0, step, 0))
    assert len(job.record.checkpoint_parts) <= 8  # a node that saves alone cannot grow the record


def test_a_one_file_checkpoint_keeps_the_parts_in_flight() -> None:
    job = gang()
    a0 = asg(0, 1, "w1")
    job(part(a0, 32, 0))
    job(
        JobCheckpointed(
            epoch=1, slot=0, step=30, object_key=f"{PREFIX}e1-0.ckpt", assignment_id=a0.assignment_id
        )
    )
    assert job.record.last_checkpoint.object_key == f"{PREFIX}e1-0.ckpt"
    assert job.record.checkpoint_parts == {"32": {"0": f"{PREFIX}e1-0/node-0.tar"}}
