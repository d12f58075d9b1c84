"""The SDK against a real served gateway and the real object store: typed results (at run time and
for mypy), API errors as exceptions (a malformed answer included), uploads single and multipart
(parallel, with progress, aborted on failure), downloads checked by size and SHA-256."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import ClientError

from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from gateway import AsyncClient, Client
from gateway.client import ApiError, TransferError
from ops.devstack.objectstore import ObjectStoreServer
from schemas.api.billing import Usage
from schemas.api.common import Me, Page
from schemas.api.endpoints import DeployEndpoint, Endpoint, Traffic
from schemas.api.feed import FeedMessage
from schemas.api.jobs import Job, JobEventItem, SubmitJob
from schemas.api.tenants import KeyInfo, Tenant
from schemas.api.workspace import WorkspaceObject
from schemas.jobs import JobCompleted
from tests.support import REPO
from tests.support.feed import progress, submit
from tests.support.gateway import GatewayServer, ServeGateway


def make_tenant(server: GatewayServer) -> tuple[str, str]:
    with Client(server.url, server.operator_key) as operator:
        created = operator.create_tenant(f"sdk-{os.urandom(3).hex()}", "SDK test")
    return created.tenant.tenant, created.admin_key.key


def test_identity_tenancy_and_errors(gateway_server: GatewayServer) -> None:
    tenant, key = make_tenant(gateway_server)
    with Client(gateway_server.url, key) as rt:
        me = rt.me()
        assert (me.kind, me.account, me.role) == ("tenant", tenant, "admin")
        viewer = rt.issue_key(tenant, "viewer", "dashboard")
        assert viewer.key.startswith("rt_") and viewer.role == "viewer"
        assert {k.role for k in rt.keys(tenant)} == {"admin", "viewer"}
        with pytest.raises(ApiError) as refused:
            rt.tenants()
        assert refused.value.status == 403 and refused.value.code == "forbidden"
    with (
        Client(gateway_server.url, "rt_000000000000_" + "x" * 40) as stranger,
        pytest.raises(ApiError) as unknown,
    ):
        stranger.me()
    assert unknown.value.status == 401
    with Client("http://127.0.0.1:1", key) as nowhere, pytest.raises(ApiError) as unreachable:
        nowhere.me()
    assert unreachable.value.code == "unreachable"


def test_every_call_returns_the_api_body_as_its_struct(gateway_server: GatewayServer) -> None:
    tenant, key = make_tenant(gateway_server)
    with Client(gateway_server.url, key) as rt:
        me = rt.me()
        assert isinstance(me, Me) and me.account == tenant
        assert isinstance(rt.tenant(tenant), Tenant)
        assert [type(k) for k in rt.keys(tenant)] == [KeyInfo]
        job = rt.submit_job(SubmitJob(name="typed", kind="process", command=["true"]))  # a Struct spec
        assert isinstance(job, Job) and job.state == "queued" and job.spec.resources.gpus == 0
        page = rt.jobs(state="queued")
        assert isinstance(page, Page) and [(type(j), j.job_id) for j in page.items] == [(Job, job.job_id)]
        detail = rt.job(job.job_id)
        assert isinstance(detail, Job) and detail.why  # the detail view says why it waits
        events = rt.job_events(job.job_id)
        assert isinstance(events.items[0], JobEventItem) and events.items[0].type == "job.submitted"
        cancelled = rt.cancel_job(job.job_id)
        assert isinstance(cancelled, Job) and cancelled.state == "cancelled"
        endpoint = rt.deploy(DeployEndpoint(name="chat", model="HuggingFaceTB/SmolLM2-135M-Instruct"))
        assert isinstance(endpoint, Endpoint) and isinstance(endpoint.traffic, Traffic)
        assert [e.endpoint_id for e in rt.endpoints().items] == [endpoint.endpoint_id]
        assert rt.delete_endpoint(endpoint.endpoint_id) is None
        objects = rt.objects()
        assert isinstance(objects, Page) and objects.items == [] and objects.next is None
        assert isinstance(rt.usage(), Usage) and rt.invoices() == []


def _answering(status: int, body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body))


MALFORMED = [
    (200, b'{"job_id": 7}', "invalid_response"),  # JSON, but not a Job
    (200, b"<html>down for maintenance</html>", "invalid_response"),  # not JSON at all
    (400, b'{"error": "no"}', "http_error"),  # an error without the API's error body
    (502, b"<html>bad gateway</html>", "http_error"),
    # stored but not yet visible, with no resource to show: the server's message says what to do
    (202, b'{"status": "accepted", "stream": "JOBS", "seq": 9, "message": "stored"}', "accepted"),
]


@pytest.mark.parametrize(("status", "body", "code"), MALFORMED)
def test_a_malformed_answer_is_an_api_error_not_a_decoding_traceback(
    status: int, body: bytes, code: str
) -> None:
    """A unit test: a canned answer in place of the gateway (a real one only answers well)."""
    with Client("http://gateway.invalid", "k") as rt:
        rt.http.close()
        rt.http = httpx.Client(base_url=rt.config.url, transport=_answering(status, body))
        with pytest.raises(ApiError) as refused:
            rt.job("j1")
    assert type(refused.value) is ApiError
    assert (refused.value.status, refused.value.code) == (status, code)
    if code == "invalid_response":
        assert "GET /v1/jobs/j1" in refused.value.message


async def test_the_async_client_refuses_a_malformed_answer_too() -> None:
    async with AsyncClient("http://gateway.invalid", "k") as rt:
        await rt.http.aclose()
        rt.http = httpx.AsyncClient(base_url=rt.config.url, transport=_answering(200, b'{"items": 1}'))
        with pytest.raises(ApiError) as refused:
            await rt.jobs()
    assert refused.value.code == "invalid_response" and "Expected `array`" in refused.value.message


TYPED_USE = """
from typing import assert_type

