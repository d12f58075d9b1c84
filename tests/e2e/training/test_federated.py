"""Federated jobs end to end: real agents, coordinator, federation service and NVFlare."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent.host import cpu_count
from core import flare
from core.log import EventLog
from core.proctags import kill_tagged, tagged_pids
from core.settings import Settings
from core.streams import job_subject
from gateway.routes.jobs import job_view
from ops.cli.jobs import job_detail
from ops.federation.server import TAG
from ops.federation.workspace import list_keys
from projections.schedule import ScheduleState, evolve
from projections.why import explain_job
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobFederationReady,
    JobFederationRun,
    JobFederationStopped,
    JobPlaced,
    JobProgress,
    JobRoundCompleted,
    JobStarted,
)
from tests.support import AgentProcess, of, records, registered, until, wait_records
from tests.support.federated import (
    EXAMPLES,
    HEARTBEAT,
    TENANT,
    all_stopped,
    fedavg_by_hand,
    kernel,
    read_object,
    s3,
    submit,
    upload,
    upload_example,
    upload_folder,
    wait_for,
)


def kits_left(settings: Settings, job: str) -> list[str]:
    """The job's client kits in the kernel's kit bucket (none before the first is uploaded)."""
    client = s3(settings)
    with contextlib.suppress(client.exceptions.NoSuchBucket):
        return sorted(key for key, _ in list_keys(client, flare.KIT_BUCKET, f"{TENANT}/{job}/"))
    return []


async def test_a_federated_numpy_job_runs_fedavg_across_two_agents(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-fedavg", tmp_path)
    await registered(log, agents("fl-a", *HEARTBEAT))
    await registered(log, agents("fl-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel") as running:
        await submit(log, "np-fedavg", rounds=2, local_epochs=3, args=["--lr", "0.1"])
        found = await wait_for(log, JobCompleted, "job.completed")
        await all_stopped(found, "np-fedavg")
        await until(lambda: not kits_left(settings, "np-fedavg"), "the kits (the clients' keys) deleted")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    [ready] = of(found, JobFederationReady)
    assert ready.sites == ["site-1", "site-2"] and ready.server.startswith("localhost:")
    runs = [(r.first_round, r.rounds, r.reason) for r in of(found, JobFederationRun)]
    assert runs == [(1, 2, "start")], running.logs("federation")[-4000:]  # a restart says why there
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2]
    checkpoints = of(found, JobCheckpointed)
    assert [c.object_key for c in checkpoints] == [
        "jobs/np-fedavg/model_out/rounds/round-00001.npz",
        "jobs/np-fedavg/model_out/rounds/round-00002.npz",
    ]
    site_progress = [e for e in of(found, JobProgress) if e.slot is not None]
    assert {(e.slot, e.round, e.train_epoch) for e in site_progress} >= {(0, 1, 1), (1, 2, 3)}
    assert all(e.loss is not None for e in site_progress)
    [completed] = of(found, JobCompleted)
    assert "jobs/np-fedavg/model_out/model.npz" in completed.outputs
    with np.load(io.BytesIO(read_object(settings, "jobs/np-fedavg/model_out/model.npz"))) as model:
        assert set(model.files) == {"w", "b"}
        w, b = fedavg_by_hand(tmp_path / "np-fedavg-shards", rounds=2, epochs=3, lr=0.1)
        np.testing.assert_allclose(model["w"], w, rtol=1e-6)
        np.testing.assert_allclose(model["b"], b, rtol=1e-6)
    metrics = json.loads(read_object(settings, "jobs/np-fedavg/files_out/metrics.json"))["rounds"]
    assert [r["round"] for r in metrics] == [1, 2] and all(r["clients"] == 2 for r in metrics)


MAKES_ITS_OWN_DATA = """
import json, os
import numpy as np
import nvflare.client as flare

