"""The FL job folder of every run (:mod:`core.flarejob`): the generated one, a tenant's own mapped onto
the job's sites, and what the kernel checks in both. Pure: no NVFlare, no disk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core import flarejob
from core.flarejob import (
    JobFolderInvalid,
    folder_problems,
    map_sites,
    persistor_ref,
    run_documents,
    tenant_job,
)

SITES = ["site-1", "site-2"]
SAG = "nvflare.app_common.workflows.scatter_and_gather.ScatterAndGather"


def _server(workflows: list[dict[str, Any]], components: list[dict[str, Any]] | None = None) -> bytes:
    document = {"format_version": 2, "workflows": workflows, "components": components or []}
    return json.dumps(document).encode()


def _folder(deploy_map: dict[str, list[str]], server: bytes | None = None, **apps: bytes) -> dict[str, bytes]:
    files = {"meta.json": json.dumps({"name": "theirs", "deploy_map": deploy_map}).encode()}
    for app, targets in deploy_map.items():
        if "server" in targets or "@ALL" in targets:
            files[f"{app}/config/config_fed_server.json"] = server or _server([{"id": "w", "path": SAG}])
        if any(t != "server" for t in targets):
            files[f"{app}/config/config_fed_client.json"] = b'{"format_version": 2, "executors": []}'
    return files | {f"{app}/config/config_fed_server.json": body for app, body in apps.items()}


def test_a_generated_run_runs_nvflares_fedavg_from_the_kernels_persistor_and_writes_every_round() -> None:
    job = flarejob.script_job(
        sites=SITES, script="train.py", script_args=["--lr", "0.1"], framework="pytorch"
    )
    docs = run_documents(
        job, name="mnist-run2", first_round=3, rounds=2, out_dir="/f/rounds", start_model="/f/rounds/r2.npz"
    )
    meta = docs["meta.json"]
    assert meta["deploy_map"] == {"app_server": ["server"], "app_client": SITES}
    assert meta["required_sites"] == SITES and meta["min_clients"] == 2 and meta["name"] == "mnist-run2"
    server = docs["app_server/config/config_fed_server.json"]
    [controller] = server["workflows"]
    assert controller["path"] == "nvflare.app_common.workflows.fedavg.FedAvg"
    assert controller["args"] == {
        "num_clients": 2,
        "num_rounds": 2,
        "start_round": 2,
        "persistor_id": flarejob.KERNEL_PERSISTOR,
    }
    persistor, writer = server["components"]
    assert persistor == {
        "id": flarejob.KERNEL_PERSISTOR,
        "path": "resontech_flare.StartingPersistor",
        "args": {"start_model": "/f/rounds/r2.npz", "inner": ""},
    }
    assert writer["path"] == "resontech_flare.RoundWriter" and writer["args"] == {"out_dir": "/f/rounds"}
    [executor] = docs["app_client/config/config_fed_client.json"]["executors"]
    args = executor["executor"]["args"]
    assert args["task_script_path"] == "train.py" and args["task_script_args"] == "--lr 0.1"
    assert (args["params_exchange_format"], args["server_expected_format"]) == ("pytorch", "numpy")
    # Nothing to start from: the clients start from their own weights.
    first = run_documents(job, name="r1", first_round=1, rounds=4, out_dir="/f", start_model=None)
    assert first["app_server/config/config_fed_server.json"]["workflows"][0]["args"][
        "allow_empty_global_weights"
    ]
    assert job.documents["app_server/config/config_fed_server.json"]["workflows"][0]["args"] == {
        "num_clients": 2
    }


def test_a_tenant_persistor_is_the_inner_one_of_the_kernels() -> None:
    ref = persistor_ref("jobs/x/scripts/persistor.py:MyPersistor")
    assert (ref.key, ref.module, ref.cls, ref.folder) == (
        "jobs/x/scripts/persistor.py",
        "persistor",
        "MyPersistor",
        "jobs/x/scripts/",
    )
    assert persistor_ref("p.py:P").folder == ""
    job = flarejob.script_job(sites=SITES, script="t.py", script_args=[], framework="numpy", persistor=ref)
    docs = run_documents(job, name="r1", first_round=1, rounds=2, out_dir="/f", start_model=None)
    server = docs["app_server/config/config_fed_server.json"]
    tenant, kernel, _ = server["components"]
    assert tenant == {"id": "persistor", "path": "persistor.MyPersistor", "args": {}}
    assert kernel["args"] == {"start_model": "", "inner": "persistor"}
    assert (
        "allow_empty_global_weights" not in server["workflows"][0]["args"]
    )  # the tenant's persistor decides
    for bad in ("persistor.py", "persistor.py:", "a/b.txt:P", "a/my-persistor.py:P", "p.py:1P"):
        with pytest.raises(ValueError, match="persistor"):
            persistor_ref(bad)


def test_a_job_folders_clients_become_the_jobs_sites() -> None:
    assert map_sites({"app": ["@ALL"]}, SITES) == {"app": ["server", "site-1", "site-2"]}
    assert map_sites({"s": ["server"], "c": ["hospital-a", "hospital-b"]}, SITES) == {
        "s": ["server"],
        "c": ["site-1", "site-2"],
    }
    assert map_sites({"s": ["server"], "a": ["site-2"], "b": ["lab"]}, SITES) == {
        "s": ["server"],
        "a": ["site-2"],
        "b": ["site-1"],
    }
    with pytest.raises(JobFolderInvalid, match=r"names 3 clients \(a, b, c\) but the job has 2 shards"):
        map_sites({"s": ["server"], "c": ["a", "b", "c"]}, SITES)


def test_a_job_folder_run_keeps_the_tenants_components_and_sets_rounds_and_the_persistor() -> None:
    server = _server(
        [
            {"id": "train", "path": SAG, "args": {"num_rounds": "{rounds}", "persistor_id": "{pid}"}},
            {"id": "cse", "path": "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval"},
        ],
        [{"id": "np", "path": "x.Persistor"}, {"id": "aggregator", "path": "x.Agg"}],
    )
    server = json.dumps(json.loads(server) | {"rounds": 50, "pid": "np"}).encode()
    job = tenant_job(_folder({"app": ["@ALL"]}, server=server), SITES)
    assert (job.server_app, job.workflow, job.inner_persistor) == ("app", 0, "np")
    docs = run_documents(
        job, name="theirs-run1", first_round=2, rounds=3, out_dir="/f", start_model="/f/r1.npz"
    )
    assert docs["meta.json"]["deploy_map"] == {"app": ["server", "site-1", "site-2"]}
    config = docs["app/config/config_fed_server.json"]
    train, cse = config["workflows"]
    assert train["args"] == {"num_rounds": 3, "start_round": 1, "persistor_id": flarejob.KERNEL_PERSISTOR}
    assert "args" not in cse
    assert [c["id"] for c in config["components"]] == [
        "np",
        "aggregator",
        "resontech_persistor",
        "resontech_rounds",
    ]
    assert config["components"][2]["args"] == {"start_model": "/f/r1.npz", "inner": "np"}
    # NVFlare's usual persistor id is found without persistor_id; no num_rounds: the first workflow trains.
    plain = tenant_job(
        _folder(
            {"s": ["server"], "c": SITES},
            server=_server([{"id": "w", "path": SAG}], [{"id": "persistor", "path": "x.P"}]),
        ),
        SITES,
    )
    assert (plain.workflow, plain.inner_persistor, plain.server_app) == (0, "persistor", "s")


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"meta.json": b"{"}, "meta.json is not valid JSON"),
        ({"meta.json": b'{"name": "x"}'}, "meta.json has no deploy_map"),
        (_folder({"app": ["@ALL"]}) | {"meta.json": b'{"deploy_map": {"gone": ["@ALL"]}}'}, "app 'gone'"),
        (_folder({"s": ["server"], "c": ["site-1"]}), "site-2 gets no app from the deploy_map"),
        (_folder({"s": ["server"], "c": SITES, "d": ["site-2"]}), "site-2 gets apps c, d"),
        (
            _folder({"s": ["server"], "t": ["server"], "c": SITES}),
            "exactly one app must be deployed to the server",
        ),
        (_folder({"c": SITES}), r"exactly one app must be deployed to the server \(deploy_map: none\)"),
        (_folder({"app": ["@ALL"]}, server=_server([])), "has no workflows"),
        (
            _folder(
                {"app": ["@ALL"]}, server=_server([{"args": {"num_rounds": 1}}, {"args": {"num_rounds": 2}}])
            ),
            "all set num_rounds",
        ),
        (_folder({"app": ["@ALL"]}, server=_server([{"args": {"model": {"w": [1]}}}])), "passes model"),
        (
            _folder({"app": ["@ALL"]}, server=_server([{"args": {"persistor_id": "p"}}])),
            "persistor_id 'p' is not",
        ),
        (
            _folder({"app": ["@ALL"]}, server=_server([{"path": SAG}], [{"id": "resontech_rounds"}])),
            "'resontech_rounds' is the kernel's",
        ),
    ],
)
def test_a_job_folder_that_cannot_run_says_what_to_fix(files: dict[str, bytes], problem: str) -> None:
    with pytest.raises(JobFolderInvalid, match=problem):
        tenant_job(files, SITES)


def test_the_listing_of_a_job_folder_shows_what_is_missing() -> None:
    good = [
        ("jobs/x/flare/meta.json", 10),
        ("jobs/x/flare/app/config/config_fed_server.json", 10),
        ("jobs/x/flare/app/config/config_fed_client.json", 10),
        ("jobs/x/flare/app/custom/train.py", 10),
    ]
    assert folder_problems(good, "jobs/x/flare/") == []
    assert flarejob.config_paths(k[len("jobs/x/flare/") :] for k, _ in good) == [
        "app/config/config_fed_client.json",
        "app/config/config_fed_server.json",
        "meta.json",
    ]
    assert folder_problems(
        [("jobs/x/flare/meta.conf", 1), ("jobs/x/flare/app/custom/t.py", 1)], "jobs/x/flare/"
    ) == [
        "no meta.json at its top (meta.conf: only JSON is read)",
        "no app with config/config_fed_server.json (the server side)",
        "no app with config/config_fed_client.json (the client side)",
    ]
    huge = [*good, ("jobs/x/flare/app/custom/weights.bin", flarejob.MAX_BYTES)]
    assert folder_problems(huge, "jobs/x/flare/") == ["it holds more than 2000 files or 200 MiB"]
