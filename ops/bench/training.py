"""Benchmark federated training: submit to the first completed round, the platform's per-round
overhead against plain ``nvflare simulator`` running the same job on the same machine, and recovery
after a client's agent is SIGKILLed.

The platform: a private nats-server and object store, the coordinator and the federation service as
processes (as the dev stack runs them), and three real agents (1 s heartbeats). The job: the NumPy
FedAvg example (``examples/fedavg-numpy``) on two shards, ``ROUNDS`` rounds of ``EPOCHS`` local epochs.

* ``first_round_s``: store time of ``job.submitted`` to store time of the first ``job.round_completed``
  (provisioning, FL server start, placement, kit and shard download, client start, the run's deploy,
  and one round).
* ``round_s``: median interval between consecutive ``round_completed`` store times (what a user sees
  in the feed; includes uploading each round's model and appending its events).
* The baseline, same run and machine: ``nvflare simulator -n 2 -t 2`` on the same FL job folder the
  platform generates (NVFlare's FedAvg with the kernel's persistor and round writer, the same script,
  shards, rounds and epochs); its
  ``sim_round_s`` is the median interval between the round files its server wrote.
  ``overhead_ratio = round_s / sim_round_s``; ``job_s`` / ``sim_s`` compare the whole run (submit to
  ``job.completed``; the simulator command's wall time).
* Recovery (one trial per repetition): a slower job (``--delay`` per epoch) whose slot-0 agent is
  SIGKILLed as soon as round 1 completes; ``fl_recovery_s``: the kill to the store time of the next
  ``round_completed`` (detection of the lost worker, abort of the run in flight, re-placement, the
  replacement's download and client start, a new run from the last global model, and that round
  redone); ``detect_s``: to ``worker.lost``; ``rerun_s``: to the restarted run's ``federation_run``.

Peak RSS: the federation service, one agent, and the largest FL server and client process trees seen.

Distributed training (:mod:`ops.bench.gang`, on the same platform): ``gang_restart_s``, the SIGKILL of
one node of a two-node FSDP2 job to the restarted gang's next training step; ``gang_recovery_s`` (the
same without a gang restart) is ``None`` until elastic gangs are built; ``checkpoint_stall_s`` against
``checkpoint_stall_full_s``, sharded async saves against one full file.

Usage: ``python -m ops.bench.training [--quick]``. Default: 3 repetitions of each; ``--quick``: one
of each, with a 2-round FL job (about 4 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvloop

from core import flare, flarejob
from core.log import EventLog
from core.objects import bucket_for, provision, s3_client
from core.proctags import kill_tagged, tagged_pids
from core.settings import Settings
from core.streams import job_subject
from ops.bench import gang
from ops.bench.agents import Agent, child_env, stop_child
from ops.bench.common import emit, machine, median, private_nats, process_peak_rss_mb, table
from ops.devstack.objectstore import ObjectStoreServer
from ops.federation.jobfolder import write_run
from ops.federation.server import TAG
from schemas.jobs import FederatedTraining, JobResources, JobSubmitted

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "fedavg-numpy"
FSDP_EXAMPLE = REPO / "examples" / "fsdp-lm"
TENANT = "bench"
ROUNDS, EPOCHS = 5, 3
RECOVERY_ROUNDS, RECOVERY_DELAY_S = 4, 1.0
JOB_TIMEOUT_S = 300.0
SIM_WRAPPER = """
# Run the example with this site's shard: the simulator gives every site the same environment, but
# runs each in its own workspace directory (named after the site).
import os, runpy, sys
os.environ["RESONTECH_DATA_ROOT"] = os.path.join(os.environ["BENCH_SIM_DATA"], os.path.basename(os.getcwd()))
sys.argv[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Platform:
    """The kernel's services and the agents, as processes, on a private NATS and object store."""

    def __init__(self, root: Path, settings: Settings) -> None:
        self.root = root
        self.settings = settings
        self.env = child_env(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_DATA_DIR=str(root),
        )
        self.services: dict[str, subprocess.Popen[bytes]] = {}
        self.agents: dict[str, Agent] = {}
        self.rss: dict[str, float] = {}

    def start(self, agents: int) -> None:
        for service in ("intake", "coordinator", "federation"):
            with (self.root / f"{service}.log").open("ab") as out:
                self.services[service] = subprocess.Popen(
                    [sys.executable, "-m", "ops.cli", service], cwd=REPO, env=self.env, stdout=out, stderr=out
                )
        for n in range(agents):
            self.add_agent(f"agent-{n}")

    def add_agent(self, name: str) -> Agent:
        """An agent as a training host runs one: no warm inference engine (a GPU host keeps none, and
        on two cores three of them starting would take the CPU the first job needs)."""
        agent = Agent(name, self.root, self.settings.nats_url)
        agent.env["RESONTECH_AGENT_WARM_ENGINES"] = "0"
        self.agents[name] = agent.start()
        return agent

    def agent_of(self, worker_id: str) -> Agent:
        """The agent whose worker is ``worker_id``."""
        return next(
            a for a in self.agents.values() if (a.state_dir / "worker_id").read_text().strip() == worker_id
        )

    def note_rss(self) -> None:
        """Peak RSS so far of the federation service, an agent, and the NVFlare processes alive now."""
        fed = self.services.get("federation")
        if fed is not None and fed.poll() is None:
            self.rss["federation_service"] = max(
                self.rss.get("federation_service", 0), process_peak_rss_mb(fed.pid)
            )
        for agent in self.agents.values():
            agent.note_rss()
            self.rss["agent"] = max(self.rss.get("agent", 0.0), agent.peak_rss_mb)
        for job_dir in (self.root / "federations" / TENANT).glob("*"):
            server = sum(process_peak_rss_mb(pid) for pid in tagged_pids(TAG, f"{TENANT}/{job_dir.name}"))
            self.rss["fl_server"] = max(self.rss.get("fl_server", 0.0), server)
        for agent in self.agents.values():
            for work in agent.work_dir.glob("*"):
                client = sum(
                    process_peak_rss_mb(p) for p in tagged_pids("RESONTECH_ASSIGNMENT_ID", work.name)
                )
                self.rss["fl_client"] = max(self.rss.get("fl_client", 0.0), client)

    def stop(self) -> None:
        self.note_rss()
        for agent in self.agents.values():
            agent.stop()
        for proc in self.services.values():
            stop_child(proc, 30)
        for job_dir in (self.root / "federations").glob("*/*"):
            kill_tagged(TAG, f"{job_dir.parent.name}/{job_dir.name}")


def make_shards(out: Path) -> list[Path]:
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_shards.py"), str(out)], check=True, capture_output=True
    )
    return sorted(out.glob("shard-*.zip"))