site = int(os.environ["RESONTECH_SITE"].split("-")[1])
data_files = len(os.listdir(os.environ["RESONTECH_DATA_ROOT"]))  # no shards: an empty folder
rng = np.random.default_rng(site)
x = rng.normal(size=(40 * site, 3))
y = x @ np.array([1.0, -2.0, 0.5]) + 0.3
flare.init()
while flare.is_running():
    model = flare.receive()
    params = model.params or {}
    w, b = params.get("w", np.zeros(3)), params.get("b", np.zeros(1))
    for epoch in range(int(os.environ["RESONTECH_LOCAL_EPOCHS"])):
        error = x @ w + b - y
        w, b = w - 0.1 * 2 * x.T @ error / len(y), b - 0.1 * 2 * np.mean(error, keepdims=True)
    loss = float(np.mean((x @ w + b - y) ** 2))
    report = {"round": model.current_round + 1, "loss": loss, "metrics": {"data_files": data_files}}
    print("RESONTECH_PROGRESS " + json.dumps(report), flush=True)
    flare.send(flare.FLModel(params={"w": w, "b": b}, metrics={"loss": loss},
                             meta={"NUM_STEPS_CURRENT_ROUND": len(y)}))
"""


async def test_a_federated_job_without_shards_runs_with_empty_data_folders_and_ends_with_every_shard_done(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    # Like NVFlare's hello-numpy: the training code reads no data, so nothing is uploaded but the script.
    upload(settings, "jobs/np-nodata/scripts/train.py", MAKES_ITS_OWN_DATA.encode())
    await registered(log, agents("nd-a", *HEARTBEAT))
    await registered(log, agents("nd-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "np-nodata", rounds=3, local_epochs=2)
        found = await wait_for(log, JobCompleted, "job.completed")
        await all_stopped(found, "np-nodata")
    found = await records(log, "JOBS")  # with whatever the stopped clients reported
    assert not of(found, JobFailed), of(found, JobFailed)
    [ready] = of(found, JobFederationReady)
    assert ready.sites == ["site-1", "site-2"] and ready.shards == []
    site_progress = [e for e in of(found, JobProgress) if e.slot is not None]
    assert {e.slot for e in site_progress} == {0, 1}
    assert all(e.metrics == {"data_files": 0.0} for e in site_progress)
    losses = [e.metrics["loss"] for e in of(found, JobRoundCompleted)]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    with np.load(io.BytesIO(read_object(settings, "jobs/np-nodata/model_out/model.npz"))) as model:
        assert model["w"].shape == (3,) and model["b"].shape == (1,)
    # Issue 13: the kernel completes a federated job and stops its clients, which report nothing:
    # its shards must read as done, not as still running, in the API and in `resontech status`.
    view = job_view(_schedule(found).jobs[f"{TENANT}/np-nodata"])
    assert view.state == "completed"
    assert [(a.slot, a.started, a.done) for a in view.assignments] == [(0, True, True), (1, True, True)]
    detail = job_detail(view)
    assert "shard 0: done" in detail and "shard 1: done" in detail and "running" not in detail


async def test_sigkill_of_a_client_agent_rejoins_its_site_elsewhere_and_keeps_every_round(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-recover", tmp_path)
    by_worker = {}
    for name in ("rc-a", "rc-b", "rc-c"):
        agent = agents(name, *HEARTBEAT)
        by_worker[await registered(log, agent)] = agent
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "np-recover", rounds=3, local_epochs=2, args=["--delay", "1"])
        found = await wait_for(log, JobRoundCompleted, "round 1")
        [placed] = of(found, JobPlaced)
        victim = next(a for a in placed.assignments if a.slot == 0)
        killed_at = time.time()
        by_worker[victim.worker_id].kill()
        found = await wait_for(log, JobCompleted, "job.completed after the kill", timeout=180)
        await all_stopped(found, "np-recover")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    revoked = of(found, JobAssignmentRevoked)
    assert [(r.slot, r.worker_id, r.reason) for r in revoked] == [(0, victim.worker_id, "worker lost")]
    replacement = of(found, JobPlaced)[1].assignments[0]
    assert (replacement.slot, replacement.epoch) == (0, 2) and replacement.worker_id != victim.worker_id
    first, again = of(found, JobFederationRun)
    assert (first.first_round, first.rounds) == (1, 3)
    assert again.first_round >= 2 and again.first_round + again.rounds - 1 == 3
    assert "site-1 lost" in again.reason
    assert again.resume_from == f"jobs/np-recover/model_out/rounds/round-{again.first_round - 1:05d}.npz"
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2, 3]
    assert of(found, JobCompleted)[0].outputs[0] == "jobs/np-recover/model_out/model.npz"
    # The replacement ran site-1 with the same shard; the lost worker's metering ended at the kill.
    ticks = [r.event for r in await records(log, "METERING") if r.event.assignment_id == victim.assignment_id]
    assert ticks and max(t.end_ms for t in ticks) <= killed_at * 1000 + 1


async def test_a_dead_fl_server_is_restarted_and_the_job_resumes_from_its_last_global_model(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-server", tmp_path)
    await registered(log, agents("sv-a", *HEARTBEAT))
    await registered(log, agents("sv-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel") as k:
        await submit(log, "np-server", rounds=3, local_epochs=2, args=["--delay", "1"])
        await wait_for(log, JobRoundCompleted, "round 1")
        server_tree = kill_tagged(TAG, f"{TENANT}/np-server")  # the FL server and its run's process
        assert server_tree
        found = await wait_for(log, JobCompleted, "job.completed after the FL server died", timeout=180)
        assert "restarting it" in k.logs("federation")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    first, again = of(found, JobFederationRun)
    assert first.first_round == 1 and again.reason == "the FL server restarted"
    assert again.first_round >= 2 and again.resume_from == (
        f"jobs/np-server/model_out/rounds/round-{again.first_round - 1:05d}.npz"
    )
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2, 3]
    assert len(of(found, JobPlaced)) == 1  # the clients stayed where they were


RAISES_ON_SITE_2 = """
import json, os, time
import nvflare.client as flare

