"""The SDK against a real served gateway and the real object store: typed results, API errors as
exceptions, uploads single and multipart (parallel, with progress, aborted on failure), downloads
checked by size and SHA-256."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from gateway import AsyncClient, Client
from gateway.client import ApiError, TransferError
from ops.objectstore import ObjectStoreServer
from tests.gateway.conftest import GatewayServer


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