def upload_job(s3: Any, name: str, shards: list[Path]) -> None:
    bucket = bucket_for(TENANT)
    provision(s3, bucket)
    s3.upload_file(str(EXAMPLE / "train.py"), bucket, f"jobs/{name}/scripts/train.py")
    for path in shards:
        s3.upload_file(str(path), bucket, f"jobs/{name}/shards/{path.name}")


async def submit(log: EventLog, name: str, rounds: int, args: list[str]) -> None:
    event = JobSubmitted(
        name=name,
        kind="federated",
        shards=2,
        rounds=rounds,
        local_epochs=EPOCHS,
        resources=JobResources(),
        federated=FederatedTraining(script=f"jobs/{name}/scripts/train.py", args=args),
    )
    await log.append(job_subject(TENANT, name, event), event, event_id=f"bench-{name}")


async def events_until(log: EventLog, name: str, done: str, platform: Platform) -> list[Any]:
    """The job's records once one's subject ends with ``done`` (or the job failed)."""
    return await records_until(log, name, lambda rs: any(r.subject.endswith(done) for r in rs), platform)


async def records_until(log: EventLog, name: str, done: Any, platform: Platform) -> list[Any]:
    """The job's records once ``done(records)`` holds.

    Raises:
        RuntimeError: the job failed, or it did not hold within :data:`JOB_TIMEOUT_S`.
    """
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        found = [r async for r in log.replay("JOBS", subjects=f"job.{TENANT}.{name}.>")]
        if done(found):
            return found
        failed = [r.event for r in found if r.subject.endswith(".failed") and r.event.slot is None]
        if failed:
            raise RuntimeError(f"job {name} failed: {failed[0].reason}\n{failed[0].log_tail}")
        platform.note_rss()
        await asyncio.sleep(0.25)
    raise RuntimeError(f"job {name}: not done within {JOB_TIMEOUT_S:.0f}s")


