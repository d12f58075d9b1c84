"""The tenant's workspace: presigned uploads (single PUT or multipart), downloads, listing, deletion.

No object bytes pass through the gateway. Every route acts on the bucket of the caller's own tenant
(the operator names one with ``?tenant=``), so an upload id or key of another tenant is simply not
found there. The rules (layout, sizes, the multipart plan) live in :mod:`gateway.workspace`.
"""

from __future__ import annotations

from typing import Any

from gateway import workspace as ws
from gateway.api import Call, Router
from gateway.bodies import carried
from gateway.errors import ApiError
from gateway.paging import encode_cursor
from gateway.scope import scoped_tenant
from projections import TENANTS
from projections.tenants import TenantsState
from schemas.api.common import Page
from schemas.api.workspace import (
    CompleteUpload,
    CreateUpload,
    Download,
    KeyQuery,
    ListObjectsQuery,
    MultipartUpload,
    PartsRequest,
    PartUrls,
    SingleUpload,
    TenantQuery,
    Upload,
    WorkspaceObject,
)

router = Router("workspace")
UPLOAD_ERRORS = {
    403: "the key is in a job-output folder (files_out/, model_out/), which only jobs write",
    413: "the file is over the 500 GB maximum",
}


def bucket_of(call: Call[Any, Any]) -> str:
    """The caller's tenant's bucket (the operator's named tenant); 404 for an unknown tenant."""
    state: TenantsState = call.kernel.state(TENANTS)
    return state.tenants[scoped_tenant(call, call.query.tenant)].bucket


def upload_missing(upload_id: str, key: str) -> str:
    return f"upload {upload_id} of {key!r} not found: it was completed or aborted, or is not for this key"


async def part_urls(
    call: Call[Any, Any], bucket: str, key: str, upload_id: str, plan: ws.PartPlan, first: int, count: int
) -> PartUrls:
    """Presigned PUTs of parts ``first`` .. ``first + count - 1`` of an upload (clipped to its plan)."""
    missing = upload_missing(upload_id, key)
    parts, next_part, expires_at = await ws.s3_call(
        ws.presign_parts, call.kernel.s3, bucket, key, upload_id, plan, first, count, missing=missing
    )
    return PartUrls(
        upload_id=upload_id,
        key=key,
        part_count=plan.count,
        parts=parts,
        next_part=next_part,
        expires_at=expires_at,
    )


@router.post(
    "/v1/workspace/uploads",
    role="member",
    body=CreateUpload,
    query=TenantQuery,
    response=Upload,
    status=201,
    errors=UPLOAD_ERRORS,
)
async def create_upload(call: Call[CreateUpload, TenantQuery]) -> Upload:
    """Start an upload: one presigned PUT under 10 MB, else a multipart plan of 50 MB parts."""
    body = call.body
    ws.check_writable(body.key)
    ws.check_size(body.size)
    bucket = bucket_of(call)
    call.resource = body.key
    s3 = call.kernel.s3
    if body.size < ws.SINGLE_PUT_BELOW:
        url, headers, expires_at = ws.presign_put(
            s3, bucket, body.key, size=body.size, content_type=body.content_type, sha256=body.sha256
        )
        return SingleUpload(key=body.key, size=body.size, url=url, headers=headers, expires_at=expires_at)
    plan = ws.plan_parts(body.size)
    upload_id = await ws.s3_call(ws.start_multipart, s3, bucket, body.key, body.content_type, body.sha256)
    urls = await part_urls(call, bucket, body.key, upload_id, plan, 1, ws.FIRST_PAGE)
    return carried(MultipartUpload, urls, size=body.size, part_size=plan.part_size)


@router.post(
    "/v1/workspace/uploads/{upload_id}/parts",
    role="member",
    body=PartsRequest,
    query=TenantQuery,
    response=PartUrls,
    errors={**UPLOAD_ERRORS, 404: "no such upload of this key in the caller's workspace"},
)
async def upload_parts(call: Call[PartsRequest, TenantQuery]) -> PartUrls:
    """Presigned PUTs of more parts of a multipart upload (fresh URLs, valid 15 minutes)."""
    body, upload_id = call.body, call.params["upload_id"]
    ws.check_upload_id(upload_id)
    ws.check_writable(body.key)
    ws.check_size(body.size)
    plan = ws.plan_parts(body.size)
    if body.first > plan.count:
        raise ApiError(
            400, "invalid_part_range", f"an upload of {body.size:,} bytes has parts 1..{plan.count}"
        )
    bucket = bucket_of(call)
    call.resource = body.key
    missing = upload_missing(upload_id, body.key)
    s3 = call.kernel.s3
    await ws.s3_call(
        s3.list_parts, Bucket=bucket, Key=body.key, UploadId=upload_id, MaxParts=1, missing=missing
    )
    return await part_urls(call, bucket, body.key, upload_id, plan, body.first, body.count)


