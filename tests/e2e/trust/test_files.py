"""Nothing tenant code wrote is read by path from outside its sandbox (issue 25, attacks 1 and 2).

Tenant code writes its own directory (a workload's working dir, an FL server's federation); the agent
and the kernel read from it (checkpoints, rounds, models, logs, pid files). Every such read goes
beneath a directory fd taken before tenant code ran there, never through a link, regular files only
(:class:`core.files.TenantTree`). The attacks are played as tenant code would: a real enrolled agent
running a real DDP job whose workload swaps its checkpoint folder for a link to the agent's state,
and the federation's round and final-model upload against a federation directory with planted links
and a real object store.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from agent import reports
from agent.runtimes.warm import adopt
from agent.settings import load_agent_settings
from agent.state import CommandState
from core import flare
from core.errors import ConfigError
from core.log import EventLog
from core.objects import bucket_for, provision
from core.streams import command_subject
from ops.devstack.objectstore import ObjectStoreServer
from ops.federation import handover, server
from ops.federation.reports import JobReporter
from ops.federation.server import FederationError
from projections import REGISTRY, SCHEDULE
from projections.runner import rebuild
from projections.schedule import job_key
from schemas.commands import Rendezvous, StartWork, WorkSpec
from schemas.jobs import JobFailed
from tests.support import AgentProcess, coordinator, place
from tests.support.secured import Stack

# -- the helper ---------------------------------------------------------------------------------------


# -- attack 2: a DDP workload points its checkpoint folder at its agent's state -----------------------

STEAL_STATE = """
import json, os, sys, time
folder = os.environ["RESONTECH_CHECKPOINT_DIR"]
os.rename(folder, folder + ".old")
os.symlink(STATE_DIR, folder)  # the agent's state dir, wherever the agent keeps it
for name in ("enrollment.json", "commands.json"):
    print("RESONTECH_CHECKPOINT " + json.dumps({"path": name}), flush=True)
# the folder the agent made is now checkpoints.old: a link in it, to the agent's credentials
os.symlink(os.path.join(STATE_DIR, "enrollment.json"), folder + ".old/innocent.pt")
print("RESONTECH_CHECKPOINT " + json.dumps({"path": "innocent.pt"}), flush=True)
time.sleep(3)  # the agent reads the lines while it runs
"""


async def test_a_workload_cannot_make_its_agent_upload_the_agents_own_files(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess], object_store: ObjectStoreServer
) -> None:
    tenant, admin = await stack.tenant()
    s3 = object_store.client()
    provision(s3, bucket_for(tenant))
    provider, provider_key = await stack.provider()
    await stack.enroll("victim-host", provider, provider_key)
    agent = enrolled_agents("victim-host")
    script = STEAL_STATE.replace("STATE_DIR", repr(str(agent.state_dir)))
    s3.put_object(Bucket=bucket_for(tenant), Key="scripts/steal.py", Body=script.encode())
    async with coordinator(stack.log):
        worker = await agent.worker_id()

        async def verified() -> bool:
            registry, _ = await rebuild(stack.log, REGISTRY)
            w = registry.workers.get(worker)
            return bool(w and w.verified)

        await until_async(verified, "the agent verified")
        body = {
            "name": "steal",
            "kind": "ddp",
            "shards": 1,
            "command": ["scripts/steal.py"],
            "inputs": ["scripts/steal.py"],
        }
        submitted = await stack.post("/v1/jobs", admin, body)
        assert submitted.status_code == 201, submitted.text
        key = job_key(tenant, submitted.json()["job_id"])

        async def ended() -> Any:
            schedule, _ = await rebuild(stack.log, SCHEDULE)
            job = schedule.jobs.get(key)
            uploaded = [k for k in _keys(s3, tenant) if "/checkpoints/" in k]
            assert not uploaded, f"the agent uploaded {uploaded}"  # (and may not live to end the job)
            if job is not None and job.state in ("completed", "failed"):
                return job
            return None

        job = await until_async(ended, "the job ended", timeout=180.0)
        assert job.last_checkpoint is None, f"the agent uploaded {job.last_checkpoint}"
    enrollment = (agent.state_dir / "enrollment.json").read_text()
    secret = json.loads(enrollment)
    stored = s3.list_objects_v2(Bucket=bucket_for(tenant)).get("Contents", [])
    bodies = [s3.get_object(Bucket=bucket_for(tenant), Key=o["Key"])["Body"].read() for o in stored]
    assert not [o["Key"] for o in stored if "/checkpoints/" in o["Key"]]  # nothing was uploaded
    assert all(enrollment.encode() not in b and b"StartWork" not in b for b in bodies)
    assert all(str(v).encode() not in b for v in _secrets(secret) for b in bodies)
    assert job.last_checkpoint is None
    log = agent.stderr()
    assert log.count("checkpoint refused") == 3, log[-3000:]
    assert "'enrollment.json' does not exist" in log  # in the folder it made, not the one it was shown
    assert "'innocent.pt': a component is a symbolic link" in log


def _secrets(value: Any) -> list[str]:
    """Every long string in a decoded JSON value (the credentials an enrollment holds)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in _secrets(v)]
    if isinstance(value, list):
        return [s for v in value for s in _secrets(v)]
    return [value] if isinstance(value, str) and len(value) >= 16 else []


