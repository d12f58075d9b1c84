"""The jobs API: submit (validated against the workspace, idempotent), list, get with why, cancel,
the job's events; scoping and bad input. The end-to-end test runs a real agent and coordinator."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable
from typing import Any

from core.log import EventLog
from core.streams import job_subject
from projections import SCHEDULE
from schemas.api.jobs import HIDDEN
from schemas.commands import StopWork
from schemas.jobs import JobCheckpointed, JobPlaced, JobProgress, JobQueued, JobStarted, JobSubmitted
from schemas.values import Assignment, Provenance, ScoreCard
from tests.support import AgentProcess, coordinator, records, registered, until
from tests.support.accounts import provider_key, register_worker
from tests.support.gateway import Api, spec, submit


def put(api: Api, tenant: str, key: str, body: bytes = b"x") -> None:
    api.kernel.s3.put_object(Bucket=f"rt-{tenant}", Key=key, Body=body)


async def job_events(log: EventLog) -> list[Any]:
    return await records(log, "JOBS")


async def append_job(api: Api, tenant: str, job_id: str, event: Any) -> None:
    await api.kernel.append(job_subject(tenant, job_id, event), event, visible_in=SCHEDULE)


async def test_submit_checks_that_every_input_exists_and_appends_once(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    put(api, tenant, "scripts/train.py")
    body = spec(inputs=["scripts/train.py", "jobs/hello/shards/shard-0.zip", "jobs/hello/shards/"])
    refused = await submit(api, member, body)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "missing_objects"
    assert "jobs/hello/shards/shard-0.zip" in error["message"] and "jobs/hello/shards/" in error["message"]
    assert "scripts/train.py" not in error["message"]
    assert await job_events(log) == []

    put(api, tenant, "jobs/hello/shards/shard-0.zip")
    accepted = await submit(api, member, body)
    assert accepted.status_code == 201, accepted.text
    job = accepted.json()
    assert job["state"] == "queued" and job["tenant"] == tenant and job["spec"]["kind"] == "process"
    assert job["spec"]["inputs"] == body["inputs"]
    assert job["pending_reason"] == "waiting for the coordinator"
    assert job["spec"]["submitted_by"] == f"tenant:{tenant}"
    [stored] = await job_events(log)
    assert stored.subject == f"job.{tenant}.{job['job_id']}.submitted"
    assert isinstance(stored.event, JobSubmitted) and stored.event.inputs == body["inputs"]


async def test_a_ddp_job_runs_a_script_among_its_inputs(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    put(api, tenant, "scripts/train.py")
    body = spec(kind="ddp", shards=2, command=["scripts/train.py", "--epochs", "3"], inputs=["scripts/"])
    accepted = await submit(api, admin, {**body, "topology": {"level": "rack", "mode": "preferred"}})
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["kind"] == "ddp" and accepted.json()["spec"]["shards"] == 2
    assert accepted.json()["spec"]["topology"] == {"level": "rack", "mode": "preferred"}
    zero = await submit(api, admin, {**body, "strategy": "deepspeed"})
    assert zero.status_code == 201 and zero.json()["spec"]["strategy"] == "deepspeed", zero.text
    elsewhere = await submit(api, admin, {**body, "inputs": ["jobs/hello/"]})
    assert elsewhere.status_code == 422 and "scripts/train.py" in elsewhere.json()["error"]["message"]
    assert len(await job_events(log)) == 2


async def test_a_duplicate_job_id_is_a_conflict(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    first = await submit(api, admin, spec(job_id="fixed-1"))
    assert first.status_code == 201 and first.json()["job_id"] == "fixed-1"
    again = await submit(api, admin, spec(job_id="fixed-1"))
    assert again.status_code == 409
    assert "fixed-1" in again.json()["error"]["message"]
    assert len(await job_events(log)) == 1


async def test_an_idempotency_key_makes_a_retried_submit_return_the_same_job(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    headers = {"Idempotency-Key": "retry-me-42"}
    first = await submit(api, admin, spec(), headers=headers)
    second = await submit(api, admin, spec(), headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.json()["job_id"] == second.json()["job_id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert len(await job_events(log)) == 1
    other = await submit(api, admin, spec(name="different"), headers=headers)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    fresh = await submit(api, admin, spec(), headers={"Idempotency-Key": "another"})
    assert fresh.status_code == 201 and fresh.json()["job_id"] != first.json()["job_id"]
    bad = await submit(api, admin, spec(), headers={"Idempotency-Key": "has space"})
    assert bad.status_code == 400
    assert len(await job_events(log)) == 2


BAD_SPECS: list[tuple[dict[str, Any], int, str]] = [
    (spec(surprise=1), 400, "invalid_body"),
    (spec(kind="training"), 400, "invalid_body"),
    (spec(shards=0), 400, "invalid_body"),
    (spec(shards=5000), 400, "invalid_body"),
    (spec(name="has space"), 400, "invalid_body"),
    (spec(job_id="a.b"), 400, "invalid_body"),
    (spec(resources={"gpus": 1, "vrm": 4}), 400, "invalid_body"),
    (spec(priority=1000), 400, "invalid_body"),
    (spec(kind="ddp"), 422, "invalid_spec"),  # its script (command[0]) is not among its inputs
    (spec(kind="federated", rounds=3), 422, "invalid_spec"),
    (
        spec(kind="federated", rounds=3, federated={"script": "train.py", "args": ["a b"]}),
        422,
        "invalid_spec",
    ),
    (spec(kind="federated", rounds=3, federated={"script": "jobs/x/train.sh"}), 422, "invalid_spec"),
    (spec(kind="federated", rounds=3, federated={"script": "../train.py"}), 422, "invalid_key"),
    (
        spec(kind="federated", rounds=3, federated={"script": "t.py", "initial_model": "m.bin"}),
        422,
        "invalid_spec",
    ),
    (spec(federated={"script": "train.py"}), 422, "invalid_spec"),
    (spec(kind="federated", rounds=3, federated={"args": []}), 422, "invalid_spec"),  # no code
    (
        spec(kind="federated", rounds=3, federated={"script": "t.py", "job_folder": "jobs/x/flare/"}),
        422,
        "invalid_spec",
    ),
    (spec(kind="federated", rounds=3, federated={"job_folder": "jobs/x/flare"}), 422, "invalid_spec"),
    (
        spec(kind="federated", rounds=3, federated={"job_folder": "jobs/x/f/", "persistor": "p.py:P"}),
        422,
        "invalid_spec",
    ),
    (
        spec(kind="federated", rounds=3, federated={"script": "t.py", "persistor": "p.py"}),
        422,
        "invalid_spec",
    ),
    (
        spec(kind="federated", rounds=3, federated={"script": "t.py", "persistor": "../p.py:P"}),
        422,
        "invalid_key",
    ),
    (spec(kind="federated", rounds=3, federated={"script": "scripts/train.py"}), 422, "missing_objects"),
    (spec(command=[]), 422, "invalid_spec"),
    (spec(rounds=3), 422, "invalid_spec"),
    (spec(env={"lower": "x"}), 422, "invalid_spec"),
    (spec(env={"RESONTECH_NATS_URL": "x"}), 422, "invalid_spec"),
    (spec(resources={"vram_mb": 1000}), 422, "invalid_spec"),
    (spec(inputs=["../etc/passwd"]), 422, "invalid_key"),
    (spec(inputs=["/abs/key"]), 422, "invalid_key"),
    (spec(output_prefix="out"), 422, "invalid_key"),
    (spec(pool="managed"), 422, "unplaceable"),
    (spec(resources={"gpus": 2}, shards=1), 422, "unplaceable"),
    (spec(inputs=["nowhere.txt"]), 422, "missing_objects"),
    (spec(strategy="fsdp"), 422, "invalid_spec"),  # a process job has no ranks to shard over
    (spec(kind="ddp", command=["t.py"], inputs=["t.py"], strategy="zero9"), 400, "invalid_body"),
    (spec(image="evil; rm -rf /"), 400, "invalid_body"),
    (spec(image="--privileged"), 400, "invalid_body"),
    (spec(image="img\nkind: Secret"), 400, "invalid_body"),
    (spec(image="Team/Trainer:v1"), 400, "invalid_body"),  # a reference is lower case
    (spec(image="a/" * 300 + "b"), 400, "invalid_body"),
    (spec(topology={"level": "galaxy"}), 400, "invalid_body"),
    (spec(topology={"level": "rack", "mode": "maybe"}), 400, "invalid_body"),
]


async def test_bad_specs_are_refused_with_a_reason_and_append_nothing(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    await register_worker(api, "w-cpu")  # a CPU host: no GPU job can ever fit
    for body, status, code in BAD_SPECS:
        response = await submit(api, admin, body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == code, (body, error)
        assert len(error["message"]) > 10
    for raw, status in [(b"{oops", 400), (b"", 400), (b'{"name": "' + b"x" * 70_000 + b'"}', 413)]:
        response = await api.request(
            "POST", "/v1/jobs", admin, content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == status
    assert await job_events(log) == []
    assert await log.last_seq("AUDIT") == 1  # only the tenant's creation


async def test_a_job_folder_is_checked_from_its_listing_and_a_persistor_must_exist(
    api: Api, log: EventLog
) -> None:
    tenant, admin = await api.tenant()
    put(api, tenant, "jobs/fl/shards/shard-0.zip")
    put(api, tenant, "jobs/fl/scripts/train.py")
    folder = {"job_folder": "jobs/fl/flare/"}
    body = spec(name="fl", kind="federated", rounds=2, shards=1, command=[], federated=folder)
    missing = await submit(api, admin, body)
    assert missing.json()["error"]["code"] == "missing_objects" and "jobs/fl/flare/" in missing.text
    put(api, tenant, "jobs/fl/flare/meta.conf")
    put(api, tenant, "jobs/fl/flare/app/config/config_fed_client.json")
    broken = await submit(api, admin, body)
    assert broken.status_code == 422 and broken.json()["error"] == {
        "code": "invalid_job_folder",
        "message": "federated.job_folder jobs/fl/flare/ is not an NVFlare job folder: no meta.json at its "
        "top (meta.conf: only JSON is read); no app with config/config_fed_server.json (the server side)",
    }
    put(api, tenant, "jobs/fl/flare/meta.json")
    put(api, tenant, "jobs/fl/flare/app/config/config_fed_server.json")
    good = await submit(api, admin, body)
    assert good.status_code == 201, good.text
    persisted = {"script": "jobs/fl/scripts/train.py", "persistor": "jobs/fl/scripts/persistor.py:Keep"}
    no_file = await submit(api, admin, {**body, "federated": persisted})
    assert no_file.json()["error"]["code"] == "missing_objects" and "persistor.py" in no_file.text
    [submitted] = [r.event for r in await job_events(log)]
    assert submitted.federated.job_folder == "jobs/fl/flare/" and submitted.federated.script == ""
    assert submitted.inputs == ["jobs/fl/flare/"]  # the shards' folder is checked on its own


async def test_a_federated_job_needs_no_shards_but_one_per_shard_if_it_has_any(
    api: Api, log: EventLog
) -> None:
    tenant, admin = await api.tenant()
    for name in ("fl-none", "fl-some"):
        put(api, tenant, f"jobs/{name}/scripts/train.py")
    federated = {"script": "jobs/fl-none/scripts/train.py"}
    body = spec(name="fl-none", kind="federated", rounds=2, shards=2, command=[], federated=federated)
    none = await submit(api, admin, body)
    assert none.status_code == 201, none.text
    assert none.json()["spec"]["inputs"] == ["jobs/fl-none/scripts/train.py"]

    put(api, tenant, "jobs/fl-some/shards/shard-0.zip")
    put(api, tenant, "jobs/fl-some/shards/notes.txt")  # not a shard
    put(api, tenant, "jobs/fl-some/shards/old/shard-1.zip")  # not directly in the folder
    some = {**body, "name": "fl-some", "federated": {"script": "jobs/fl-some/scripts/train.py"}}
    short = await submit(api, admin, some)
    assert short.status_code == 422 and short.json()["error"] == {
        "code": "missing_objects",
        "message": "the job has 2 shards but jobs/fl-some/shards/ holds 1 shard ZIP(s): nothing for slot 1 "
        "(upload one ZIP per shard, or none for training code that reads no data)",
    }
    put(api, tenant, "jobs/fl-some/shards/shard-1.zip")
    assert (await submit(api, admin, some)).status_code == 201
    assert [r.event.name for r in await job_events(log)] == ["fl-none", "fl-some"]


async def test_a_job_that_names_an_image_is_kept_for_workers_that_run_images(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    await register_worker(api, "w-own", pool="private", owner_tenant=tenant)  # an agent's host: no images
    image = "registry.example:5000/team/trainer:v1@sha256:" + "a" * 64
    never = await submit(api, admin, spec(pool="private", image=image))
    assert never.status_code == 422, never.text
    error = never.json()["error"]
    assert error["code"] == "unplaceable"
    assert f"tenant {tenant} has no private workers that run container images" in error["message"]
    accepted = await submit(api, admin, spec(image=image))  # shared: it waits for such workers
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["image"] == image
    [stored] = await job_events(log)
    assert isinstance(stored.event, JobSubmitted) and stored.event.image == image


async def test_a_job_over_the_tenants_whole_quota_is_refused(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    await register_worker(api, "w-gpu", gpus=8)
    quota = await api.request(
        "PUT", f"/v1/tenants/{tenant}/quotas/shared", api.operator_key, json={"gpus": 2}
    )
    assert quota.status_code == 200
    over = await submit(api, admin, spec(shards=3, resources={"gpus": 1}))
    assert over.status_code == 422 and over.json()["error"]["code"] == "over_quota"
    assert "quota" in over.json()["error"]["message"]
    fits = await submit(api, admin, spec(shards=2, resources={"gpus": 1, "gpu_type": "A100"}))
    assert fits.status_code == 201, fits.text
    assert len(await job_events(log)) == 1


async def test_roles_auth_and_tenant_scoping(api: Api) -> None:
    a, a_admin = await api.tenant()
    _, b_admin = await api.tenant()
    viewer = await api.key(a, a_admin, "viewer")
    provider = await provider_key(api, "prov-x")
    job_id = (await submit(api, a_admin, spec())).json()["job_id"]
    routes = [
        ("GET", "/v1/jobs"),
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
    ]
    assert (await submit(api, None, spec())).status_code == 401
    for method, path in routes:
        assert (await api.request(method, path)).status_code == 401, path
        assert (await api.request(method, path, provider)).status_code == 403, path
    assert (await submit(api, viewer, spec())).status_code == 403
    assert (await submit(api, provider, spec())).status_code == 403
    assert (await api.request("POST", f"/v1/jobs/{job_id}/cancel", viewer)).status_code == 403
    assert (await api.request("GET", f"/v1/jobs/{job_id}", viewer)).status_code == 200
    for method, path in routes[1:]:
        response = await api.request(method, path, b_admin)
        assert response.status_code == 404, path
        assert job_id in response.json()["error"]["message"]
    assert (await api.request("GET", f"/v1/jobs/{job_id}?tenant={a}", b_admin)).status_code == 404
    assert (await api.request("GET", "/v1/jobs", b_admin)).json()["items"] == []
    assert (await api.request("GET", "/v1/jobs", api.operator_key)).status_code == 400  # names no tenant
    seen = await api.request("GET", f"/v1/jobs/{job_id}?tenant={a}", api.operator_key)
    assert seen.status_code == 200 and seen.json()["tenant"] == a
    ghost = await api.request("GET", "/v1/jobs?tenant=no-such-tenant", api.operator_key)
    assert ghost.status_code == 404


async def test_list_filters_and_cursor_pagination(api: Api) -> None:
    _, admin = await api.tenant()
    names = ["sweep-1", "sweep-2", "sweep-3", "eval-1", "sweep-4"]
    ids = [(await submit(api, admin, spec(name=n))).json()["job_id"] for n in names]
    await api.request("POST", f"/v1/jobs/{ids[1]}/cancel", admin)
    seen: list[str] = []
    url = "/v1/jobs?limit=2&name_prefix=sweep"
    while url:
        page = (await api.request("GET", url, admin)).json()
        seen += [job["spec"]["name"] for job in page["items"]]
        url = f"/v1/jobs?limit=2&name_prefix=sweep&after={page['next']}" if page["next"] else ""
    assert seen == ["sweep-4", "sweep-3", "sweep-2", "sweep-1"]  # newest first
    cancelled = (await api.request("GET", "/v1/jobs?state=cancelled", admin)).json()["items"]
    assert [job["job_id"] for job in cancelled] == [ids[1]]
    assert len((await api.request("GET", "/v1/jobs?kind=process", admin)).json()["items"]) == 5
    events_cursor = (await api.request("GET", f"/v1/jobs/{ids[0]}/events?limit=1", admin)).json()["next"]
    for bad in ["garbage!", "bm9wZQ", events_cursor]:  # not a cursor; base64 of "nope"; another list's
        response = await api.request("GET", f"/v1/jobs?after={bad}", admin)
        assert response.status_code == 400, bad
        assert response.json()["error"]["code"] == "invalid_cursor"
    for query in ["limit=0", "limit=1000", "state=sleeping", "surprise=1"]:
        assert (await api.request("GET", f"/v1/jobs?{query}", admin)).status_code == 400, query


async def test_get_shows_assignments_progress_checkpoint_and_why(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    job_id = (await submit(api, admin, spec(shards=2))).json()["job_id"]
    await append_job(
        api, tenant, job_id, JobQueued(reason="waiting: 2 shards need a CPU slot; 1 worker is busy")
    )
    waiting = (await api.request("GET", f"/v1/jobs/{job_id}", admin)).json()
    assert waiting["pending_reason"].startswith("waiting: 2 shards")
    assert any(line.startswith("pending: waiting") for line in waiting["why"])
    assignments = [
        Assignment(assignment_id=f"{job_id}-s{i}-e1", worker_id=f"w{i}", slot=i, epoch=1) for i in range(2)
    ]
    cards = [ScoreCard(worker_id=f"w{i}", score=0.9, terms={"uptime": 1.0}) for i in range(2)]
    await append_job(
        api,
        tenant,
        job_id,
        JobPlaced(assignments=assignments, provenance=Provenance(candidates=3, top=cards)),
    )
    for a in assignments:
        await append_job(
            api,
            tenant,
            job_id,
            JobStarted(assignment_id=a.assignment_id, worker_id=a.worker_id, slot=a.slot, epoch=1),
        )
    await append_job(api, tenant, job_id, JobProgress(epoch=1, slot=0, round=2, train_epoch=3, loss=0.25))
    await append_job(
        api, tenant, job_id, JobCheckpointed(epoch=1, slot=0, round=2, object_key="jobs/hello/ckpt-2")
    )
    job = (await api.request("GET", f"/v1/jobs/{job_id}", admin)).json()
    assert job["state"] == "running" and job["pending_reason"] is None
    assert [(a["slot"], a["worker_id"], a["started"]) for a in job["assignments"]] == [
        (0, "w0", True),
        (1, "w1", True),
    ]
    assert job["progress"]["round"] == 2 and job["progress"]["epoch"] == 3 and job["progress"]["loss"] == 0.25
    assert job["last_checkpoint"] == {
        "object_key": "jobs/hello/ckpt-2",
        "round": 2,
        "step": None,
        "parts": [],
    }
    assert "shard 0 on w0" in "\n".join(job["why"]) and "3 workers considered" in "\n".join(job["why"])


async def test_cancel_stops_running_shards_and_a_finished_job_is_a_conflict(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    job_id = (await submit(api, admin, spec())).json()["job_id"]
    assignment = Assignment(assignment_id=f"{job_id}-s0-e1", worker_id="w-run", slot=0, epoch=1)
    await append_job(
        api, tenant, job_id, JobPlaced(assignments=[assignment], provenance=Provenance(candidates=1))
    )
    cancelled = await api.request("POST", f"/v1/jobs/{job_id}/cancel", member)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled" and cancelled.json()["cancelled_by"] == f"tenant:{tenant}"
    again = await api.request("POST", f"/v1/jobs/{job_id}/cancel", member)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "job_ended" and "cancelled" in again.json()["error"]["message"]
    [stop] = [r.event for r in await records(log, "COMMANDS")]  # the retry re-sent it under the same id
    assert isinstance(stop, StopWork) and stop.assignment_id == assignment.assignment_id


async def test_events_are_paginated_by_sequence(api: Api) -> None:
    tenant, admin = await api.tenant()
    job_id = (await submit(api, admin, spec(env={"WANDB_API_KEY": "secret"}))).json()["job_id"]
    other = (await submit(api, admin, spec(name="other"))).json()["job_id"]
    for n in range(4):
        await append_job(api, tenant, job_id, JobQueued(reason=f"reason {n}"))
        await append_job(api, tenant, other, JobQueued(reason="not mine"))
    items: list[dict[str, Any]] = []
    url = f"/v1/jobs/{job_id}/events?limit=2"
    while url:
        page = (await api.request("GET", url, admin)).json()
        items += page["items"]
        url = f"/v1/jobs/{job_id}/events?limit=2&after={page['next']}" if page["next"] else ""
    assert [i["type"] for i in items] == ["job.submitted"] + ["job.queued"] * 4
    assert [i["event"].get("reason") for i in items[1:]] == [f"reason {n}" for n in range(4)]
    seqs = [i["seq"] for i in items]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert items[0]["event"]["name"] == "hello" and items[0]["time"].endswith("Z")
    assert items[0]["event"]["env"] == {"WANDB_API_KEY": "<redacted>"}
    shown = (await api.request("GET", f"/v1/jobs/{job_id}", admin)).json()
    assert shown["spec"]["env"] == {"WANDB_API_KEY": HIDDEN} and "secret" not in str(shown)
    bad = await api.request("GET", f"/v1/jobs/{job_id}/events?after=zzz", admin)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"


async def test_a_submitted_job_runs_on_a_real_agent_to_completion(
    api: Api, log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    tenant, admin = await api.tenant()
    # the script comes from the workspace: the agent downloads the job's inputs into its working dir
    script = b'print(\'RESONTECH_PROGRESS {"step": 1, "loss": 0.5}\')\n'
    api.kernel.s3.put_object(Bucket=f"rt-{tenant}", Key="scripts/hello.py", Body=script)
    worker_id = await registered(log, agents("e2e"))
    body = spec(name="e2e", command=[sys.executable, "scripts/hello.py"], inputs=["scripts/hello.py"])
    async with coordinator(log):
        submitted = await submit(api, admin, body)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job_id"]
        await until(
            lambda: api.kernel.state(SCHEDULE).jobs[f"{tenant}/{job_id}"].state == "completed", "done"
        )
    job = (await api.request("GET", f"/v1/jobs/{job_id}", admin)).json()
    assert job["state"] == "completed"
    [assignment] = job["assignments"]
    assert assignment["worker_id"] == worker_id and assignment["done"]
    assert job["progress"]["loss"] == 0.5
    types = [
        i["type"] for i in (await api.request("GET", f"/v1/jobs/{job_id}/events", admin)).json()["items"]
    ]
    assert types[0] == "job.submitted" and types[-1] == "job.completed" and "job.placed" in types


HOSTILE_PARAMS = ["..", "a.b", "x" * 300, "%00", "ÿ", "-1", "0", "2026-99"]
HOSTILE_QUERY = ["", "-1", "x" * 500, "null", "[]", "2026-03", "true", "\u00ff", "%FF"]
HOSTILE_BODIES = [
    b"[]",
    b'{"name": "j", "kind": "process", "command": ["x"], "inputs": ["' + b"k" * 1024 + b'", "a//b"]}',
    b'"x"',
    b'{"name": "e", "model": "org/m", "model_source": "workspace", "min_replicas": 2, "max_replicas": 64}',
    b"1e999",
    b'{"min_replicas": 0, "max_replicas": 1}',
    b'{"name": "j", "kind": "process", "command": ["x"], "resources": {"gpus": 64, "vram_mb": 4194304}}',
    b"\xff\xfe",
]


async def test_hostile_input_to_these_routes_never_yields_a_5xx(api: Api) -> None:
    """A small fuzz over every jobs, endpoints, workers and billing operation, as each kind of
    principal: odd path parameters, query values and bodies are 4xx, never 5xx."""
    from gateway.routes import billing, endpoints, jobs, workers

    _, admin = await api.tenant()
    keys = [admin, await provider_key(api, "prov-fuzz"), api.operator_key]
    operations = [
        op for r in (jobs.router, endpoints.router, workers.router, billing.router) for op in r.operations
    ]
    for op in operations:
        fields = list(op.query.__struct_fields__) if op.query is not None else ["tenant"]
        for n, value in enumerate(HOSTILE_PARAMS):
            path = re.sub(r"{[^}]+}", lambda _, v=value: v, op.path)
            query = {field: HOSTILE_QUERY[(n + i) % len(HOSTILE_QUERY)] for i, field in enumerate(fields)}
            body = HOSTILE_BODIES[n % len(HOSTILE_BODIES)]
            for key, params in itertools.product(keys, (query, {})):
                response = await api.request(
                    op.method,
                    path,
                    key,
                    params=params,
                    content=body,
                    headers={"content-type": "application/json"},
                )
                assert response.status_code < 500, (op.method, path, params, body, response.text)
                if response.status_code >= 400:
                    assert response.json()["error"]["message"], (op.method, path)


async def test_openapi_describes_every_route_of_these_areas(api: Api) -> None:
    doc = (await api.request("GET", "/openapi.json")).json()
    expected = {
        ("post", "/v1/jobs"), ("get", "/v1/jobs"), ("get", "/v1/jobs/{job_id}"),
        ("post", "/v1/jobs/{job_id}/cancel"), ("get", "/v1/jobs/{job_id}/events"),
        ("post", "/v1/endpoints"), ("get", "/v1/endpoints"), ("get", "/v1/endpoints/{endpoint_id}"),
        ("put", "/v1/endpoints/{endpoint_id}/scale"), ("delete", "/v1/endpoints/{endpoint_id}"),
        ("get", "/v1/workers"), ("get", "/v1/workers/{worker_id}"),
        ("get", "/v1/billing/usage"), ("get", "/v1/billing/invoices"),
        ("get", "/v1/billing/invoices/{period}"), ("get", "/v1/billing/payouts"),
    }  # fmt: skip
    found = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert expected <= found
    schemas = doc["components"]["schemas"]
    for method, path in expected:
        op = doc["paths"][path][method]
        success = next(code for code in op["responses"] if code.startswith("2"))
        if success != "204":
            ref = op["responses"][success]["content"]["application/json"]["schema"]
            name = (ref.get("$ref") or ref["items"]["$ref"]).rsplit("/", 1)[1]
            assert name in schemas, (method, path)
    submit_op = doc["paths"]["/v1/jobs"]["post"]
    assert "422" in submit_op["responses"] and "409" in submit_op["responses"]
    assert {p["name"] for p in doc["paths"]["/v1/jobs"]["get"]["parameters"]} >= {"state", "after", "limit"}
    assert schemas["SubmitJob"]["additionalProperties"] is False


def test_the_idle_fleet_rebuilds_only_the_workers_that_changed() -> None:
    from gateway.jobspec import IdleFleet
    from projections import REGISTRY
    from schemas.envelope import Recorded
    from schemas.values import Gpu
    from schemas.workers import WorkerCordoned, WorkerRegistered

    state = REGISTRY.initial()
    gpu = Gpu(index=0, model="A100", vram_total_mb=80_000, vram_free_mb=80_000)
    events = [
        (f"worker.w{i}.registered", WorkerRegistered(provider="p", hostname=f"h{i}", gpus=[gpu]))
        for i in range(3)
    ]
    for seq, (subject, event) in enumerate(events, 1):
        state = REGISTRY.evolve(
            state, Recorded(stream="WORKERS", seq=seq, subject=subject, time_ns=seq, msg_id="", event=event)
        )
    fleet = IdleFleet()
    first = fleet.hosts(state, 10)
    assert [c.worker_id for c in first] == ["w0", "w1", "w2"] and fleet.hosts(state, 10) is first
    cordon = WorkerCordoned(reason="disk", by="ops")
    state = REGISTRY.evolve(
        state,
        Recorded(stream="WORKERS", seq=4, subject="worker.w1.cordoned", time_ns=4, msg_id="", event=cordon),
    )
    second = fleet.hosts(state, 10)
    assert second[0] is first[0] and second[2] is first[2]  # unchanged records keep their candidate
    assert second[1] is not first[1] and second[1].state == "cordoned"
