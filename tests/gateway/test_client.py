"""The SDK against a real served gateway and the real object store: typed results, API errors as
exceptions, uploads single and multipart (parallel, with progress, aborted on failure), downloads
checked by size and SHA-256."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from gateway import AsyncClient, Client
from gateway.client import ApiError, TransferError
from ops.objectstore import ObjectStoreServer
from schemas.jobs import JobCompleted
from tests.gateway.conftest import GatewayServer, ServeGateway
from tests.gateway.test_feed import progress, submit
from tests.support import REPO


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
        assert me.account == tenant
        stored = await rt.upload(big, "jobs/a/data.bin")
        assert stored.size == 11_000_000
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
            seen.append(message["seq"])
            await asyncio.sleep(0.01)  # slower than the gateway sends: it closes us with 4008
            if len(seen) == 2:
                appended += [await progress(log, tenant, "j1", step) for step in range(60, 120)]
            if len(seen) == len(appended):
                break
        await feed.aclose()
    assert seen == appended  # every event once, in order, across the reconnects


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
            kinds.append(message["kind"])
            if message["kind"] == "job.completed":
                break
        feed.close()
    assert kinds[-2:] == ["job.progress", "job.completed"]
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert "progress: epoch 1, round 3, step 7" in out and f"job {job.job_id} completed" in out