async def until_async(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if value := await predicate():
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# -- attack 1: a federation's FL server plants links where the kernel reads rounds --------------------


def _npz(**arrays: Any) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


@pytest.fixture
def federation(tmp_path: Path) -> tuple[Path, Path]:
    """The kernel's data dir (with its ``dev.env``) and one job's federation directory in it, as the
    FL server's sandbox can write it."""
    data = tmp_path / "data"
    fed = data / "federations" / "acme" / "fl-1"
    (fed / "rounds").mkdir(parents=True)
    (data / "dev.env").write_text("RESONTECH_OPERATOR_KEY=rt_operator_the_kernels_own\n")
    return data, fed


def _reporter(log: EventLog, s3: Any, tenant: str, fed: Path) -> JobReporter:
    return JobReporter(log, s3, tenant, "fl-1", fed, current=lambda: None)


def _job(tenant: str, framework: str = "numpy") -> Any:
    from schemas.jobs import FederatedTraining
    from tests.support.projection_records import job_record

    training = FederatedTraining(script="scripts/train.py", framework=framework)  # type: ignore[arg-type]
    return job_record(tenant=tenant, job_id="fl-1", name="fl", kind="federated", rounds=2, federated=training)


def _keys(s3: Any, tenant: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket_for(tenant)).get("Contents", [])]


@pytest.mark.parametrize(
    "plant",
    [
        "model-links-to-dev-env",
        "summary-links-to-dev-env",
        "rounds-folder-links-to-the-data-dir",
        "model-is-a-fifo",
        "model-is-a-hard-link",
    ],
)
async def test_the_fl_server_cannot_make_the_kernel_upload_the_kernels_files(
    log: EventLog, object_store: ObjectStoreServer, federation: tuple[Path, Path], plant: str
) -> None:
    data, fed = federation
    tenant = f"fl{os.urandom(4).hex()}"
    s3 = object_store.client()
    provision(s3, bucket_for(tenant))
    rounds = fed / "rounds"
    summary = json.dumps({"metrics": {"loss": 0.5}}).encode()
    if plant == "model-links-to-dev-env":
        (rounds / "round-00001.json").write_bytes(summary)
        (rounds / "round-00001.npz").symlink_to(data / "dev.env")
    elif plant == "summary-links-to-dev-env":
        (rounds / "round-00001.json").symlink_to(data / "dev.env")
        (rounds / "round-00001.npz").write_bytes(_npz(w=[1.0]))
    elif plant == "rounds-folder-links-to-the-data-dir":
        rounds.rmdir()
        rounds.symlink_to(data)
        (data / "round-00001.json").write_bytes(summary)  # names the kernel would list and upload
        os.link(data / "dev.env", data / "round-00001.npz")
    elif plant == "model-is-a-fifo":
        (rounds / "round-00001.json").write_bytes(summary)
        os.mkfifo(rounds / "round-00001.npz")
    else:
        (rounds / "round-00001.json").write_bytes(summary)
        os.link(data / "dev.env", rounds / "round-00001.npz")
    reporter = _reporter(log, s3, tenant, fed)
    with pytest.raises(FederationError) as refused:
        await asyncio.wait_for(reporter.collect_rounds(_job(tenant)), 30)
    assert any(
        why in refused.value.message
        for why in ("symbolic link", "not a regular file", "links (a hard link is refused)")
    ), refused.value.message
    assert _keys(s3, tenant) == []  # nothing of the kernel's reached the tenant's workspace
    assert reporter.reported == 0
    assert [r async for r in log.replay("JOBS")] == []


