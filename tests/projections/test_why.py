"""Why a job is where it is (:mod:`projections.why`): a shard placed again says which epoch ended
where, and where it runs now."""

from __future__ import annotations

from projections import SCHEDULE
from projections.why import explain_job
from tests.support.reducer_builders import Job, Log, asg


def test_a_shard_placed_again_after_its_worker_was_lost_says_so() -> None:
    job = Job(Log(SCHEDULE))
    job.submit(shards=1)
    first = asg(0, 1, worker="w-lost")
    job.place(first)
    job.start(first)
    assert not any("placed again" in line for line in explain_job(job.record, None))
    job.revoke(first, "worker lost")
    job.place(asg(0, 2, worker="w-new"))
    why = explain_job(job.record, None)
    assert "shard 0: epoch 1 on w-lost ended; placed again at epoch 2 on w-new" in why
    assert "1 assignment(s) revoked so far" in why
