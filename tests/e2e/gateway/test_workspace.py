"""The workspace: presigned uploads (single PUT and multipart) and downloads against the real object
store (``rclone serve s3``), the layout and its key rules, listing, isolation between tenants, auth.

The multipart plan's arithmetic (50 MB parts, 10,000 at 500 GB) is unit-tested on the pure function;
real multipart uploads run at 50 MB through the API and at S3's 5 MiB minimum through the same
functions the routes use.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from typing import Any

import httpx
import msgspec
import pytest
from botocore.exceptions import ClientError

from core.log import EventLog
from core.objects import bucket_for
from gateway import workspace as ws
from gateway.errors import ApiError
from gateway.paging import encode_cursor
from schemas.audit import RequestRecorded
from tests.support import records
from tests.support.gateway import Api

UPLOADS = "/v1/workspace/uploads"
GB = 1000 * ws.MB


async def upload_small(api: Api, key: str, member: str, data: bytes, **extra: Any) -> dict[str, Any]:
    """Upload ``data`` through a presigned PUT; returns the plan."""
    plan = await api.request("POST", UPLOADS, member, json={"key": key, "size": len(data), **extra})
    assert plan.status_code == 201, plan.text
    body: dict[str, Any] = plan.json()
    assert body["kind"] == "single"
    async with httpx.AsyncClient() as client:
        put = await client.put(body["url"], content=data, headers=body["headers"])
    assert put.status_code == 200, put.text
    return body


async def put_parts(parts: list[dict[str, Any]], data: bytes, part_size: int) -> list[dict[str, Any]]:
    """PUT each part's slice of ``data`` to its URL; the completion list."""
    done = []
    async with httpx.AsyncClient(timeout=60) as client:
        for part in parts:
            start = (part["part_number"] - 1) * part_size
            chunk = data[start : start + part["size"]]
            response = await client.put(part["url"], content=chunk)
            assert response.status_code == 200, response.text
            done.append({"part_number": part["part_number"], "etag": response.headers["etag"]})
    return done