from gateway import AsyncClient, Client
from schemas.api.common import Me, Page
from schemas.api.feed import FeedMessage
from schemas.api.jobs import Job
from schemas.api.workspace import WorkspaceObject


def sync(rt: Client) -> None:
    assert_type(rt.me(), Me)
    assert_type(rt.job("j1"), Job)
    assert_type(rt.jobs(state="running"), Page[Job])
    assert_type(rt.submit_job({"name": "x", "kind": "process"}), Job)
    assert_type(rt.delete_endpoint("e1"), None)
    assert_type(rt.upload("f", "k"), WorkspaceObject)
    for message in rt.feed(job="j1"):
        assert_type(message, FeedMessage)


async def asynchronous(rt: AsyncClient) -> None:
    assert_type(await rt.job("j1"), Job)
    assert_type(await rt.objects("jobs/"), Page[WorkspaceObject])
    async for message in rt.feed(job="j1"):
        assert_type(message, FeedMessage)


def misuse(rt: Client) -> None:
    rt.job(1)
    rt.jobs(state="sleeping")
    rt.job("j1").no_such_field
"""


def test_mypy_sees_the_types_of_every_call(tmp_path: Path) -> None:
    """What a user's type checker sees: each method's own return type, and its arguments checked."""
    use = tmp_path / "use_sdk.py"
    use.write_text(TYPED_USE)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary", str(use)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line.split(": error: ")[1] for line in checked.stdout.splitlines() if ": error: " in line]
    assert [error.rsplit("  [", 1)[1] for error in errors] == ["arg-type]", "arg-type]", "attr-defined]"], (
        checked.stdout + checked.stderr
    )


def test_small_and_multipart_uploads_round_trip_with_progress(
    gateway_server: GatewayServer, tmp_path: Path
) -> None:
    _, key = make_tenant(gateway_server)
    small = tmp_path / "train.py"
    small.write_text("print('hello')\n")
    big = tmp_path / "shard-0.zip"
    big.write_bytes(os.urandom(52_000_000))  # 50 MB + 2 MB: two parts
    seen: list[tuple[int, int]] = []
    with Client(gateway_server.url, key) as rt:
        stored = rt.upload(small, "scripts/train.py", content_type="text/x-python")
        assert stored.size == small.stat().st_size
        stored = rt.upload(
            big, "jobs/mnist/shards/0.zip", progress=lambda done, total: seen.append((done, total))
        )
        assert stored.size == 52_000_000
        assert seen[-1] == (52_000_000, 52_000_000) and len(seen) > 10
        assert [done for done, _ in seen] == sorted(done for done, _ in seen)
        listed = rt.objects("jobs/mnist/")
        assert [o.key for o in listed.items] == ["jobs/mnist/shards/0.zip"]
        back = rt.download("jobs/mnist/shards/0.zip", tmp_path / "back.zip")
        assert back.read_bytes() == big.read_bytes()
        assert rt.download("scripts/train.py", tmp_path).read_text() == "print('hello')\n"
        rt.delete_object("scripts/train.py")
        with pytest.raises(ApiError) as gone:
            rt.download_url("scripts/train.py")
        assert gone.value.status == 404


def test_a_failed_multipart_upload_is_aborted(
    gateway_server: GatewayServer, object_store: ObjectStoreServer, tmp_path: Path
) -> None:
    tenant, key = make_tenant(gateway_server)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12_000_000))

    def shrink(done: int, total: int) -> None:
        if done > 2_000_000:
            big.write_bytes(b"")  # the file changes under the upload: a part cannot be read in full

    with Client(gateway_server.url, key) as rt:
        with pytest.raises(TransferError) as failed:
            rt.upload(big, "jobs/x/big.bin", progress=shrink, checksum=False)
        assert failed.value.code == "file_changed"
        assert rt.objects("jobs/x/").items == []
    # the SDK aborted the multipart upload: the store holds no upload in progress
    s3 = object_store.client()
    try:
        uploads = s3.list_multipart_uploads(Bucket=f"rt-{tenant}").get("Uploads", [])
    except ClientError as exc:  # rclone answers NoSuchUpload when there is none
        assert exc.response["Error"]["Code"] == "NoSuchUpload"
        uploads = []
    assert uploads == []


def test_uploads_into_read_only_prefixes_are_refused(gateway_server: GatewayServer, tmp_path: Path) -> None:
    _, key = make_tenant(gateway_server)
    f = tmp_path / "m.pt"
    f.write_bytes(b"weights")
    with Client(gateway_server.url, key) as rt, pytest.raises(ApiError) as refused:
        rt.upload(f, "model_out/m.pt")
    assert refused.value.status == 403 and refused.value.code == "read_only_prefix"


async def test_async_client_uploads_and_downloads(gateway_server: GatewayServer, tmp_path: Path) -> None:
    tenant, key = make_tenant(gateway_server)
    big = tmp_path / "data.bin"
    big.write_bytes(os.urandom(11_000_000))
    async with AsyncClient(gateway_server.url, key) as rt:
        me = await rt.me()
        assert isinstance(me, Me) and me.account == tenant
        spec = {"name": "a", "kind": "process", "command": ["true"]}
        first = await rt.submit_job(spec, idempotency_key="retry-1")
        again = await rt.submit_job(spec, idempotency_key="retry-1")  # the header is sent: stored once
        assert isinstance(first, Job) and again.job_id == first.job_id
        stored = await rt.upload(big, "jobs/a/data.bin")
        assert isinstance(stored, WorkspaceObject) and stored.size == 11_000_000
        back = await rt.download("jobs/a/data.bin", tmp_path / "back.bin")
        assert back.read_bytes() == big.read_bytes()


async def test_the_feed_iterator_resumes_by_itself_after_being_dropped(
    serve_gateway: ServeGateway, log: EventLog
) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_FEED_QUEUE="4")  # a slow reader is dropped quickly
    tenant, key = await server.tenant()
    appended = [await submit(log, tenant, "j1")]
    appended += [await progress(log, tenant, "j1", step) for step in range(60)]
    seen: list[int] = []
    async with AsyncClient(server.url, key) as rt:
        feed = rt.feed(job="j1", after="jobs:0")  # from the start (without a cursor the feed starts live)
        async for message in feed:
            assert isinstance(message, FeedMessage) and message.seq is not None
            seen.append(message.seq)
            await asyncio.sleep(0.01)  # slower than the gateway sends: it closes us with 4008
            if len(seen) == 2:
                appended += [await progress(log, tenant, "j1", step) for step in range(60, 120)]
            if len(seen) == len(appended):
                break
        await feed.aclose()
    assert seen == appended  # every event once, in order, across the reconnects


async def test_the_feed_iterator_stops_with_the_reason_when_its_key_is_refused(
    serve_gateway: ServeGateway,
) -> None:
    """A refusal is final (reconnecting cannot help): the iterator raises it instead of retrying."""
    server = await serve_gateway()
    await server.tenant()
    async with AsyncClient(server.url, "rt_nosuchkey_0000000000000000") as rt:
        feed = rt.feed()
        with pytest.raises(ApiError) as refused:
            await asyncio.wait_for(anext(feed), timeout=10.0)
        await feed.aclose()
    assert refused.value.status == 401, refused.value


def test_the_sync_feed_and_watch_follow_a_job_to_its_end(
    gateway_server: GatewayServer, settings: Settings, tmp_path: Path
) -> None:
    tenant, key = make_tenant(gateway_server)
    with Client(gateway_server.url, key) as rt:
        job = rt.submit_job({"name": "w", "kind": "process", "command": ["true"]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(RESONTECH_GATEWAY_URL=gateway_server.url, RESONTECH_API_KEY=key, XDG_CONFIG_HOME=str(tmp_path))
    watch = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "watch", job.job_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watch.stdout is not None
    assert f"job {job.job_id} (w): queued" in watch.stdout.readline()

    async def finish() -> None:
        async with await EventLog.connect(settings) as log:
            await asyncio.sleep(1.0)  # let watch subscribe (it would replay anyway: the feed resumes)
            await progress(log, tenant, job.job_id, 7, round=3)
            done = JobCompleted(outputs=["model_out/final.pt"])
            await log.append(job_subject(tenant, job.job_id, done), done)

    with Client(gateway_server.url, key) as rt:
        feed = rt.feed(job=job.job_id, after="jobs:0")
        asyncio.run(finish())
        kinds = []
        for message in feed:
            kinds.append(message.kind)
            if message.kind == "job.completed":
                break
        feed.close()
    assert kinds[-2:] == ["job.progress", "job.completed"]
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert "progress: epoch 1, round 3, step 7" in out and f"job {job.job_id} completed" in out