async def test_honest_rounds_are_uploaded_and_the_final_model_never_touches_the_servers_folder(
    log: EventLog, object_store: ObjectStoreServer, federation: tuple[Path, Path]
) -> None:
    data, fed = federation
    tenant = f"fl{os.urandom(4).hex()}"
    s3 = object_store.client()
    provision(s3, bucket_for(tenant))
    models = {n: _npz(w=[float(n), 2.0]) for n in (1, 2)}
    for n, model in models.items():
        (fed / "rounds" / f"round-0000{n}.npz").write_bytes(model)
        (fed / "rounds" / f"round-0000{n}.json").write_text(json.dumps({"metrics": {"loss": 1.0 / n}}))
    reporter = _reporter(log, s3, tenant, fed)
    await reporter.collect_rounds(_job(tenant, "pytorch"))
    assert reporter.reported == 2
    # the server plants links where the kernel used to write the .pt and read the final model
    (fed / "rounds" / "round-00002.pt").symlink_to(data / "dev.env")
    (fed / "rounds" / "round-00002.npz").unlink()
    (fed / "rounds" / "round-00002.npz").symlink_to(data / "dev.env")
    await reporter.complete(_job(tenant, "pytorch"))
    assert (data / "dev.env").read_text().startswith("RESONTECH_OPERATOR_KEY=")  # not written through
    bucket = bucket_for(tenant)

    def body(key: str) -> bytes:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    assert body("jobs/fl/model_out/model.npz") == models[2]
    assert body("jobs/fl/model_out/rounds/round-00001.npz") == models[1]
    assert all(b"RESONTECH_OPERATOR_KEY" not in body(k) for k in _keys(s3, tenant))
    import torch

    state = torch.load(io.BytesIO(body("jobs/fl/model_out/model.pt")), weights_only=True)
    assert state["w"].tolist() == [2.0, 2.0]
    assert json.loads(body("jobs/fl/files_out/metrics.json")) == {
        "rounds": [{"metrics": {"loss": 1.0}}, {"metrics": {"loss": 0.5}}]
    }


# -- the agent's state and its workloads' trees are apart; its state file holds no command's secrets --


def test_the_agents_state_and_its_workloads_are_separate_trees(tmp_path: Path) -> None:
    s = load_agent_settings(tmp_path, {"name": "gpu-1"}, {})
    state, work = Path(s.state_dir), Path(s.work_dir)
    assert not work.is_relative_to(state) and not state.is_relative_to(work)
    assert work.parent == state.parent  # beside it: `..` from a working dir is the work root, not state
    for state_dir, work_dir in [
        (tmp_path / "a", tmp_path / "a" / "work"),  # the old default
        (tmp_path / "w" / "state", tmp_path / "w"),
        (tmp_path / "same", tmp_path / "same"),
    ]:
        with pytest.raises(ConfigError, match="must be separate trees"):
            load_agent_settings(tmp_path, {"state_dir": str(state_dir), "work_dir": str(work_dir)}, {})


def _start(assignment_id: str = "a1", **spec: Any) -> StartWork:
    return StartWork(
        tenant="victim",
        work_id="j1",
        work_kind="job",
        assignment_id=assignment_id,
        slot=2,
        epoch=3,
        spec=WorkSpec(runtime="torchrun", command=["train.py", "--secret-arg"], **spec),
    )


def test_the_agents_state_file_keeps_no_commands_secrets_and_still_reports_a_crash(tmp_path: Path) -> None:
    secret = f"victim-secret-{os.urandom(8).hex()}"
    url = f"http://store/rt-victim/jobs/x?X-Amz-Signature={os.urandom(8).hex()}"
    whole = _start(
        env={"HF_TOKEN": secret},
        downloads={"train.py": url},
        resume_from="jobs/x/ck/1.pt",
        resume_url=url + "-resume",
        checkpoint_urls={"jobs/x/ck/2.pt": url + "-put"},
        rendezvous=Rendezvous(master_addr="10.0.0.1", master_port=29500, nnodes=3, node_rank=2),
        gpus=1,
    )
    state = CommandState.load(tmp_path)
    state.running[whole.assignment_id] = whole
    state.save()
    stored = (tmp_path / "commands.json").read_bytes()
    assert b"a1" in stored
    for leaked in (secret, "X-Amz-Signature", "--secret-arg", "10.0.0.1"):
        assert leaked.encode() not in stored, leaked
    assert (tmp_path / "commands.json").stat().st_mode & 0o777 == 0o600
    # an agent restarted after a crash reports what it ran, as before
    [(subject, failed, _)] = reports.ended(CommandState.load(tmp_path).running["a1"], "agent_restarted")
    assert isinstance(failed, JobFailed) and subject.startswith("job.victim.j1.")
    assert (failed.assignment_id, failed.epoch, failed.slot, failed.retryable) == ("a1", 3, 2, True)
    # a file an older agent wrote with whole commands is cut down as it is read
    (tmp_path / "commands.json").write_bytes(msgspec.json.encode({"running": {"a1": whole}}))
    assert CommandState.load(tmp_path).running["a1"].spec.env == {}