async def fetch(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.get(url)


# ---------------------------------------------------------------------------------------------------
# Pure rules


def test_the_plan_cuts_50_mb_parts_and_stays_within_s3_limits() -> None:
    largest = ws.plan_parts(500 * GB)
    assert (largest.part_size, largest.count) == (50 * ws.MB, 10_000)
    assert largest.length(10_000) == 50 * ws.MB
    plan = ws.plan_parts(120 * ws.MB)
    assert (plan.count, [plan.length(n) for n in (1, 2, 3)]) == (3, [50 * ws.MB, 50 * ws.MB, 20 * ws.MB])
    assert ws.plan_parts(10 * ws.MB).count == 1
    odd = ws.plan_parts(123_456_789)
    assert sum(odd.length(n) for n in range(1, odd.count + 1)) == 123_456_789
    # at S3's 5 MiB minimum a 12 MB file has three parts, the last one short
    small = ws.plan_parts(12 * ws.MB, ws.MIN_PART)
    assert [small.length(n) for n in (1, 2, 3)] == [ws.MIN_PART, ws.MIN_PART, 12 * ws.MB - 2 * ws.MIN_PART]
    # a part size that would need more than 10,000 parts grows instead
    grown = ws.plan_parts(500 * GB, ws.MIN_PART)
    assert grown.count == 10_000 and grown.part_size == 50 * ws.MB
    with pytest.raises(ValueError, match="outside"):
        ws.plan_parts(100, 1024)
    with pytest.raises(ValueError, match="do not fit"):
        ws.plan_parts(ws.MAX_PARTS * ws.MAX_PART + 1)


@pytest.mark.parametrize(
    ("key", "status", "code"),
    [
        ("jobs/mnist/shards/0.zip", None, None),
        ("jobs/mnist/train.py", None, None),
        ("scripts/train.py", None, None),
        ("configs/fl/config_fed_server.json", None, None),
        ("models/qwen/model-00001-of-00002.safetensors", None, None),
        ("scripts/date=2024-01-01/.env", None, None),
        ("/scripts/x.py", 400, "invalid_key"),
        ("scripts/../x.py", 400, "invalid_key"),
        ("scripts//x.py", 400, "invalid_key"),
        ("scripts/./x.py", 400, "invalid_key"),
        ("scripts/", 400, "invalid_key"),
        ("scripts/a b.py", 400, "invalid_key"),
        ("scripts/naïve.py", 400, "invalid_key"),
        ("scripts/" + "x" * 256, 400, "invalid_key"),
        ("notes.txt", 400, "invalid_key"),
        ("scripts", 400, "invalid_key"),
        ("jobs/mnist", 400, "invalid_key"),
        ("data/x.csv", 400, "invalid_key"),
        ("model_out/final.pt", 403, "read_only_prefix"),
        ("files_out/metrics.json", 403, "read_only_prefix"),
        ("jobs/mnist/model_out/round-1.pt", 403, "read_only_prefix"),
        ("jobs/mnist/files_out/rounds.csv", 403, "read_only_prefix"),
    ],
)
def test_which_keys_tenants_may_upload(key: str, status: int | None, code: str | None) -> None:
    if status is None:
        ws.check_writable(key)
        return
    with pytest.raises(ApiError) as refused:
        ws.check_writable(key)
    assert (refused.value.status, refused.value.code) == (status, code)
    assert refused.value.message


def test_outputs_are_readable_keys_and_prefixes_may_be_partial() -> None:
    ws.check_key("model_out/final.pt")
    ws.check_key("anything/else.bin")
    for prefix in ("", "jobs/", "jobs/mn", "scripts/date=2024", "model_out/"):
        ws.check_prefix(prefix)
    for prefix in ("/jobs", "jobs//", "../", "jobs/../x", "a b"):
        with pytest.raises(ApiError) as refused:
            ws.check_prefix(prefix)
        assert refused.value.code == "invalid_prefix"


def test_the_completion_list_is_checked_against_the_stored_parts() -> None:
    assert ws.part_order_problem([1, 2, 3]) is None
    assert "entry 2 is part 3" in (ws.part_order_problem([1, 3]) or "")
    assert "entry 2 is part 1" in (ws.part_order_problem([1, 1]) or "")
    assert "entry 1 is part 2" in (ws.part_order_problem([2, 1]) or "")
    big = ws.MIN_PART
    stored = {1: ('"aa"', big), 2: ('"bb"', big), 3: ('"cc"', 10)}
    assert ws.completion_problems([(1, "aa"), (2, '"bb"'), (3, "cc")], stored) == []
    assert ws.completion_problems([(1, "aa"), (2, "zz"), (3, "cc")], stored) == [
        "part 2's ETag zz is not the stored part's (bb)"
    ]
    assert ws.completion_problems([(1, "aa"), (2, "bb")], stored) == [
        "parts [3] were uploaded but are not listed: list every part"
    ]
    assert ws.completion_problems([(1, "aa"), (2, "bb"), (3, "cc"), (4, "dd")], stored) == [
        "part 4 was not uploaded",
        "parts [3] are under 5 MiB: only the last part may be",
    ]
    tiny = {1: ('"aa"', 10), 2: ('"bb"', 10)}
    assert ws.completion_problems([(1, "aa"), (2, "bb")], tiny) == [
        "parts [1] are under 5 MiB: only the last part may be"
    ]


# ---------------------------------------------------------------------------------------------------
# Against the real object store


async def test_a_small_file_goes_up_by_presigned_put_and_comes_back_by_presigned_get(api: Api) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    data = b"print('hello from the workspace')\n"
    digest = hashlib.sha256(data).hexdigest()
    plan = await upload_small(
        api, "scripts/hello.py", member, data, content_type="text/x-python", sha256=digest
    )
    assert plan["url"].startswith(api.kernel.settings.s3_endpoint + f"/rt-{tenant}/scripts/hello.py?")
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in plan["url"] and "X-Amz-Expires=900" in plan["url"]
    assert plan["headers"] == {
        "Content-Type": "text/x-python",
        "x-amz-meta-sha256": digest,
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
    }
    download = await api.request("GET", "/v1/workspace/download", member, params={"key": "scripts/hello.py"})
    assert download.status_code == 200, download.text
    body = download.json()
    assert (body["size"], body["sha256"], body["content_type"]) == (len(data), digest, "text/x-python")
    assert body["etag"] == hashlib.md5(data).hexdigest()
    assert "X-Amz-Expires=3600" in body["url"]
    got = await fetch(body["url"])
    assert got.status_code == 200 and got.content == data
    listed = (await api.request("GET", "/v1/workspace/objects", member)).json()
    assert [(o["key"], o["size"], o["etag"]) for o in listed["items"]] == [
        ("scripts/hello.py", len(data), body["etag"])
    ]
    assert listed["items"][0]["last_modified"].endswith("Z")


async def test_the_size_is_signed_so_a_put_of_other_bytes_is_refused(api: Api) -> None:
    _, member = await api.tenant()
    plan = (await api.request("POST", UPLOADS, member, json={"key": "configs/a.json", "size": 5})).json()
    async with httpx.AsyncClient() as client:
        longer = await client.put(plan["url"], content=b"123456")
    assert longer.status_code == 403 and "SignatureDoesNotMatch" in longer.text
    missing = await api.request("GET", "/v1/workspace/download", member, params={"key": "configs/a.json"})
    assert missing.status_code == 404


async def test_a_52_mb_file_goes_up_in_two_50_mb_plan_parts(api: Api) -> None:
    _, member = await api.tenant()
    data = os.urandom(52 * ws.MB)
    key = "jobs/llama/shards/0.zip"
    created = await api.request("POST", UPLOADS, member, json={"key": key, "size": len(data)})
    assert created.status_code == 201, created.text
    plan = created.json()
    assert plan["kind"] == "multipart"
    assert (plan["part_size"], plan["part_count"], plan["next_part"]) == (50 * ws.MB, 2, None)
    assert [(p["part_number"], p["size"]) for p in plan["parts"]] == [(1, 50 * ws.MB), (2, 2 * ws.MB)]
    parts = await put_parts(plan["parts"], data, plan["part_size"])
    done = await api.request(
        "POST", f"{UPLOADS}/{plan['upload_id']}/complete", member, json={"key": key, "parts": parts}
    )
    assert done.status_code == 200, done.text
    assert done.json()["key"] == key and done.json()["size"] == len(data)
    listed = (
        await api.request("GET", "/v1/workspace/objects", member, params={"prefix": "jobs/llama/"})
    ).json()
    assert [(o["key"], o["size"]) for o in listed["items"]] == [(key, len(data))]
    url = (await api.request("GET", "/v1/workspace/download", member, params={"key": key})).json()["url"]
    got = await fetch(url)
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(data).digest()


async def test_a_multipart_upload_at_the_s3_minimum_part_size(api: Api) -> None:
    """The routes' own functions, with 5 MiB parts: three parts, the last one short."""
    tenant, _ = await api.tenant()
    s3, bucket, key = api.kernel.s3, bucket_for(tenant), "jobs/mnist/shards/1.zip"
    data = os.urandom(12 * ws.MB)
    plan = ws.plan_parts(len(data), ws.MIN_PART)
    upload_id = ws.start_multipart(s3, bucket, key, "application/zip", None)
    first, next_part, _ = ws.presign_parts(s3, bucket, key, upload_id, plan, 1, 2)
    assert next_part == 3
    rest, next_part, _ = ws.presign_parts(s3, bucket, key, upload_id, plan, 3, 100)
    assert next_part is None
    parts = await put_parts([msgspec.structs.asdict(p) for p in first + rest], data, plan.part_size)
    listed = [(p["part_number"], p["etag"]) for p in parts]
    assert ws.completion_problems(listed, ws.uploaded_parts(s3, bucket, key, upload_id)) == []
    ws.complete(s3, bucket, key, upload_id, listed)
    stored = s3.get_object(Bucket=bucket, Key=key)
    assert stored["Body"].read() == data
    assert stored["ContentType"] == "application/zip"


async def test_a_500_gb_plan_hands_out_part_urls_in_pages(api: Api) -> None:
    _, member = await api.tenant()
    key = "models/huge/weights.bin"
    created = await api.request("POST", UPLOADS, member, json={"key": key, "size": 500 * GB})
    assert created.status_code == 201, created.text
    plan = created.json()
    assert (plan["part_count"], len(plan["parts"]), plan["next_part"]) == (10_000, ws.FIRST_PAGE, 21)
    upload_id = plan["upload_id"]
    page = await api.request(
        "POST",
        f"{UPLOADS}/{upload_id}/parts",
        member,
        json={"key": key, "size": 500 * GB, "first": 9_990, "count": 50},
    )
    assert page.status_code == 200, page.text
    body = page.json()
    assert [p["part_number"] for p in body["parts"]] == list(range(9_990, 10_001))
    assert body["next_part"] is None and body["parts"][-1]["size"] == 50 * ws.MB
    assert (
        "partNumber=10000" in body["parts"][-1]["url"] and f"uploadId={upload_id}" in body["parts"][-1]["url"]
    )
    beyond = await api.request(
        "POST", f"{UPLOADS}/{upload_id}/parts", member, json={"key": key, "size": 500 * GB, "first": 10_001}
    )
    assert beyond.status_code == 400
    too_many = await api.request(
        "POST", f"{UPLOADS}/{upload_id}/parts", member, json={"key": key, "size": 500 * GB, "count": 1001}
    )
    assert too_many.status_code == 400 and "count" in too_many.json()["error"]["message"]
    oversized = await api.request(
        "POST", f"{UPLOADS}/{upload_id}/parts", member, json={"key": key, "size": 500 * GB + 1}
    )
    assert oversized.status_code == 413
    unknown = await api.request(
        "POST", f"{UPLOADS}/no-such-upload/parts", member, json={"key": key, "size": 500 * GB}
    )
    assert unknown.status_code == 404
    aborted = await api.request("DELETE", f"{UPLOADS}/{upload_id}", member, params={"key": key})
    assert aborted.status_code == 204


async def test_over_500_gb_is_refused_and_nothing_is_recorded(api: Api, log: EventLog) -> None:
    _, member = await api.tenant()
    audit_before = await log.last_seq("AUDIT")
    refused = await api.request("POST", UPLOADS, member, json={"key": "models/x.bin", "size": 500 * GB + 1})
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "upload_too_large"
    assert "500 GB" in refused.json()["error"]["message"]
    assert await log.last_seq("AUDIT") == audit_before


async def test_an_aborted_upload_is_gone(api: Api) -> None:
    tenant, member = await api.tenant()
    key = "jobs/mnist/shards/2.zip"
    plan = (await api.request("POST", UPLOADS, member, json={"key": key, "size": 12 * ws.MB})).json()
    assert plan["kind"] == "multipart" and plan["part_count"] == 1
    parts = await put_parts(plan["parts"], os.urandom(12 * ws.MB), plan["part_size"])
    upload = f"{UPLOADS}/{plan['upload_id']}"
    assert (await api.request("DELETE", upload, member, params={"key": key})).status_code == 204
    with pytest.raises(ClientError, match="NoSuchUpload"):
        api.kernel.s3.list_parts(Bucket=bucket_for(tenant), Key=key, UploadId=plan["upload_id"])
    complete = await api.request("POST", f"{upload}/complete", member, json={"key": key, "parts": parts})
    assert complete.status_code == 404
    assert "completed or aborted" in complete.json()["error"]["message"]
    assert (await api.request("DELETE", upload, member, params={"key": key})).status_code == 404
    listed = (await api.request("GET", "/v1/workspace/objects", member)).json()
    assert listed["items"] == []


async def test_a_bad_completion_is_refused_and_the_upload_survives_it(api: Api) -> None:
    """rclone drops an upload whose completion it refuses; the gateway checks first, so it never does."""
    _, member = await api.tenant()
    key = "jobs/mnist/shards/3.zip"
    data = os.urandom(12 * ws.MB)
    plan = (await api.request("POST", UPLOADS, member, json={"key": key, "size": len(data)})).json()
    parts = await put_parts(plan["parts"], data, plan["part_size"])
    complete = f"{UPLOADS}/{plan['upload_id']}/complete"
    etag = parts[0]["etag"]
    cases = [
        ([{"part_number": 2, "etag": etag}], "entry 1 is part 2"),
        ([{"part_number": 1, "etag": etag}, {"part_number": 1, "etag": etag}], "entry 2 is part 1"),
        ([{"part_number": 1, "etag": '"' + "0" * 32 + '"'}], "is not the stored part's"),
        ([{"part_number": 1, "etag": etag}, {"part_number": 2, "etag": etag}], "part 2 was not uploaded"),
    ]
    for listed, message in cases:
        refused = await api.request("POST", complete, member, json={"key": key, "parts": listed})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "invalid_parts"
        assert message in refused.json()["error"]["message"]
    for body in ({"key": key, "parts": []}, {"key": key, "parts": [{"part_number": 0, "etag": etag}]}):
        assert (await api.request("POST", complete, member, json=body)).status_code == 400
    done = await api.request("POST", complete, member, json={"key": key, "parts": parts})
    assert done.status_code == 200, done.text
    assert done.json()["size"] == len(data)


async def test_expired_presigned_urls_are_refused_by_the_store(api: Api) -> None:
    tenant, member = await api.tenant()
    await upload_small(api, "configs/ok.json", member, b"{}")
    s3, bucket = api.kernel.s3, bucket_for(tenant)
    put_url, _, _ = ws.presign_put(s3, bucket, "configs/late.json", size=2, expires_s=1)
    get_url, _ = ws.presign_get(s3, bucket, "configs/ok.json", expires_s=1)
    await asyncio.sleep(2.5)
    async with httpx.AsyncClient() as client:
        late_put = await client.put(put_url, content=b"{}")
        late_get = await client.get(get_url)
    # rclone answers 400 AccessDenied ("...exceeds the maximum allowed"); AWS S3 answers 403
    for late in (late_put, late_get):
        assert late.status_code in (400, 403) and "AccessDenied" in late.text, late.text
    gone = await api.request("GET", "/v1/workspace/download", member, params={"key": "configs/late.json"})
    assert gone.status_code == 404


async def test_a_tenant_never_reaches_another_tenants_workspace(api: Api) -> None:
    a, a_key = await api.tenant()
    _, b_key = await api.tenant()
    await upload_small(api, "scripts/secret.py", a_key, b"A's code")
    key = "jobs/a-job/shards/0.zip"
    plan = (await api.request("POST", UPLOADS, a_key, json={"key": key, "size": 11 * ws.MB})).json()
    parts = await put_parts(plan["parts"], os.urandom(11 * ws.MB), plan["part_size"])
    upload = f"{UPLOADS}/{plan['upload_id']}"
    # B names A's key and A's upload id: the calls target B's bucket, where neither exists
    for method, path, kwargs in [
        ("GET", "/v1/workspace/download", {"params": {"key": "scripts/secret.py"}}),
        ("DELETE", "/v1/workspace/objects", {"params": {"key": "scripts/secret.py"}}),
        ("POST", f"{upload}/complete", {"json": {"key": key, "parts": parts}}),
        ("POST", f"{upload}/parts", {"json": {"key": key, "size": 11 * ws.MB}}),
        ("DELETE", upload, {"params": {"key": key}}),
        ("GET", "/v1/workspace/objects", {"params": {"tenant": a}}),
    ]:
        response = await api.request(method, path, b_key, **kwargs)
        assert response.status_code == 404, (method, path, response.text)
    assert (await api.request("GET", "/v1/workspace/objects", b_key)).json()["items"] == []
    # A's upload is intact and completes
    done = await api.request("POST", f"{upload}/complete", a_key, json={"key": key, "parts": parts})
    assert done.status_code == 200, done.text
    # the operator must name the tenant
    anonymous = await api.request("GET", "/v1/workspace/objects", api.operator_key)
    assert anonymous.status_code == 400 and anonymous.json()["error"]["code"] == "tenant_required"
    named = await api.request("GET", "/v1/workspace/objects", api.operator_key, params={"tenant": a})
    assert [o["key"] for o in named.json()["items"]] == [key, "scripts/secret.py"]
    nobody = await api.request("GET", "/v1/workspace/objects", api.operator_key, params={"tenant": "nobody"})
    assert nobody.status_code == 404


async def test_auth_is_required_and_viewers_only_read(api: Api) -> None:
    tenant, admin = await api.tenant()
    viewer = await api.key(tenant, admin, "viewer")
    await upload_small(api, "scripts/x.py", admin, b"x = 1\n")
    routes: list[tuple[str, str, dict[str, Any], bool]] = [
        ("POST", UPLOADS, {"json": {"key": "scripts/y.py", "size": 3}}, True),
        ("POST", f"{UPLOADS}/u1/parts", {"json": {"key": "scripts/y.py", "size": 20 * ws.MB}}, True),
        ("POST", f"{UPLOADS}/u1/complete", {"json": {"key": "scripts/y.py", "parts": []}}, True),
        ("DELETE", f"{UPLOADS}/u1", {"params": {"key": "scripts/y.py"}}, True),
        ("DELETE", "/v1/workspace/objects", {"params": {"key": "scripts/x.py"}}, True),
        ("GET", "/v1/workspace/objects", {}, False),
        ("GET", "/v1/workspace/download", {"params": {"key": "scripts/x.py"}}, False),
    ]
    for method, path, kwargs, writes in routes:
        anonymous = await api.request(method, path, **kwargs)
        assert anonymous.status_code == 401, (method, path)
        bogus = await api.request(method, path, "rt_000000000000_" + "x" * 40, **kwargs)
        assert bogus.status_code == 401, (method, path)
        as_viewer = await api.request(method, path, viewer, **kwargs)
        assert as_viewer.status_code == (403 if writes else 200), (method, path, as_viewer.text)
        if writes:
            assert "member" in as_viewer.json()["error"]["message"]


async def test_listing_pages_with_a_cursor_and_refuses_a_bad_one(api: Api) -> None:
    tenant, member = await api.tenant()
    s3, bucket = api.kernel.s3, bucket_for(tenant)
    keys = [f"jobs/mnist/shards/{i}.zip" for i in range(5)] + ["scripts/train.py"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        params = {"prefix": "jobs/mnist/", "limit": 2} | ({"after": after} if after else {})
        page = (await api.request("GET", "/v1/workspace/objects", member, params=params)).json()
        seen += [o["key"] for o in page["items"]]
        pages += 1
        after = page.get("next")
        if after is None:
            break
    assert (seen, pages) == (keys[:5], 3)
    everything = (await api.request("GET", "/v1/workspace/objects", member, params={"limit": 1000})).json()
    assert [o["key"] for o in everything["items"]] == keys and everything.get("next") is None
    partial = (await api.request("GET", "/v1/workspace/objects", member, params={"prefix": "scr"})).json()
    assert [o["key"] for o in partial["items"]] == ["scripts/train.py"]
    outside = encode_cursor(ws.CURSOR_SCOPE, "scripts/train.py")
    for params in (
        {"after": "!!not a cursor!!"},
        {"after": base64.urlsafe_b64encode(b"\xff\xfe").decode()},
        {"after": encode_cursor(ws.CURSOR_SCOPE, "../etc/passwd")},
        {"prefix": "jobs/", "after": outside},
        {"limit": 0},
        {"limit": 1001},
        {"limit": "many"},
        {"prefix": "/jobs"},
        {"surprise": "1"},
    ):
        refused = await api.request("GET", "/v1/workspace/objects", member, params=params)
        assert refused.status_code == 400, (params, refused.text)
        assert refused.json()["error"]["message"]


async def test_bad_upload_requests_are_4xx_and_record_nothing(api: Api, log: EventLog) -> None:
    _, member = await api.tenant()
    audit_before = await log.last_seq("AUDIT")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"key": "/scripts/x.py", "size": 1}, 400, "leading '/'"),
        ({"key": "scripts/../../x", "size": 1}, 400, "'..'"),
        ({"key": "notes.txt", "size": 1}, 400, "layout"),
        ({"key": "model_out/final.pt", "size": 1}, 403, "only jobs write"),
        ({"key": "scripts/x.py", "size": 0}, 400, "size"),
        ({"key": "scripts/x.py", "size": -5}, 400, "size"),
        ({"key": "scripts/x.py", "size": "big"}, 400, "size"),
        ({"key": "x" * 1025, "size": 1}, 400, "key"),
        ({"key": "scripts/x.py", "size": 2**70}, 413, "500 GB"),
        ({"key": "scripts/x.py", "size": 1, "sha256": "xyz"}, 400, "sha256"),
        ({"key": "scripts/x.py", "size": 1, "content_type": "text/plain\r\nx: y"}, 400, "content_type"),
        ({"key": "scripts/x.py", "size": 1, "acl": "public-read"}, 400, "acl"),
    ]
    for body, status, words in cases:
        response = await api.request("POST", UPLOADS, member, json=body)
        assert response.status_code == status, (body, response.text)
        assert words in response.json()["error"]["message"], (body, response.text)
    one_part = {"key": "scripts/x.py", "parts": [{"part_number": 1, "etag": "abc"}]}
    bad_id = await api.request("POST", f"{UPLOADS}/bad%20id/complete", member, json=one_part)
    assert bad_id.status_code == 400 and bad_id.json()["error"]["code"] == "invalid_upload_id"
    for params in ({"key": "../x"}, {"key": "scripts/"}, {}):
        assert (await api.request("GET", "/v1/workspace/download", member, params=params)).status_code == 400
    assert await log.last_seq("AUDIT") == audit_before