async def verified_workers(log: EventLog, count: int) -> None:
    """Wait until ``count`` workers have been verified (each new agent is, before it gets work)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while sum([1 async for _ in log.replay("WORKERS", subjects="worker.*.verified")]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} workers verified within {JOB_TIMEOUT_S:.0f}s")
        await asyncio.sleep(0.25)


def _times(found: list[Any], suffix: str) -> list[float]:
    return [r.time_ns / 1e9 for r in found if r.subject.endswith(suffix)]


def _intervals(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def platform_run(log: EventLog, platform: Platform, name: str, rounds: int) -> dict[str, float]:
    await submit(log, name, rounds, ["--lr", "0.1"])
    found = await events_until(log, name, ".completed", platform)
    submitted = _times(found, ".submitted")[0]
    rounds_at = _times(found, ".round_completed")
    return {
        "first_round_s": rounds_at[0] - submitted,
        "round_s": median(_intervals(rounds_at)),
        "job_s": _times(found, ".completed")[0] - submitted,
    }


def simulator_run(root: Path, shards: list[Path], rounds: int) -> dict[str, float]:
    """``nvflare simulator`` on the job folder the platform would generate for the same job."""
    shutil.rmtree(root, ignore_errors=True)
    data, job, out = root / "data", root / "job", root / "rounds"
    for i, shard in enumerate(shards):
        with zipfile.ZipFile(shard) as archive:
            archive.extractall(data / flare.site_name(i))
    fljob = flarejob.script_job(
        sites=[flare.site_name(i) for i in range(len(shards))], script="bench_main.py",
        script_args=["--lr", "0.1"], framework="numpy",
    )  # fmt: skip
    documents = flarejob.run_documents(
        fljob, name="bench-sim", first_round=1, rounds=rounds, out_dir=str(out), start_model=None
    )
    code = root / "code"
    custom = code / flarejob.CLIENT_APP / "custom"
    custom.mkdir(parents=True)
    shutil.copyfile(EXAMPLE / "train.py", custom / "train.py")
    (custom / "bench_main.py").write_text(SIM_WRAPPER)
    write_run(job, code, fljob, documents)
    env = child_env(HOME=str(root), BENCH_SIM_DATA=str(data), RESONTECH_LOCAL_EPOCHS=str(EPOCHS))
    argv = [sys.executable, "-m", "nvflare.cli", "simulator", "-w", str(root / "ws"), "-n", str(len(shards))]
    started = time.monotonic()
    with (root / "simulator.log").open("wb") as log_file:
        done = subprocess.run(
            [*argv, "-t", str(len(shards)), str(job)],
            cwd=root,
            env=env,
            stdout=log_file,
            stderr=log_file,
            timeout=600,
        )
    elapsed = time.monotonic() - started
    stamps = sorted(p.stat().st_mtime for p in out.glob("round-*.json"))
    if done.returncode != 0 or len(stamps) != rounds:
        raise RuntimeError(
            f"simulator failed ({done.returncode}, {len(stamps)} rounds): see {root}/simulator.log"
        )
    return {"sim_round_s": median(_intervals(stamps)), "sim_s": elapsed}


async def recovery_trial(log: EventLog, platform: Platform, name: str, spare: int) -> dict[str, float]:
    """Kill slot 0's agent when round 1 completes; time the way back to the next completed round."""
    await submit(log, name, RECOVERY_ROUNDS, ["--lr", "0.1", "--delay", str(RECOVERY_DELAY_S)])
    found = await events_until(log, name, ".round_completed", platform)
    placed = next(r.event for r in found if r.subject.endswith(".placed"))
    victim_id = next(a.worker_id for a in placed.assignments if a.slot == 0)
    victim = platform.agent_of(victim_id)
    killed = time.time()
    victim.kill()
    platform.add_agent(f"agent-spare-{spare}")  # the pool stays at three for the next trial
    found = await events_until(log, name, ".completed", platform)
    rounds_after = [t for t in _times(found, ".round_completed") if t > killed]
    runs = _times(found, ".federation_run")
    lost = [r.time_ns / 1e9 async for r in log.replay("WORKERS", subjects=f"worker.{victim_id}.lost")]
    return {
        "recovery_s": rounds_after[0] - killed,
        "detect_s": lost[0] - killed,
        "rerun_s": runs[-1] - killed,
    }


@contextlib.contextmanager
def object_store(root: Path) -> Iterator[ObjectStoreServer]:
    server = ObjectStoreServer(root / "objects", secret_key="bench-secret-key")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def run(quick: bool) -> dict[str, Any]:
    repetitions = 1 if quick else 3
    rounds = 2 if quick else ROUNDS
    with (
        tempfile.TemporaryDirectory(prefix="resontech-bench-training-") as tmp,
        private_nats() as nats_server,
    ):
        root = Path(tmp)
        with object_store(root) as store:
            settings = Settings(
                nats_url=nats_server.url,
                s3_endpoint=store.endpoint,
                s3_access_key=store.access_key,
                s3_secret_key=store.secret_key,
            )
            return await _measure(root, settings, repetitions, rounds)