@router.post(
    "/v1/workspace/uploads/{upload_id}/complete",
    role="member",
    body=CompleteUpload,
    query=TenantQuery,
    response=WorkspaceObject,
    errors={404: "no such upload of this key in the caller's workspace"},
)
async def complete_upload(call: Call[CompleteUpload, TenantQuery]) -> WorkspaceObject:
    """Assemble the uploaded parts into the object (every part listed, in order, with its ETag)."""
    body, upload_id = call.body, call.params["upload_id"]
    ws.check_upload_id(upload_id)
    ws.check_writable(body.key)
    listed = [(p.part_number, p.etag) for p in body.parts]
    problem = ws.part_order_problem([n for n, _ in listed])
    if problem is not None:
        raise ApiError(400, "invalid_parts", problem)
    bucket = bucket_of(call)
    call.resource = body.key
    s3 = call.kernel.s3
    missing = upload_missing(upload_id, body.key)
    uploaded = await ws.s3_call(ws.uploaded_parts, s3, bucket, body.key, upload_id, missing=missing)
    problems = ws.completion_problems(listed, uploaded)
    if problems:
        raise ApiError(400, "invalid_parts", "; ".join(problems))
    await ws.s3_call(ws.complete, s3, bucket, body.key, upload_id, listed, missing=missing)
    stored = await ws.s3_call(ws.head, s3, bucket, body.key, missing=f"object {body.key!r} not found")
    return ws.describe(body.key, stored)


@router.delete(
    "/v1/workspace/uploads/{upload_id}",
    role="member",
    query=KeyQuery,
    status=204,
    errors={404: "no such upload of this key in the caller's workspace"},
)
async def abort_upload(call: Call[None, KeyQuery]) -> None:
    """Abort a multipart upload: the store drops its parts (``?key=`` names the upload's key)."""
    upload_id, key = call.params["upload_id"], call.query.key
    ws.check_upload_id(upload_id)
    ws.check_key(key)
    bucket = bucket_of(call)
    await ws.s3_call(ws.abort, call.kernel.s3, bucket, key, upload_id, missing=upload_missing(upload_id, key))
    call.resource = key


@router.get("/v1/workspace/objects", query=ListObjectsQuery, response=Page[WorkspaceObject])
async def list_objects(call: Call[None, ListObjectsQuery]) -> Page[WorkspaceObject]:
    """The workspace's objects under ``prefix``, in key order, with a cursor to the next page."""
    query = call.query
    ws.check_prefix(query.prefix)
    after = ws.key_after(query.after, query.prefix) if query.after is not None else None
    bucket = bucket_of(call)
    items, more = await ws.s3_call(ws.list_page, call.kernel.s3, bucket, query.prefix, query.limit, after)
    return Page(items=items, next=encode_cursor(ws.CURSOR_SCOPE, items[-1].key) if more else None)


@router.get(
    "/v1/workspace/download",
    query=KeyQuery,
    response=Download,
    errors={404: "no such object in the caller's workspace"},
)
async def download(call: Call[None, KeyQuery]) -> Download:
    """A presigned GET of one object, valid one hour."""
    key = call.query.key
    ws.check_key(key)
    bucket = bucket_of(call)
    stored = await ws.s3_call(ws.head, call.kernel.s3, bucket, key, missing=f"object {key!r} not found")
    url, expires_at = ws.presign_get(call.kernel.s3, bucket, key)
    described = ws.describe(key, stored)
    return Download(
        key=key,
        url=url,
        size=described.size,
        etag=described.etag,
        content_type=str(stored.get("ContentType", "application/octet-stream")),
        sha256=ws.sha256_of(stored),
        expires_at=expires_at,
    )


@router.delete(
    "/v1/workspace/objects",
    role="member",
    query=KeyQuery,
    status=204,
    errors={404: "no such object in the caller's workspace"},
)
async def delete_object(call: Call[None, KeyQuery]) -> None:
    """Delete one object (job outputs included)."""
    key = call.query.key
    ws.check_key(key)
    bucket = bucket_of(call)
    missing = f"object {key!r} not found"
    await ws.s3_call(ws.head, call.kernel.s3, bucket, key, missing=missing)
    await ws.s3_call(ws.delete, call.kernel.s3, bucket, key, missing=missing)
    call.kernel.seen_objects.forget(bucket, key)
    call.resource = key