async def test_delete_removes_an_object_and_is_recorded(api: Api, log: EventLog) -> None:
    _, member = await api.tenant()
    await upload_small(api, "configs/run.toml", member, b"rounds = 3\n")
    deleted = await api.request("DELETE", "/v1/workspace/objects", member, params={"key": "configs/run.toml"})
    assert deleted.status_code == 204
    for method in ("GET", "DELETE"):
        path = "/v1/workspace/download" if method == "GET" else "/v1/workspace/objects"
        again = await api.request(method, path, member, params={"key": "configs/run.toml"})
        assert again.status_code == 404 and "configs/run.toml" in again.json()["error"]["message"]
    audit = [r.event for r in await records(log, "AUDIT") if isinstance(r.event, RequestRecorded)]
    workspace = [(e.method, e.route, e.resource) for e in audit if "workspace" in e.route]
    assert workspace == [
        ("POST", "/v1/workspace/uploads", "configs/run.toml"),
        ("DELETE", "/v1/workspace/objects", "configs/run.toml"),
    ]


async def test_the_workspace_routes_are_in_the_openapi_document(api: Api) -> None:
    doc = (await api.request("GET", "/openapi.json")).json()
    paths = doc["paths"]
    for path in (
        "/v1/workspace/uploads",
        "/v1/workspace/uploads/{upload_id}/parts",
        "/v1/workspace/uploads/{upload_id}/complete",
        "/v1/workspace/uploads/{upload_id}",
        "/v1/workspace/objects",
        "/v1/workspace/download",
    ):
        assert path in paths, path
    created = paths["/v1/workspace/uploads"]["post"]["responses"]["201"]["content"]["application/json"]
    assert created["schema"]["discriminator"]["propertyName"] == "kind"
    assert "413" in paths["/v1/workspace/uploads"]["post"]["responses"]