async def _measure(root: Path, settings: Settings, repetitions: int, rounds: int) -> dict[str, Any]:
    s3 = s3_client(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key)
    shards = make_shards(root / "shards")
    log = await EventLog.connect(settings, name="bench-training")
    await log.ensure_streams()
    platform = Platform(root, settings)
    platform.start(agents=3)
    jobs: list[dict[str, float]] = []
    sims: list[dict[str, float]] = []
    trials: list[dict[str, float]] = []
    gangs: list[dict[str, float]] = []

    async def until(log: EventLog, name: str, done: Any) -> list[Any]:
        return await records_until(log, name, done, platform)

    try:
        await verified_workers(log, 3)  # a user submits to a running platform, not to one starting up
        gang.upload(s3, FSDP_EXAMPLE)
        for n in range(repetitions):
            name = f"fedavg-{n}"
            upload_job(s3, name, shards)
            jobs.append(await platform_run(log, platform, name, rounds))
            sims.append(await asyncio.to_thread(simulator_run, root / f"sim-{n}", shards, rounds))
            print(f"  run {n + 1}: {jobs[-1]} | simulator {sims[-1]}", file=sys.stderr, flush=True)
            upload_job(s3, f"recover-{n}", shards)
            trials.append(await recovery_trial(log, platform, f"recover-{n}", n))
            print(f"  FL recovery {n + 1}: {trials[-1]}", file=sys.stderr, flush=True)
            restart = await gang.restart_trial(log, platform, f"gang-{n}", n, until)
            gangs.append({**restart, **await gang.full_save_trial(log, f"full-{n}", until)})
            print(f"  gang {n + 1}: {gangs[-1]}", file=sys.stderr, flush=True)
    finally:
        platform.stop()
        await log.close()
    figures: dict[str, Any] = {
        "bench": "training",
        "first_round_s": round(median([j["first_round_s"] for j in jobs]), 2),
        "round_s": round(median([j["round_s"] for j in jobs]), 2),
        "sim_round_s": round(median([s["sim_round_s"] for s in sims]), 2),
        "overhead_ratio": round(
            median([j["round_s"] / s["sim_round_s"] for j, s in zip(jobs, sims, strict=True)]), 2
        ),
        "job_s": round(median([j["job_s"] for j in jobs]), 1),
        "sim_s": round(median([s["sim_s"] for s in sims]), 1),
        "fl_recovery_s": round(median([t["recovery_s"] for t in trials]), 2),
        "detect_s": round(median([t["detect_s"] for t in trials]), 2),
        "rerun_s": round(median([t["rerun_s"] for t in trials]), 2),
        "fl_recovery_all_s": [round(t["recovery_s"], 2) for t in trials],
        "gang_recovery_s": None,  # elastic gangs (survivors keep their processes) are not built
        "gang_restart_s": round(median([g["gang_restart_s"] for g in gangs]), 2),
        "gang_detect_s": round(median([g["gang_detect_s"] for g in gangs]), 2),
        "gang_started_s": round(median([g["gang_started_s"] for g in gangs]), 2),
        "gang_restart_all_s": [round(g["gang_restart_s"], 2) for g in gangs],
        "checkpoint_stall_s": round(median([g["checkpoint_stall_s"] for g in gangs]), 3),
        "checkpoint_stall_full_s": round(median([g["checkpoint_stall_full_s"] for g in gangs]), 3),
        "rounds": rounds,
        "local_epochs": EPOCHS,
        "repetitions": repetitions,
        "peak_rss_mb": {k: round(v) for k, v in sorted(platform.rss.items())},
    }
    return {**figures, **machine()}


def summary(f: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("figure", "platform", "baseline (same run)", "note")]
    rows.append(
        ("submit -> first round (s)", f"{f['first_round_s']}", "-", "provision, start, deploy, 1 round")
    )
    rows.append(
        (
            "per round (s), median",
            f"{f['round_s']}",
            f"simulator {f['sim_round_s']}",
            f"ratio {f['overhead_ratio']}",
        )
    )
    rows.append(
        (f"{f['rounds']}-round job (s)", f"{f['job_s']}", f"simulator {f['sim_s']}", "submit to completed")
    )
    rows.append(
        (
            "FL: SIGKILL -> next round (s)",
            f"{f['fl_recovery_s']}",
            "-",
            f"lost {f['detect_s']}s, rerun {f['rerun_s']}s",
        )
    )
    rows.append(
        (
            "FSDP: SIGKILL -> next step (s)",
            f"{f['gang_restart_s']} (gang restart)",
            "elastic: not built",
            f"lost {f['gang_detect_s']}s, started {f['gang_started_s']}s",
        )
    )
    rows.append(
        (
            "checkpoint stall per save (s)",
            f"{f['checkpoint_stall_s']} sharded, async",
            f"{f['checkpoint_stall_full_s']} one full file",
            "longest per job, rank 0",
        )
    )
    rss = ", ".join(f"{k} {v} MB" for k, v in f["peak_rss_mb"].items())
    return table(rows) + f"\npeak RSS: {rss}\nmachine: {f['cores']} cores, {f['cpu']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of each, a 2-round FL job")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    figures = uvloop.run(run(args.quick))
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