def test_a_warm_engine_takes_the_inputs_beneath_fds_never_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "agent-state"
    victim.mkdir()
    (victim / "enrollment.json").write_text("the agent's own")
    engine = tmp_path / "warm-abc"
    (engine / "data").mkdir(parents=True)
    (engine / "data" / "model").symlink_to(victim)  # planted where a fetched folder merges
    (engine / "weights.bin").symlink_to(victim / "enrollment.json")  # and where a fetched file lands
    (engine / "tmp").symlink_to(victim)
    workdir = tmp_path / "asg-1"
    (workdir / "data" / "model").mkdir(parents=True)
    (workdir / "data" / "model" / "enrollment.json").write_text("the tenant's")
    (workdir / "weights.bin").write_text("fetched")
    (workdir / "tmp").mkdir()
    (workdir / "tmp" / "x").write_text("fetched too")
    adopt(engine, workdir)
    assert [p.name for p in victim.iterdir()] == ["enrollment.json"]
    assert (victim / "enrollment.json").read_text() == "the agent's own"
    assert not (workdir / "data" / "model").is_symlink() and not (workdir / "tmp").is_symlink()
    assert (workdir / "data" / "model" / "enrollment.json").read_text() == "the tenant's"
    assert (workdir / "weights.bin").read_text() == "fetched" and not (workdir / "weights.bin").is_symlink()
    assert (workdir / "tmp" / "x").read_text() == "fetched too"


# -- a working dir used again: nothing an earlier run left is written through -------------------------

PLANT_LINKS = """
import os, sys, time
print("env secret seen:", os.environ.get("TENANT_TOKEN") == SECRET_VALUE, flush=True)
time.sleep(2)  # while it runs, the agent's state file is read
for name in ("scripts", "resume", "kit", "data"):
    os.rename(name, name + ".old") if os.path.isdir(name) and not os.path.islink(name) else None
    os.symlink(VICTIM_FOLDER, name)  # where the agent writes by path before the next start
"""


async def test_an_assignments_folder_used_again_is_fresh_and_the_state_file_holds_no_secret(
    stack: Stack,
    enrolled_agents: Callable[..., AgentProcess],
    object_store: ObjectStoreServer,
    tmp_path: Path,
) -> None:
    tenant, _ = await stack.tenant()
    s3 = object_store.client()
    bucket = bucket_for(tenant)
    provision(s3, bucket)
    victim = tmp_path / "victim"  # a folder of the agent's user, outside any workload's tree
    victim.mkdir()
    (victim / "train.py").write_text("the agent's own\n")
    secret = f"victim-secret-{os.urandom(8).hex()}"
    plant = PLANT_LINKS.replace("SECRET_VALUE", repr(secret)).replace("VICTIM_FOLDER", repr(str(victim)))
    s3.put_object(Bucket=bucket, Key="scripts/plant.py", Body=plant.encode())
    s3.put_object(Bucket=bucket, Key="scripts/train.py", Body=b"print('second run', flush=True)\n")

    def url(key: str) -> str:
        params = {"Bucket": bucket, "Key": key}
        return str(s3.generate_presigned_url("get_object", Params=params, ExpiresIn=600))

    provider, provider_key = await stack.provider()
    await stack.enroll("reused-host", provider, provider_key)
    agent = enrolled_agents("reused-host")
    worker = await agent.worker_id()
    assert not agent.work_dir.is_relative_to(agent.state_dir)
    assignment = "jfeedfacefeedfacefeedfacefeedface-s0-e1"

    def start(script: str) -> StartWork:
        spec = WorkSpec(
            runtime="process",
            command=[sys.executable, f"scripts/{script}"],
            env={"TENANT_TOKEN": secret},
            downloads={f"scripts/{script}": url(f"scripts/{script}")},
        )
        return StartWork(
            tenant=tenant, work_id="j1", work_kind="job", assignment_id=assignment, slot=0, epoch=1, spec=spec
        )

    first = start("plant.py")
    await place(stack.log, worker, first)
    await stack.log.append(command_subject(worker), first, event_id="start-1")
    state_file = agent.state_dir / "commands.json"
    stored = await until_async(
        _async(
            lambda: state_file.exists() and assignment in state_file.read_text() and state_file.read_text()
        ),
        "the agent recorded the assignment as running",
    )
    assert secret not in stored and "X-Amz-Signature" not in stored and "plant.py" not in stored
    log_txt = agent.work_dir / assignment / "log.txt"
    await until_async(
        _async(lambda: log_txt.exists() and "env secret seen: True" in log_txt.read_text()), "ran"
    )
    await until_async(_async(lambda: (agent.work_dir / assignment / "scripts").is_symlink()), "links planted")
    await until_async(
        _async(lambda: assignment not in state_file.read_text()), "its entry dropped at its end"
    )

    assert agent.stop() == 0  # the agent restarts; the kernel sends the same assignment again
    agent.start()
    second = start("train.py")
    await stack.log.append(command_subject(worker), second, event_id="start-2")
    await until_async(
        _async(lambda: log_txt.exists() and "second run" in log_txt.read_text()), "the second run ran"
    )
    assert (victim / "train.py").read_text() == "the agent's own\n"  # nothing written through a link
    assert sorted(p.name for p in victim.iterdir()) == ["train.py"]
    assert not (agent.work_dir / assignment / "scripts").is_symlink()
    assert "Traceback" not in agent.stderr()


