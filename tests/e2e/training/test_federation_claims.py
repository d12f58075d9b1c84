"""Two federation services, exactly one FL server per job: the claims on the FEDERATION stream.

Pure tests of the claim decisions (:mod:`core.federation_claims`); claim keepers racing on a real
nats-server; the fence's watchdog on real processes; and two real ``resontech federation --instance``
processes serving one federated job on real NVFlare, its holder paused (SIGSTOP) then killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.errors import ConcurrencyConflict
from core.federation_claims import (
    LEASE_S,
)
from core.log import EventLog
from core.settings import Settings
from core.streams import FEDERATION_FILTER, federation_beat_subject, job_subject
from ops.federation import fence
from ops.federation.claims import ClaimKeeper
from ops.federation.server import TAG
from schemas.federation import FederationBeat, FederationClaimed, FederationProvisioned
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobFederationReady,
    JobFederationRun,
    JobPlaced,
    JobRoundCompleted,
)
from schemas.values import Assignment, Provenance
from tests.support import REPO, AgentProcess, of, records, registered, until
from tests.support.federated import (
    TENANT,
    Kernel,
    fedavg_by_hand,
    read_object,
    submit,
    upload_example,
    wait_for,
)

JOB = "acme/j1"


# -- the claim decisions (pure) ----------------------------------------------------------------------


# -- the fence's watchdog (real processes) -----------------------------------------------------------


def _sleeper(home: Path, tag: str) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), TAG: tag}
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_the_fence_kills_its_instances_fl_servers_once_the_deadline_passes_and_nothing_else(
    tmp_path: Path,
) -> None:
    mine, other = tmp_path / "fed-a", tmp_path / "fed-b"
    ours = _sleeper(mine / "acme" / "j1", "acme/j1")
    theirs = _sleeper(other / "acme" / "j1", "acme/j1")  # the same job, served by the other instance
    nested = _sleeper(mine / "fed-c" / "acme" / "j1", "acme/j1")  # another root inside this one
    fence.write_serving_until(mine, fence.now() + 1.0)
    watchdog = subprocess.Popen([sys.executable, "-I", fence.__file__, str(mine), str(os.getpid())])
    try:
        time.sleep(0.5)
        assert ours.poll() is None and fence.server_pids(mine) == [ours.pid]
        ours.wait(timeout=10)  # killed at the deadline
        assert ours.returncode == -signal.SIGKILL
        assert theirs.poll() is None and nested.poll() is None and watchdog.poll() is None
    finally:
        for proc in (ours, theirs, nested, watchdog):
            proc.kill()
            proc.wait()


# -- claim keepers on a real nats-server -------------------------------------------------------------


@contextlib.asynccontextmanager
async def _keeper(settings: Settings, instance: str, root: Path, jobs: list[str], lease_s: float) -> Any:
    """A running claim keeper on a connection of its own."""
    event_log = await EventLog.connect(settings)
    keeper = ClaimKeeper(event_log, instance, lambda: jobs, lease_s=lease_s, fence_root=root)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        yield keeper, task
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await event_log.close()


async def test_two_keepers_race_for_a_job_and_exactly_one_holds_it(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    async with (
        _keeper(settings, "fed-a", tmp_path / "a", [JOB], lease_s=3.0) as (a, _),
        _keeper(settings, "fed-b", tmp_path / "b", [JOB], lease_s=3.0) as (b, _),
    ):
        await until(lambda: a.holder(JOB) and b.holder(JOB), "both see a claim", timeout=20)
        await asyncio.sleep(2.0)  # ten beats from each: the claim does not move
        assert a.holder(JOB) == b.holder(JOB) and [a.holds(JOB), b.holds(JOB)].count(True) == 1
        winner, root = (a, tmp_path / "a") if a.holds(JOB) else (b, tmp_path / "b")
        assert winner.may_serve(JOB) and fence.serving_until(root) == winner.serving_until
    claims = of(await records(log, "FEDERATION"), FederationClaimed)
    assert [c.term for c in claims] == [1]  # the loser's claim conflicted: it was never stored


async def test_a_silent_holder_is_taken_over_after_its_lease_and_cannot_renew_after(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    async with _keeper(settings, "fed-a", tmp_path / "a", [JOB], lease_s=2.0) as (a, a_task):
        await until(lambda: a.may_serve(JOB), "fed-a holds the job", timeout=20)
        async with _keeper(settings, "fed-b", tmp_path / "b", [JOB], lease_s=2.0) as (b, _):
            await until(lambda: b.caught_up.is_set(), "fed-b caught up", timeout=20)
            await asyncio.sleep(1.5)
            assert not b.holds(JOB)  # fed-a beats: nothing to take over
            a_task.cancel()  # fed-a falls silent (paused, partitioned): it renews nothing from now
            with contextlib.suppress(BaseException):
                await a_task
            stale = a.view.last_seq
            await until(lambda: b.holds(JOB), "fed-b takes the job over", timeout=10)
            taken_at = fence.now()
            assert not a.may_serve(JOB) and taken_at - a.serving_until > 0.5  # fed-a stopped well before
            [_, claim] = of(await records(log, "FEDERATION"), FederationClaimed)
            assert (claim.instance, claim.term, claim.took_over_from) == ("fed-b", 2, "fed-a")
            # What fed-a appends from its stale view is refused: it learns it lost before renewing.
            beat = FederationBeat(incarnation=a.incarnation, lease_ms=2000)
            with pytest.raises(ConcurrencyConflict):
                await log.append(
                    federation_beat_subject("fed-a"),
                    beat,
                    expected_seq=stale,
                    expected_filter=FEDERATION_FILTER,
                )
            resumed = asyncio.create_task(a.run(asyncio.Event()))
            try:
                await until(lambda: a.serving_until > taken_at, "fed-a renews again", timeout=10)
                assert not a.holds(JOB) and not a.may_serve(JOB) and b.holds(JOB)
            finally:
                resumed.cancel()
                with contextlib.suppress(BaseException):
                    await resumed


# -- two federation services on real NVFlare ---------------------------------------------------------


class Instances(Kernel):
    """Federation services as processes, each with its own ``--instance`` name."""

    def start_instance(self, name: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with (self.data_dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "federation", "--instance", name],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=out,
            )

    def root(self, name: str) -> Path:
        return self.federations / name

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)


@contextlib.contextmanager
def instances(settings: Settings, data_dir: Path, *names: str) -> Iterator[Instances]:
    k = Instances(settings, data_dir, env={"RESONTECH_FEDERATION_LEASE_S": f"{LEASE_S:g}"})  # the real one
    for name in names:
        k.start_instance(name)
    try:
        yield k
    finally:
        for name, proc in list(k.procs.items()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            k.stop(name)
        for name in names:
            fence.kill_servers(k.root(name))


async def test_a_second_service_on_one_directory_and_a_bad_name_are_refused_in_one_line(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    with instances(settings, tmp_path / "kernel", "fed-a") as k:
        await until(lambda: (k.root("fed-a") / "serving-until").exists(), "fed-a running", timeout=60)
        for name, expected in (
            ("fed-a", "error: another federation service uses "),
            ("fed.a", "error: instance 'fed.a' must be 1-64 letters, digits, '-' or '_'"),
        ):
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "ops.cli", "federation", "--instance", name],
                cwd=REPO,
                env=k.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode != 0 and done.stderr.startswith(expected), done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert k.procs["fed-a"].poll() is None


class Overlap:
    """Samples, every 50 ms in a thread, which instances have FL server processes running."""

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots
        self.samples: list[set[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append({name for name, root in self.roots.items() if fence.server_pids(root)})
            time.sleep(0.05)

    def serving(self) -> set[str]:
        return self.samples[-1] if self.samples else set()

    def __enter__(self) -> Overlap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _place_by_hand(log: EventLog, job_id: str, shards: int) -> None:
    """What the coordinator appends once every shard has a worker (no agents here: the FL server
    starts once the job is placed, and waits for clients that never come)."""
    assignments = [
        Assignment(assignment_id=f"{job_id}-s{slot}-e1", worker_id=f"w-{slot}", slot=slot, epoch=1)
        for slot in range(shards)
    ]
    placed = JobPlaced(assignments=assignments, provenance=Provenance(candidates=shards, policy="test"))
    await log.append(job_subject(TENANT, job_id, placed), placed)


async def _holder(log: EventLog) -> FederationClaimed:
    claim: FederationClaimed = of(await records(log, "FEDERATION"), FederationClaimed)[-1]
    return claim


async def _ready(log: EventLog, count: int, timeout: float) -> list[JobFederationReady]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await records(log, "JOBS")
        ready = of(found, JobFederationReady)
        if len(ready) >= count:
            return ready
        assert not of(found, JobFailed), of(found, JobFailed)
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for job.federation_ready #{count}")


async def test_two_federation_services_run_one_fl_server_and_hand_it_over_when_its_holder_pauses_or_dies(
    log: EventLog, settings: Settings, tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-claims", tmp_path)
    with instances(settings, tmp_path / "kernel", "fed-a", "fed-b") as k:
        roots = {name: k.root(name) for name in ("fed-a", "fed-b")}
        with Overlap(roots) as seen:
            await submit(log, "np-claims", rounds=2)
            await _place_by_hand(log, "np-claims", shards=2)
            [first] = await _ready(log, 1, timeout=120)
            held = await _holder(log)  # a loaded machine may have handed it over once already
            holder = held.instance
            other = "fed-b" if holder == "fed-a" else "fed-a"
            assert seen.serving() == {holder}
            # Paused: its fence kills its FL server, the other takes the job over after the lease
            # and serves the same federation at the same address.
            k.signal(holder, signal.SIGSTOP)
            paused_at = time.monotonic()
            await until(lambda: seen.serving() == set(), "the paused holder's server fenced", timeout=15)
            fenced_after = time.monotonic() - paused_at
            [_, second] = await _ready(log, 2, timeout=90)
            taken = await _holder(log)
            assert (taken.instance, taken.took_over_from) == (other, holder) and taken.term > held.term
            assert second.server == first.server and second.kits == first.kits
            assert seen.serving() == {other}
            # Resumed: it finds the job taken and does not start its server again.
            k.signal(holder, signal.SIGCONT)
            await until(
                lambda: "holds it now" in k.logs(holder), "the resumed holder saw it lost", timeout=20
            )
            await asyncio.sleep(2)
            assert seen.serving() == {other}
            # Killed: the first instance takes the job back within its lease and a few seconds.
            k.kill(other)
            killed_at = time.monotonic()
            await until(lambda: seen.serving() == {holder}, "the survivor starts the FL server", timeout=60)
            back = await _holder(log)
            assert (back.instance, back.took_over_from) == (holder, other) and back.term > taken.term
            took = time.monotonic() - killed_at
        assert all(len(serving) <= 1 for serving in seen.samples), "two FL servers ran at once"
        assert fenced_after < LEASE_S  # before the lease let anyone take over
        assert took < 30.0
        runs = of(await records(log, "FEDERATION"), FederationProvisioned)
        assert len(runs) == 1  # provisioned once; the others adopted it


# -- end to end: agents, every round once --------------------------------------------------------------


HEARTBEAT = ("--heartbeat", "1.0")


@pytest.mark.faults
async def test_a_federated_job_completes_every_round_once_when_the_federation_holding_it_is_killed(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-ha", tmp_path)
    await registered(log, agents("ha-a", *HEARTBEAT))
    await registered(log, agents("ha-b", *HEARTBEAT))
    with instances(settings, tmp_path / "kernel", "fed-a", "fed-b") as k:
        k.start("coordinator")
        await submit(log, "np-ha", rounds=4, local_epochs=2, args=["--lr", "0.1", "--delay", "1"])
        await wait_for(log, JobRoundCompleted, "round 1")
        holder = (await _holder(log)).instance
        k.kill(holder)
        found = await wait_for(log, JobCompleted, "job.completed after the takeover", timeout=240)
        taken = await _holder(log)
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    assert taken.took_over_from == holder and taken.instance != holder
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2, 3, 4]
    first, again = of(found, JobFederationRun)
    assert first.first_round == 1 and again.first_round >= 2 and again.first_round + again.rounds - 1 == 4
    assert len(of(found, JobPlaced)) == 1  # the clients stayed where they were and reconnected
    metrics = json.loads(read_object(settings, "jobs/np-ha/files_out/metrics.json"))["rounds"]
    assert [r["round"] for r in metrics] == [1, 2, 3, 4]  # rounds of both instances
    with np.load(io.BytesIO(read_object(settings, "jobs/np-ha/model_out/model.npz"))) as model:
        w, b = fedavg_by_hand(tmp_path / "np-ha-shards", rounds=4, epochs=2, lr=0.1)
        np.testing.assert_allclose(model["w"], w, rtol=1e-6)  # no round lost or done twice
        np.testing.assert_allclose(model["b"], b, rtol=1e-6)