flare.init()
while flare.is_running():
    model = flare.receive()
    if flare.get_site_name() == "site-2":
        time.sleep(3)  # let site-1 report first: the job fails, and site-1 stops, once site-2 raises
        raise ValueError("row 17 of the shard has 4 columns, expected 3")
    kernel = [k for k in os.environ if "SECRET" in k or k.startswith(("RESONTECH_NATS", "AWS_"))]
    workdir = os.path.dirname(os.environ["RESONTECH_DATA_ROOT"])
    seen = {"kernel_env": len(kernel), "in_workdir": int(os.getcwd().startswith(workdir)),
            "has_shard": int(os.path.exists(os.path.join(os.environ["RESONTECH_DATA_ROOT"], "data.npz")))}
    print("RESONTECH_PROGRESS " + json.dumps({"round": 1, "metrics": seen}), flush=True)
    flare.send(flare.FLModel(params={"w": [1.0]}, meta={"NUM_STEPS_CURRENT_ROUND": 1}))
"""


async def test_training_code_that_raises_fails_the_job_with_the_clients_log(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-raise", tmp_path)
    upload(settings, "jobs/np-raise/scripts/train.py", RAISES_ON_SITE_2.encode())
    secrets = {"RESONTECH_S3_SECRET_KEY": "agent-secret", "AWS_SECRET_ACCESS_KEY": "agent-secret"}
    await registered(log, agents("rs-a", *HEARTBEAT, env=secrets))
    await registered(log, agents("rs-b", *HEARTBEAT, env=secrets))
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "np-raise", rounds=2)
        found = await wait_for(log, JobFailed, "job.failed")
        [failed] = of(found, JobFailed, slot=None)
        assert failed.reason == (
            "training failed on site-2 (shard 1): ValueError: row 17 of the shard has 4 columns, expected 3"
        )
        assert "Traceback" in failed.log_tail and 'raise ValueError("row 17' in failed.log_tail
        await all_stopped(found, "np-raise")  # nothing hangs
    found = await records(log, "JOBS")  # what the clients reported before they were stopped
    assert not of(found, JobCompleted)
    # Site-1's script ran in its assignment's directory, with its shard, and none of the kernel's
    # or the agent's credentials in its environment.
    seen = [e.metrics for e in of(found, JobProgress) if e.slot == 0]
    assert seen and all(m == {"kernel_env": 0.0, "in_workdir": 1.0, "has_shard": 1.0} for m in seen), seen


async def test_missing_or_corrupt_shards_fail_the_job_naming_the_shard(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-short", tmp_path, "--shards", "1")
    upload_example(settings, "fedavg-numpy", "np-corrupt", tmp_path)
    upload(settings, "jobs/np-corrupt/shards/shard-1.zip", b"this is not a zip file")
    await registered(log, agents("bd-a", *HEARTBEAT))
    await registered(log, agents("bd-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "np-short", rounds=1)
        await submit(log, "np-corrupt", rounds=1)
        # with JobCompleted, wait_for returns on the job's own failure, not on a shard's before it
        short = await wait_for(log, JobCompleted, "np-short failed", subjects="job.acme.np-short.>")
        corrupt = await wait_for(log, JobCompleted, "np-corrupt failed", subjects="job.acme.np-corrupt.>")
    [failed] = of(short, JobFailed)
    assert failed.reason == (
        "federation failed: the job has 2 shards but jobs/np-short/shards/ holds 1 shard ZIP(s): "
        "nothing for slot 1 (upload one ZIP per shard, or none for training code that reads no data)"
    )
    job_failure = of(corrupt, JobFailed, slot=None)[0]
    assert job_failure.reason.startswith(
        "shard 1 failed: cannot start: shard jobs/np-corrupt/shards/shard-1.zip is not a valid ZIP file"
    )


async def test_a_torch_mlp_trains_federated_from_an_initial_model(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    import torch

    upload_example(settings, "fedavg-torch", "mlp", tmp_path)
    await registered(log, agents("pt-a", *HEARTBEAT))
    await registered(log, agents("pt-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel"):
        await submit(
            log, "mlp", rounds=2, local_epochs=2, framework="pytorch", initial_model="jobs/mlp/init/model.pt"
        )
        found = await wait_for(log, JobCompleted, "job.completed")
        await all_stopped(found, "mlp")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    [run] = of(found, JobFederationRun)
    assert run.resume_from == "jobs/mlp/init/model.pt"
    rounds = of(found, JobRoundCompleted)
    assert [r.round for r in rounds] == [1, 2] and set(rounds[-1].metrics) == {"loss", "accuracy"}
    assert rounds[-1].metrics["accuracy"] > 0.8  # the blobs are easy; FedAvg of two skewed sites learns them
    assert of(found, JobCompleted)[0].outputs[:2] == [
        "jobs/mlp/model_out/model.npz",
        "jobs/mlp/model_out/model.pt",
    ]
    state = torch.load(io.BytesIO(read_object(settings, "jobs/mlp/model_out/model.pt")), weights_only=True)
    initial = torch.load(tmp_path / "mlp-shards" / "model.pt", weights_only=True)
    assert state.keys() == initial.keys() and not torch.equal(state["net.0.weight"], initial["net.0.weight"])
    progress = [e for e in of(found, JobProgress) if e.slot is not None]
    assert {e.round for e in progress} == {1, 2} and all("accuracy" in e.metrics for e in progress)


async def test_a_cancelled_federated_job_stops_its_clients_and_server_and_deletes_its_kits(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-cancel", tmp_path)
    await registered(log, agents("cn-a", *HEARTBEAT))
    await registered(log, agents("cn-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "np-cancel", rounds=50, args=["--delay", "1"])
        found = await wait_for(log, JobFederationRun, "the first run")
        assert kits_left(settings, "np-cancel") == ["acme/np-cancel/site-1.zip", "acme/np-cancel/site-2.zip"]
        cancelled = JobCancelled(by="tenant:acme", reason="enough")
        await log.append(job_subject(TENANT, "np-cancel", cancelled), cancelled)
        await all_stopped(found, "np-cancel")
        await until(lambda: not kits_left(settings, "np-cancel"), "the kits deleted")
    assert not of(await records(log, "JOBS"), JobCompleted)


async def test_a_tenants_nvflare_job_folder_runs_on_the_jobs_sites_and_a_broken_one_fails_naming_why(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "jf", tmp_path)  # its shards
    upload_folder(settings, EXAMPLES / "fedavg-jobfolder" / "flare", "jobs/jf/flare/")
    upload_folder(settings, EXAMPLES / "fedavg-jobfolder" / "flare", "jobs/jf/three/")
    three = {"deploy_map": {"app_server": ["server"], "app_client": ["a", "b", "c"]}}
    upload(settings, "jobs/jf/three/meta.json", json.dumps(three).encode())
    await registered(log, agents("jf-a", *HEARTBEAT))
    await registered(log, agents("jf-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel"):
        await submit(log, "jf", job_id="jf-bad", rounds=2, job_folder="jobs/jf/three/")
        await submit(log, "jf", rounds=2, local_epochs=3, job_folder="jobs/jf/flare/")
        bad = await wait_for(log, JobFailed, "jf-bad failed", subjects="job.acme.jf-bad.>")
        found = await wait_for(log, JobCompleted, "job.completed", subjects="job.acme.jf.>")
        await all_stopped(found, "jf")
    [failed] = of(bad, JobFailed)
    assert failed.reason == (
        "federation failed: job folder jobs/jf/three/: the deploy_map names 3 clients (a, b, c) but the job "
        "has 2 shards (site-1, site-2): ask for more shards or name fewer clients"
    )
    assert not of(bad, JobFederationReady)  # it failed before an FL server started
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    [ready] = of(found, JobFederationReady)
    assert ready.sites == ["site-1", "site-2"]  # its hospital-a and hospital-b
    [run] = of(found, JobFederationRun)
    assert (run.first_round, run.rounds) == (1, 2)  # the folder's num_rounds (5) gave way to the spec's
    rounds = of(found, JobRoundCompleted)
    assert [r.round for r in rounds] == [1, 2] and all(set(r.metrics) == {"loss"} for r in rounds)
    assert [c.object_key for c in of(found, JobCheckpointed)] == [
        "jobs/jf/model_out/rounds/round-00001.npz",
        "jobs/jf/model_out/rounds/round-00002.npz",
    ]
    # ScatterAndGather with NVFlare's weighted aggregator computes the same FedAvg as the kernel's.
    with np.load(io.BytesIO(read_object(settings, "jobs/jf/model_out/model.npz"))) as model:
        w, b = fedavg_by_hand(tmp_path / "jf-shards", rounds=2, epochs=3, lr=0.1)
        np.testing.assert_allclose(model["w"], w, rtol=1e-6)
        np.testing.assert_allclose(model["b"], b, rtol=1e-6)
    metrics = json.loads(read_object(settings, "jobs/jf/files_out/metrics.json"))["rounds"]
    assert [(r["round"], r["clients"]) for r in metrics] == [(1, 2), (2, 2)]


PERSISTOR = """
import json, os
import numpy as np
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor


class HalfPersistor(ModelPersistor):
    \"\"\"Starts from weights of 0.5; notes where it runs and every model it is handed.\"\"\"

    def load_model(self, fl_ctx):
        with open("persistor-env.json", "w") as out:
            json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, out)
        return make_model_learnable({"w": np.full(3, 0.5), "b": np.zeros(1)}, {})

    def save_model(self, model, fl_ctx):
        with open("persistor-saves.jsonl", "a") as out:
            out.write(json.dumps({"w": np.asarray(model["weights"]["w"]).tolist()}) + "\\n")
"""


async def test_a_tenant_persistor_starts_the_model_and_keeps_every_round_in_a_clean_environment(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-keep", tmp_path)
    upload(settings, "jobs/np-keep/scripts/persistor.py", PERSISTOR.encode())
    await registered(log, agents("pe-a", *HEARTBEAT))
    await registered(log, agents("pe-b", *HEARTBEAT))
    secrets = {"AWS_SECRET_ACCESS_KEY": "kernel-secret", "NATS_TOKEN": "kernel-secret"}
    with kernel(settings, tmp_path / "kernel", env=secrets) as k:
        persistor = "jobs/np-keep/scripts/persistor.py:HalfPersistor"
        await submit(log, "np-keep", rounds=2, local_epochs=3, args=["--lr", "0.1"], persistor=persistor)
        found = await wait_for(log, JobCompleted, "job.completed")
        await all_stopped(found, "np-keep")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    assert [c.round for c in of(found, JobCheckpointed)] == [1, 2]
    with np.load(io.BytesIO(read_object(settings, "jobs/np-keep/model_out/model.npz"))) as model:
        w, b = fedavg_by_hand(tmp_path / "np-keep-shards", rounds=2, epochs=3, lr=0.1, w0=0.5)
        np.testing.assert_allclose(model["w"], w, rtol=1e-6)  # it started from the persistor's model
        np.testing.assert_allclose(model["b"], b, rtol=1e-6)
        final_w = model["w"]
    # The tenant's code ran in the FL server's run process: in the job's own directory, with none of
    # the kernel's credentials in its environment.
    job_dir = k.federations / TENANT / "np-keep"
    [noted] = job_dir.rglob("persistor-env.json")
    seen = json.loads(noted.read_text())
    assert Path(seen["cwd"]) == noted.parent and noted.is_relative_to(job_dir)
    kernel_values = {settings.s3_secret_key, settings.s3_access_key, "kernel-secret"}
    assert not kernel_values & set(seen["env"].values()), sorted(seen["env"])
    assert not [n for n in seen["env"] if n.startswith(("AWS_", "NATS_")) or "SECRET" in n]
    assert {n for n in seen["env"] if n.startswith("RESONTECH_")} == {"RESONTECH_FEDERATION"}
    saves = (noted.parent / "persistor-saves.jsonl").read_text().splitlines()
    assert len(saves) == 2  # every round's global model, through the kernel's persistor to the tenant's
    np.testing.assert_allclose(json.loads(saves[-1])["w"], final_w, rtol=1e-6)


async def test_a_killed_federation_service_started_again_resumes_the_job_from_its_last_checkpoint(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-again", tmp_path)
    await registered(log, agents("ag-a", *HEARTBEAT))
    await registered(log, agents("ag-b", *HEARTBEAT))
    with kernel(settings, tmp_path / "kernel") as k:
        await submit(log, "np-again", rounds=4, local_epochs=2, args=["--lr", "0.1", "--delay", "1"])
        await wait_for(log, JobRoundCompleted, "round 1")
        k.kill("federation")  # SIGKILL: nothing of it runs its teardown, but its FL server's sandbox
        # dies with it (--die-with-parent): no orphaned server holds the job's port
        await until(
            lambda: not tagged_pids(TAG, f"{TENANT}/np-again"), "the FL server died with it", timeout=10
        )
        k.start("federation")
        found = await wait_for(log, JobCompleted, "job.completed after the restart", timeout=240)
        await all_stopped(found, "np-again")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    first, again = of(found, JobFederationRun)
    assert (first.first_round, first.reason) == (1, "start")
    # the restarted service re-adopts the job, or (if its fence noticed first) reports the server it
    # fenced while the killed instance's claim lapsed: either way a new run from the last checkpoint
    restarted = ("the federation service restarted", "the FL server was fenced while the claim lapsed")
    assert again.reason in restarted and again.first_round >= 2
    assert again.resume_from == f"jobs/np-again/model_out/rounds/round-{again.first_round - 1:05d}.npz"
    assert again.first_round + again.rounds - 1 == 4
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2, 3, 4]
    assert [s.reason for s in of(found, JobFederationStopped)] in ([r] for r in restarted)
    assert len(of(found, JobFederationReady)) == 2 and len(of(found, JobPlaced)) == 1  # clients stayed
    with np.load(io.BytesIO(read_object(settings, "jobs/np-again/model_out/model.npz"))) as model:
        w, b = fedavg_by_hand(tmp_path / "np-again-shards", rounds=4, epochs=2, lr=0.1)
        np.testing.assert_allclose(model["w"], w, rtol=1e-6)  # no round lost or done twice
        np.testing.assert_allclose(model["b"], b, rtol=1e-6)


def _schedule(found: list[Any]) -> ScheduleState:
    state = ScheduleState()
    for record in found:
        state = evolve(state, record)
    return state


async def test_a_job_waiting_for_workers_holds_no_fl_server_until_it_can_run(
    log: EventLog, settings: Settings, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    upload_example(settings, "fedavg-numpy", "np-wait", tmp_path)
    await registered(log, agents("wt-a", *HEARTBEAT))
    gone = agents("wt-b", *HEARTBEAT)
    gone_id = await registered(log, gone)
    whole_host = float(cpu_count())  # each shard takes a whole worker: one worker holds one shard
    with kernel(settings, tmp_path / "kernel", env={"RESONTECH_FEDERATION_IDLE_S": "2"}):
        gone.kill()  # a fleet of two with one lost: the job waits for a second worker (with only one
        # worker ever registered, the coordinator would refuse a job it could never place)
        lost = f"worker.{gone_id}.lost"
        await wait_records(log, "WORKERS", lambda rs: any(r.subject == lost for r in rs), "wt-b lost")
        await submit(log, "np-wait", rounds=3, local_epochs=2, args=["--delay", "1"], cpus=whole_host)
        await until(lambda: len(kits_left(settings, "np-wait")) == 2, "the federation prepared", timeout=90)
        await asyncio.sleep(3)  # what it would take an FL server to show up
        found = await records(log, "JOBS")
        assert not tagged_pids(TAG, f"{TENANT}/np-wait") and not of(found, JobFederationReady)
        [job] = _schedule(found).jobs.values()
        why = explain_job(job, None)
        assert job.state == "queued" and why[1].startswith("pending: ") and "lost" in why[1], why
        third = agents("wt-c", *HEARTBEAT)
        await registered(log, third)
        found = await wait_for(log, JobRoundCompleted, "round 1 once a second worker came")
        # It goes back to waiting when a worker is lost with none to replace it: its server stops.
        third.kill()
        await until(lambda: not tagged_pids(TAG, f"{TENANT}/np-wait"), "the FL server stopped", timeout=30)
        await registered(log, agents("wt-d", *HEARTBEAT))
        found = await wait_for(log, JobCompleted, "job.completed on a fourth worker", timeout=180)
        await all_stopped(found, "np-wait")
    assert not of(found, JobFailed, slot=None), of(found, JobFailed)
    [stopped] = of(found, JobFederationStopped)
    assert stopped.reason.startswith("the job waits for workers (")
    assert len(of(found, JobFederationReady)) == 2
    assert [e.round for e in of(found, JobRoundCompleted)] == [1, 2, 3]
    ready_at = [r.seq for r in found if isinstance(r.event, JobFederationReady)]
    started_at = [r.seq for r in found if isinstance(r.event, JobStarted)]
    assert min(started_at) > ready_at[0]  # no client before the server was ready
