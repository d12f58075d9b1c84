"""Tenant code runs sandboxed under real agents: a probe job finds nothing, a host that cannot sandbox says
why and refuses work, an unsandboxed worker runs only its owner's work, probes in NVFlare clients and the FL
server find nothing."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.models import model_cache
from core.log import EventLog
from core.sandbox import python_paths
from schemas.jobs import JobCompleted, JobFailed, JobRejected, JobShardCompleted, JobStarted
from schemas.workers import WorkerRegistered
from tests.support import AgentProcess, of, records, registered, wait_records
from tests.support.sandbox_probe import ETC_SEEN, PROBE, digest, read_proc
from tests.support.work import py, send, start_work

EXAMPLES_DIR = Path(__file__).parents[3] / "examples"


async def test_a_probe_job_through_a_real_agent_finds_nothing(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    agent = agents("probed")
    worker_id = await registered(log, agent)
    assert agent.proc is not None
    environ = read_proc(agent.proc.pid, "environ").split(b"\0")
    kernel_secrets = [
        v.partition(b"=")[2].decode() for v in environ if v.startswith((b"RESONTECH_", b"NATS"))
    ]
    (agent.state_dir / "enrollment.json").write_text(json.dumps({"password": secrets.token_urlsafe(16)}))
    enrollment = json.loads((agent.state_dir / "enrollment.json").read_text())  # as an enrolled host has
    targets = {
        "absent": [str(agent.state_dir / n) for n in ("enrollment.json", "commands.json", "worker_id")]
        + [str(agent.stderr_path), "/etc/shadow", "/etc/ssl/private", "/etc/ssh"],
        "secrets": [digest(v) for v in kernel_secrets + [str(x) for x in enrollment.values()] if len(v) >= 8],
        "pids": [agent.proc.pid, os.getpid()],
        "unwritable": ["/", "/usr/lib", sys.prefix],
        "allowed": [str(p) for p in python_paths()] + [str(model_cache()), *ETC_SEEN],
    }
    probe = ["python", "-c", PROBE.read_text()]  # "python": the sandbox's, the agent's environment
    await send(log, worker_id, start_work([*probe, json.dumps(targets)]))
    jobs = await wait_records(
        log, "JOBS", lambda rs: of(rs, JobShardCompleted) or of(rs, JobFailed), "the probe's end"
    )
    assert of(jobs, JobShardCompleted), of(jobs, JobFailed)
    log_txt = (agent.work_dir / "j1-s0-e1" / "log.txt").read_text()
    assert "PROBE_FINDINGS []" in log_txt, log_txt


async def test_a_host_that_cannot_sandbox_registers_why_and_refuses_work(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    (tmp_path / "bin").mkdir()
    agent = agents("no-bwrap", env={"PATH": str(tmp_path / "bin")})  # a host without bubblewrap
    worker_id = await registered(log, agent)
    [registration] = of(await records(log, "WORKERS", f"worker.{worker_id}.registered"), WorkerRegistered)
    assert registration.sandbox == "unavailable" and "bubblewrap" in registration.sandbox_problem
    await send(log, worker_id, start_work(["true"]))
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobRejected), "job.rejected")
    [rejected] = of(jobs, JobRejected)
    assert rejected.reason.startswith("this host cannot sandbox workloads: bubblewrap")
    assert not of(jobs, JobStarted)


async def test_an_agent_refuses_work_that_names_a_container_image_rather_than_run_it_without(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    agent = agents("bare-host")
    worker_id = await registered(log, agent)
    [registration] = of(await records(log, "WORKERS", f"worker.{worker_id}.registered"), WorkerRegistered)
    assert registration.sandbox == "bubblewrap"  # not "kubernetes": placement gives it no such work
    ran = tmp_path / "ran"
    await send(
        log, worker_id, start_work(py(f"open({str(ran)!r}, 'w')"), image="docker.io/tenant/trainer:v1")
    )
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobRejected), "job.rejected")
    [rejected] = of(jobs, JobRejected)
    assert (
        rejected.reason
        == "this worker runs no container images (the work names 'docker.io/tenant/trainer:v1')"
    )
    assert not of(jobs, JobStarted) and not ran.exists()


async def test_an_unsandboxed_worker_registers_so_and_runs_its_owners_work_as_its_own_process(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    agent = agents("dev", "--unsandboxed", "--pool", "private", "--owner-tenant", "acme")
    worker_id = await registered(log, agent)
    [registration] = of(await records(log, "WORKERS", f"worker.{worker_id}.registered"), WorkerRegistered)
    assert (registration.sandbox, registration.sandbox_problem) == ("off", "")
    seen = tmp_path / "visible-to-an-unsandboxed-workload"
    seen.write_text("the host's")
    code = f"import os, sys; sys.exit(0 if os.path.exists({str(seen)!r}) else 5)"
    await send(log, worker_id, start_work(py(code)))
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted) or of(rs, JobFailed), "end")
    assert of(jobs, JobShardCompleted), of(jobs, JobFailed)  # it saw the host: unsandboxed, as it said


PROBE_LIB = PROBE.read_text().split('if __name__ == "__main__":')[0]


def persistor_probe(targets: dict[str, Any]) -> str:
    """A tenant persistor (it runs inside the kernel's FL server) that probes, then starts the model."""
    return (
        PROBE_LIB
        + f"""
import numpy as np
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor


class ProbingPersistor(ModelPersistor):
    def load_model(self, fl_ctx):
        with open("probe-findings.json", "w") as out:
            json.dump(probe(json.loads({json.dumps(json.dumps(targets))})), out)
        return make_model_learnable({{"w": np.zeros(3), "b": np.zeros(1)}}, {{}})

    def save_model(self, model, fl_ctx):
        pass
"""
    )


async def test_probes_in_nvflare_clients_and_the_fl_server_find_nothing(
    log: EventLog, settings: Any, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    from tests.support.federated import (
        HEARTBEAT,
        TENANT,
        all_stopped,
        kernel,
        submit,
        upload,
        upload_example,
        wait_for,
    )

    hosts = [agents("fl-probe-a", *HEARTBEAT), agents("fl-probe-b", *HEARTBEAT)]
    for host in hosts:
        await registered(log, host)
    data_dir = tmp_path / "kernel"
    job_dir = data_dir / "federations" / TENANT / "np-probe"
    agent_files = [str(h.state_dir / n) for h in hosts for n in ("worker_id", "commands.json")]
    common = {
        "secrets": [
            digest(v) for v in (settings.s3_secret_key, settings.s3_access_key, "kernel-secret-value")
        ],
        "pids": [h.proc.pid for h in hosts if h.proc is not None] + [os.getpid()],
        "unwritable": ["/", "/usr/lib", sys.prefix],
    }
    allowed = [str(p) for p in python_paths()] + [str(model_cache()), *ETC_SEEN]
    client = {**common, "absent": [*agent_files, str(data_dir)], "allowed": allowed}
    server = {**common, "absent": agent_files, "allowed": [*allowed, str(job_dir)]}
    upload_example(settings, "fedavg-numpy", "np-probe", tmp_path)
    train = (EXAMPLES_DIR / "fedavg-numpy" / "train.py").read_text()
    script = (
        PROBE_LIB + f"\nif report(json.loads({json.dumps(json.dumps(client))})):\n    sys.exit(3)\n" + train
    )
    upload(settings, "jobs/np-probe/scripts/train.py", script.encode())
    upload(settings, "jobs/np-probe/scripts/persistor.py", persistor_probe(server).encode())
    with kernel(settings, data_dir, env={"NATS_TOKEN": "kernel-secret-value"}):
        await submit(
            log, "np-probe", rounds=1, persistor="jobs/np-probe/scripts/persistor.py:ProbingPersistor"
        )
        found = await wait_for(log, JobCompleted, "job.completed", timeout=180)
        await all_stopped(found, "np-probe")
    assert not of(found, JobFailed), of(found, JobFailed)
    for host in hosts:
        logs = "".join(p.read_text() for p in host.work_dir.glob("*/log.txt"))
        assert "PROBE_FINDINGS []" in logs, logs[-3000:]
    [noted] = job_dir.rglob("probe-findings.json")
    assert json.loads(noted.read_text()) == []