def _async(predicate: Callable[[], Any]) -> Callable[[], Any]:
    async def check() -> Any:
        return predicate()

    return check


# -- a federation's handover and restart read nothing of the server's tree by path ---------------------


def test_the_kernel_keeps_its_federation_files_and_hands_over_nothing_the_server_planted(
    object_store: ObjectStoreServer, federation: tuple[Path, Path], tmp_path: Path
) -> None:
    data, fed = federation
    private = data / "federations-kernel" / "acme" / "fl-1"
    prov = server.provision(fed, private, tenant="acme", job_id="fl-1", host="localhost", sites=["site-0"])
    kit = prov.kit_zip("site-0").read_bytes()
    assert not prov.kit_zip("site-0").is_relative_to(fed)
    # the FL server (tenant code) rewrites what it can reach in its tree
    (fed / "project.yml").write_text(yaml.safe_dump({"name": "elsewhere", "participants": []}))
    (fed / "kits").mkdir(exist_ok=True)
    (fed / "kits" / "site-0.zip").symlink_to(data / "dev.env")
    (prov.server_dir / "startup" / "planted.txt").symlink_to(data / "dev.env")
    (prov.server_dir / "planted-dir").symlink_to(data)
    # a service restart finds the federation by the kernel's own project.yml, its kits in the kernel's dir
    again = server.provisioned_in(fed, private, ["site-0"])
    assert again == prov and again.admin_dir == prov.admin_dir
    assert again.kit_zip("site-0").read_bytes() == kit
    # the handover archive holds no file of the kernel's, and the next holder adopts it cleanly
    s3 = object_store.client()
    handover.publish(s3, prov, "_servers/acme/fl-1/x-1.zip")
    assert (
        handover.local_id(private) == "_servers/acme/fl-1/x-1.zip" and not (fed / handover.ID_FILE).exists()
    )
    archive = s3.get_object(Bucket=flare.KIT_BUCKET, Key="_servers/acme/fl-1/x-1.zip")["Body"].read()
    assert b"RESONTECH_OPERATOR_KEY" not in archive
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        names = z.namelist()
        assert z.read("project.yml") == (private / "project.yml").read_bytes()
        assert z.read("kits/site-0.zip") == kit
    assert not [n for n in names if "planted" in n or n.split("/")[2:3] == ["state"]]
    fed2, private2 = tmp_path / "next" / "fl-1", tmp_path / "next-kernel" / "fl-1"
    fed2.mkdir(parents=True)
    (fed2 / "leftover").symlink_to(data)  # what a previous server left in the next holder's folder
    adopted = handover.adopt(s3, "_servers/acme/fl-1/x-1.zip", fed2, private2, ["site-0"])
    assert (adopted.name, adopted.port, adopted.host) == (prov.name, prov.port, prov.host)
    assert adopted.kit_zip("site-0").read_bytes() == kit and not (fed2 / "project.yml").exists()
    assert (adopted.server_dir / "startup" / "rootCA.pem").read_bytes() == (
        prov.server_dir / "startup" / "rootCA.pem"
    ).read_bytes()
    assert json.loads((adopted.server_dir / "local" / "resources.json").read_text())
    # the server's configuration is never read, nor written, through the server's links
    local = prov.server_dir / "local"
    for name in ("resources.json.default", "resources.json"):
        (local / name).unlink()
        (local / name).symlink_to(data / "dev.env")
    with pytest.raises(FederationError, match="symbolic link"):
        server.configure_server(prov)
    assert (data / "dev.env").read_text().startswith("RESONTECH_OPERATOR_KEY=")
    assert not (fed2 / "leftover").exists() and [p.name for p in data.iterdir()] == [
        "dev.env",
        "federations",
        "federations-kernel",
    ]
