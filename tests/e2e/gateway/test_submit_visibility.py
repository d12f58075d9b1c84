"""A write the log acknowledged is never answered with a 5xx, however far the gateway lags.

The gateway waits up to ``READ_YOUR_WRITES_S`` for its own projection to apply what it appended.
Before the fix a projection that lagged longer turned a stored ``job.submitted`` into a 500, which
invites the client to retry, and a retry without ``Idempotency-Key`` makes a second job. Here the
projection really lags: the gateway kernel's runner of that projection stops following the log
(:func:`lagging`) while the request is made, and catches up afterwards. The only thing shortened is
the wait itself (``READ_YOUR_WRITES_S``, 5 s, set to 0.3 s), so that the tests do not sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import gateway.kernel
from core.log import EventLog
from projections import ENDPOINTS, SCHEDULE, TENANTS
from projections.base import Projection
from schemas.api.jobs import HIDDEN
from schemas.audit import RequestRecorded
from schemas.endpoints import EndpointDeployed
from schemas.jobs import JobSubmitted
from tests.support import records
from tests.support.gateway import Api, deploy, deploy_body, spec, submit

WAIT_S = 0.3


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway.kernel, "READ_YOUR_WRITES_S", WAIT_S)


@contextlib.asynccontextmanager
async def lagging(api: Api, projection: Projection[Any]) -> AsyncIterator[None]:
    """The gateway's runner of ``projection`` stops following the log (its state stays where it is)
    until the block ends; then it follows again from where it stopped, catching up first."""
    kernel = api.kernel
    assert kernel is not None
    name = f"follow-{projection.name}"
    [task] = [t for t in kernel._tasks if t.get_name() == name]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    runner = kernel.runners[projection.name]
    stopped_at = runner.seq
    try:
        yield
        assert runner.seq == stopped_at, "the projection was meant to lag"
    finally:
        kernel._tasks[kernel._tasks.index(task)] = asyncio.create_task(runner.run(kernel._stop), name=name)


async def caught_up(api: Api, log: EventLog, projection: Projection[Any]) -> None:
    assert api.kernel is not None
    await api.kernel.runners[projection.name].wait_for(await log.last_seq(projection.stream), 10.0)


async def test_a_stored_submission_is_a_202_and_a_retry_returns_the_same_job(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    headers = {"Idempotency-Key": "lagging-42"}
    async with lagging(api, SCHEDULE):
        accepted = await submit(api, admin, spec(env={"TOKEN": "secret"}), headers=headers)
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        assert (
            job["state"] == "queued"
            and job["spec"]["name"] == "hello"
            and job["spec"]["env"] == {"TOKEN": HIDDEN}
        )
        assert job["spec"]["submitted_by"].startswith("tenant:") and job["submitted_at"]
        retried = await submit(api, admin, spec(env={"TOKEN": "secret"}), headers=headers)
        assert retried.status_code == 202, retried.text
        assert retried.json()["job_id"] == job["job_id"]
        assert retried.headers["Idempotent-Replayed"] == "true"
        reused = await submit(api, admin, spec(name="other"), headers=headers)
        assert (reused.status_code, reused.json()["error"]["code"]) == (422, "idempotency_key_reused")
    await caught_up(api, log, SCHEDULE)
    again = await submit(api, admin, spec(env={"TOKEN": "secret"}), headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    shown = again.json()
    assert shown["job_id"] == job["job_id"]
    assert {k: v for k, v in shown.items() if k != "why"} == {k: v for k, v in job.items() if k != "why"}
    [stored] = await records(log, "JOBS")
    assert isinstance(stored.event, JobSubmitted) and stored.subject.split(".")[2] == job["job_id"]


async def test_without_an_idempotency_key_a_stored_submission_is_still_no_5xx(
    api: Api, log: EventLog
) -> None:
    _, admin = await api.tenant()
    async with lagging(api, SCHEDULE):
        accepted = await submit(api, admin, spec())
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        missing = await api.request("GET", f"/v1/jobs/{job_id}", admin)
        assert missing.status_code == 404  # the gateway does not show it yet: that is what 202 says
    await caught_up(api, log, SCHEDULE)
    got = await api.request("GET", f"/v1/jobs/{job_id}", admin)
    assert got.status_code == 200 and got.json()["state"] == "queued"
    audit = [r.event for r in await records(log, "AUDIT") if isinstance(r.event, RequestRecorded)]
    audit = [a for a in audit if a.route == "/v1/jobs"]
    assert [(a.status, a.resource) for a in audit] == [(202, job_id)]  # the stored change is audited


async def test_a_cancel_stored_while_the_schedule_lags_is_a_202(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    job_id = (await submit(api, admin, spec())).json()["job_id"]
    async with lagging(api, SCHEDULE):
        cancelled = await api.request("POST", f"/v1/jobs/{job_id}/cancel", admin)
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["state"] == "cancelled" and cancelled.json()["cancelled_by"]
    await caught_up(api, log, SCHEDULE)
    assert (await api.request("GET", f"/v1/jobs/{job_id}", admin)).json()["state"] == "cancelled"


async def test_endpoint_deploy_scale_and_delete_stored_while_endpoints_lag_are_202s(
    api: Api, log: EventLog
) -> None:
    _, admin = await api.tenant()
    headers = {"Idempotency-Key": "deploy-lagging"}
    async with lagging(api, ENDPOINTS):
        accepted = await deploy(api, admin, deploy_body(max_replicas=3), headers=headers)
        assert accepted.status_code == 202, accepted.text
        endpoint = accepted.json()
        assert endpoint["state"] == "deploying" and endpoint["spec"]["max_replicas"] == 3
        retried = await deploy(api, admin, deploy_body(max_replicas=3), headers=headers)
        assert retried.status_code == 202 and retried.json()["endpoint_id"] == endpoint["endpoint_id"]
        assert retried.headers["Idempotent-Replayed"] == "true"
    await caught_up(api, log, ENDPOINTS)
    again = await deploy(api, admin, deploy_body(max_replicas=3), headers=headers)
    assert again.status_code == 201 and again.json()["endpoint_id"] == endpoint["endpoint_id"]
    assert len([r for r in await records(log, "ENDPOINTS") if isinstance(r.event, EndpointDeployed)]) == 1

    path = f"/v1/endpoints/{endpoint['endpoint_id']}"
    async with lagging(api, ENDPOINTS):
        scaled = await api.request("PUT", f"{path}/scale", admin, json={"min_replicas": 1, "max_replicas": 2})
        assert scaled.status_code == 202, scaled.text
        assert (scaled.json()["spec"]["min_replicas"], scaled.json()["spec"]["max_replicas"]) == (1, 2)
    await caught_up(api, log, ENDPOINTS)
    async with lagging(api, ENDPOINTS):
        deleted = await api.request("DELETE", path, admin)
        assert deleted.status_code == 202, deleted.text
    await caught_up(api, log, ENDPOINTS)
    assert (await api.request("GET", path, admin)).json()["state"] == "deleted"


async def test_any_other_route_answers_202_for_a_stored_change(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    viewer = await api.key(tenant, admin, "viewer")
    key_id = viewer.split("_")[1]
    async with lagging(api, TENANTS):
        revoked = await api.request("DELETE", f"/v1/tenants/{tenant}/keys/{key_id}", admin)
        assert revoked.status_code == 202, revoked.text
        body = revoked.json()
        assert (body["status"], body["stream"]) == ("accepted", "TENANTS") and body["seq"] > 0
    await caught_up(api, log, TENANTS)
    assert (await api.request("GET", "/v1/me", viewer)).status_code == 401


async def test_openapi_documents_the_202s(api: Api) -> None:
    document = (await api.request("GET", "/openapi.json")).json()
    for path, method in (
        ("/v1/jobs", "post"),
        ("/v1/jobs/{job_id}/cancel", "post"),
        ("/v1/endpoints", "post"),
        ("/v1/endpoints/{endpoint_id}/scale", "put"),
    ):
        responses = document["paths"][path][method]["responses"]
        assert (
            responses["202"]["content"]
            == next(r for s, r in responses.items() if s in ("200", "201"))["content"]
        )
