"""The pure parts of federated jobs, and real provisioning: no NATS, no agents."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from agent.archives import BadArchive, unpack
from agent.runtimes import nvflare
from agent.runtimes.base import StartFailed
from agent.runtimes.nvflare import protocol_line
from core import flare
from core.flare import KIT_FILE
from core.sandbox import Sandbox
from core.settings import Settings
from ops.coordinator import start_command
from ops.coordinator.inputs import Presigner
from ops.coordinator.workspecs import federated_spec
from ops.federation.server import clean_env, provision
from projections.schedule import Federation, JobRecord
from schemas.commands import WorkSpec
from schemas.jobs import FederatedTraining
from schemas.values import Assignment
from tests.support.projection_records import job_record


def test_the_project_names_the_server_after_its_host_and_the_kernel_as_admin() -> None:
    project = flare.project("acme-j1", host="localhost", port=4321, sites=["site-1", "site-2"])
    server, *clients, admin = project["participants"]
    assert server == {
        "name": "localhost",
        "type": "server",
        "org": "resontech",
        "fed_learn_port": 4321,
        "admin_port": 4321,
    }
    assert [c["name"] for c in clients] == ["site-1", "site-2"]
    assert admin["name"] == flare.ADMIN_USER != "admin@nvidia.com" and admin["role"] == "project_admin"


def test_the_server_resources_keep_every_path_inside_the_federation() -> None:
    provisioned = {
        "servers": [{"heart_beat_timeout": 600, "admin_storage": "transfer"}],
        "snapshot_persistor": {"args": {"storage": {"args": {"root_dir": "/tmp/nvflare/snapshot-storage"}}}},
        "components": [
            {"id": "job_scheduler", "path": "x.DefaultJobScheduler", "args": {"max_jobs": 4}},
            {
                "id": "job_manager",
                "path": "x.SimpleJobDefManager",
                "args": {"uri_root": "/tmp/nvflare/jobs-storage"},
            },
        ],
    }
    resources = flare.server_resources(provisioned, jobs_dir="/data/federations/acme/j1/jobs")
    assert "/tmp/nvflare" not in json.dumps(resources)
    assert resources["servers"] == [
        {"heart_beat_timeout": flare.DEFAULT_HEARTBEAT_TIMEOUT_S, "admin_storage": "transfer"}
    ]
    scheduler, manager = resources["components"]
    assert scheduler["args"]["max_jobs"] == 2 and scheduler["args"]["min_schedule_interval"] == 1.0
    assert manager["args"]["uri_root"] == "/data/federations/acme/j1/jobs"


def test_shards_go_to_slots_in_name_order_and_missing_ones_are_named() -> None:
    keys = [
        "jobs/x/shards/b.zip",
        "jobs/x/shards/a.zip",
        "jobs/x/shards/notes.txt",
        "jobs/x/shards/old/c.zip",
    ]
    assert flare.shard_keys(keys, "jobs/x/shards/", 2) == ["jobs/x/shards/a.zip", "jobs/x/shards/b.zip"]
    assert flare.shard_keys(keys, "jobs/x/shards/", 1) == ["jobs/x/shards/a.zip"]
    with pytest.raises(flare.ShardsMissing, match="holds 2 shard ZIP\\(s\\): nothing for slot 2, slot 3"):
        flare.shard_keys(keys, "jobs/x/shards/", 4)
    # No shard at all is no data for every site (training code that makes its own), not an error.
    assert flare.shard_keys(["jobs/x/shards/notes.txt", "jobs/x/shards/old/c.zip"], "jobs/x/shards/", 3) == []
    assert flare.shard_keys([], "jobs/x/shards/", 1) == []


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (None, "running"),
        ("SUBMITTED", "running"),
        ("RUNNING", "running"),
        ("FINISHED:COMPLETED", "completed"),
        ("FINISHED:ABORTED", "aborted"),
        ("FINISHED:EXECUTION_EXCEPTION", "failed"),
        ("FINISHED:ABNORMAL", "failed"),
    ],
)
def test_what_a_run_status_means(status: str | None, outcome: str) -> None:
    assert flare.run_outcome(status) == outcome


def test_the_reason_of_a_client_error_log_is_its_exception() -> None:
    log = "2026 - Runner - ERROR - Traceback (most recent call last):\n  File x\nKeyError: 'w'\n\nmore\n"
    reason, tail = flare.error_excerpt(log)
    assert reason == "KeyError: 'w'" and tail.endswith("more") and "Traceback" in tail
    assert flare.round_of("round-00012.json") == 12 and flare.round_of("round-00012.npz") is None


def test_provisioning_gives_each_job_its_own_ca_and_each_site_only_its_own_key(tmp_path: Path) -> None:
    one = provision(
        tmp_path / "one",
        tmp_path / "k1",
        tenant="acme",
        job_id="j1",
        host="localhost",
        sites=["site-1", "site-2"],
    )
    two = provision(
        tmp_path / "two", tmp_path / "k2", tenant="acme", job_id="j2", host="localhost", sites=["site-1"]
    )
    assert one.kit_zip("site-1").parent == tmp_path / "k1" / "kits"  # the kernel's, not the server's tree
    assert (tmp_path / "k1" / "project.yml").is_file() and not (tmp_path / "one" / "project.yml").exists()
    ca_one = (one.server_dir / "startup" / "rootCA.pem").read_bytes()
    assert ca_one != (two.server_dir / "startup" / "rootCA.pem").read_bytes()
    with zipfile.ZipFile(one.kit_zip("site-1")) as kit:
        names = set(kit.namelist())
        cert = x509.load_pem_x509_certificate(kit.read("startup/client.crt"))
        config = json.loads(kit.read("startup/fed_client.json"))
    assert {"startup/client.key", "startup/rootCA.pem", "startup/fed_client.json"} <= names
    assert not any("server.key" in n for n in names)
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "site-1"
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_one))
    assert config["servers"][0]["service"]["target"] == f"localhost:{one.port}"  # loopback only
    fed_server = json.loads((one.server_dir / "startup" / "fed_server.json").read_text())
    assert fed_server["servers"][0]["admin_port"] == one.port
    assert "/tmp/nvflare" not in (one.server_dir / "local" / "resources.json").read_text()
    # Provisioning again (a restarted kernel) keeps the certificates the clients hold.
    assert (
        provision(
            tmp_path / "one",
            tmp_path / "k1",
            tenant="acme",
            job_id="j1",
            host="localhost",
            sites=["site-1", "site-2"],
        )
        == one
    )
    assert (one.server_dir / "startup" / "rootCA.pem").read_bytes() == ca_one


def test_nvflare_processes_get_none_of_the_kernels_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RESONTECH_S3_SECRET_KEY", "kernel-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kernel-secret")
    env = clean_env(tmp_path, "acme/j1")
    assert "kernel-secret" not in env.values() and env["HOME"] == str(tmp_path)
    assert {k for k in env if k.startswith("RESONTECH_")} == {"RESONTECH_FEDERATION"}


def _zip(path: Path, members: dict[str, bytes], symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in members.items():
            archive.writestr(name, body)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, "/etc/passwd")
    return path


def test_a_shard_unpacks_into_the_data_root_and_unsafe_or_corrupt_ones_are_refused(tmp_path: Path) -> None:
    good = _zip(tmp_path / "good.zip", {"data.npz": b"x", "sub/more.csv": b"1,2"})
    assert (
        unpack(good, tmp_path / "data", "shard a.zip") == 2
        and (tmp_path / "data" / "sub" / "more.csv").exists()
    )
    for archive, problem in [
        (_zip(tmp_path / "up.zip", {"../escape.txt": b"x"}), "unsafe path"),
        (_zip(tmp_path / "abs.zip", {"/etc/cron.d/x": b"x"}), "unsafe path"),
        (_zip(tmp_path / "link.zip", {}, symlink="data.npz"), "symbolic link"),
    ]:
        with pytest.raises(BadArchive, match=problem):
            unpack(archive, tmp_path / "out", "shard b.zip")
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(BadArchive, match=r"shard c\.zip is not a valid ZIP file"):
        unpack(tmp_path / "junk.zip", tmp_path / "out", "shard c.zip")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()


def test_progress_printed_by_a_script_is_found_behind_nvflares_log_prefix() -> None:
    line = '2026-11-22 13:34:03,106 - TaskScriptRunner - INFO - RESONTECH_PROGRESS {"round": 2, "loss": 0.5}'
    assert protocol_line(line) == 'RESONTECH_PROGRESS {"round": 2, "loss": 0.5}'
    assert protocol_line("2026 - ClientRunner - INFO - got task") == "2026 - ClientRunner - INFO - got task"


def _job(federation: Federation | None) -> JobRecord:
    return job_record(
        tenant="acme",
        job_id="j1",
        name="mnist",
        kind="federated",
        shards=2,
        rounds=3,
        local_epochs=2,
        federated=FederatedTraining(script="jobs/mnist/scripts/train.py"),
        federation=federation,
    )


def test_a_federated_shard_starts_only_once_its_federation_is_ready_with_only_its_own_kit_and_shard() -> None:
    presigner = Presigner(Settings(s3_endpoint="http://127.0.0.1:9"))  # signing makes no request
    assignment = Assignment(assignment_id="j1-s1-e2", worker_id="w-2", slot=1, epoch=2)
    base = start_command(_job(None), assignment).spec
    assert federated_spec(_job(None), assignment, base, presigner) is None
    federation = Federation(
        server="localhost:4321",
        sites=["site-1", "site-2"],
        kit_bucket=flare.KIT_BUCKET,
        kits=["acme/j1/site-1.zip", "acme/j1/site-2.zip"],
        shards=["jobs/mnist/shards/a.zip", "jobs/mnist/shards/b.zip"],
    )
    spec = federated_spec(_job(federation), assignment, base, presigner)
    assert spec is not None
    assert spec.runtime == "nvflare-client" and spec.command == [] and spec.resume_from is None
    assert set(spec.downloads) == {"startup-kit.zip", "jobs/mnist/shards/b.zip"}
    assert spec.downloads["startup-kit.zip"].startswith(
        f"http://127.0.0.1:9/{flare.KIT_BUCKET}/acme/j1/site-2.zip?"
    )
    assert spec.downloads["jobs/mnist/shards/b.zip"].startswith(
        "http://127.0.0.1:9/rt-acme/jobs/mnist/shards/b.zip?"
    )
    expected: dict[str, Any] = {
        "site": "site-2",
        "server": "localhost:4321",
        "shard": "jobs/mnist/shards/b.zip",
    }
    assert spec.options | expected == spec.options and spec.options["local_epochs"] == "2"
    beyond = Assignment(assignment_id="x", worker_id="w", slot=5, epoch=1)
    assert federated_spec(_job(federation), beyond, base, presigner) is None


def test_a_federated_shard_of_a_job_without_shards_downloads_only_its_kit() -> None:
    presigner = Presigner(Settings(s3_endpoint="http://127.0.0.1:9"))
    assignment = Assignment(assignment_id="j1-s1-e2", worker_id="w-2", slot=1, epoch=2)
    base = start_command(_job(None), assignment).spec
    federation = Federation(
        server="localhost:4321",
        sites=["site-1", "site-2"],
        kit_bucket=flare.KIT_BUCKET,
        kits=["acme/j1/site-1.zip", "acme/j1/site-2.zip"],
        shards=[],
    )
    spec = federated_spec(_job(federation), assignment, base, presigner)
    assert spec is not None and spec.runtime == "nvflare-client"
    assert list(spec.downloads) == [KIT_FILE] and "shard" not in spec.options
    assert (spec.options["site"], spec.options["server"]) == ("site-2", "localhost:4321")


def _kit(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("startup/fed_client.json", "{}")


@pytest.mark.parametrize("with_shard", [False, True], ids=["no-shard", "shard"])
async def test_the_nvflare_runtime_unpacks_the_kit_and_the_shard_if_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_shard: bool
) -> None:
    started: dict[str, Any] = {}

    async def spawn(argv: list[str], workdir: Path, env: Any, **kw: Any) -> str:
        started.update(argv=argv, workdir=workdir, env=dict(env))
        return "workload"

    monkeypatch.setattr(nvflare, "spawn", spawn)
    runtime = nvflare.NvflareClientRuntime(Sandbox(bwrap=None))  # never used: spawn is replaced
    shard = "jobs/x/shards/a.zip"
    options = {"site": "site-1", "server": "localhost:1", "rounds": "2", "local_epochs": "3"}
    downloads = {KIT_FILE: "http://kit"}
    workdir = tmp_path / "work"
    workdir.mkdir()
    _kit(workdir / KIT_FILE)
    if with_shard:
        options["shard"], downloads[shard] = shard, "http://shard"
        (workdir / shard).parent.mkdir(parents=True)
        with zipfile.ZipFile(workdir / shard, "w") as archive:
            archive.writestr("data.npz", b"x")
    spec = WorkSpec(runtime="nvflare-client", downloads=downloads, options=options)
    assert await runtime.start(spec, workdir, {"PATH": "/usr/bin"}) == "workload"
    assert (workdir / "kit" / "startup" / "fed_client.json").exists() and not (workdir / KIT_FILE).exists()
    data = sorted(p.name for p in (workdir / "data").iterdir())
    assert data == (["data.npz"] if with_shard else [])  # RESONTECH_DATA_ROOT: empty without a shard
    assert started["env"]["RESONTECH_SITE"] == "site-1" and started["env"]["RESONTECH_LOCAL_EPOCHS"] == "3"
    # What the assignment names and what it downloads must agree.
    other = {**downloads, "jobs/x/shards/b.zip": "http://other"}
    for bad in (
        WorkSpec(runtime="nvflare-client", downloads=other, options=options),
        WorkSpec(runtime="nvflare-client", downloads={KIT_FILE: "k"}, options={**options, "shard": shard}),
        WorkSpec(runtime="nvflare-client", downloads=downloads, options={**options, "site": ""}),
    ):
        with pytest.raises(StartFailed, match="needs a site"):
            await runtime.start(bad, workdir, {})
