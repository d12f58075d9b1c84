"""Bodies of the workspace routes: presigned uploads (single PUT or multipart), downloads, listing.

No object bytes pass through the gateway: every response that moves data carries presigned URLs of
the tenant's own bucket. Limits that only need the body are declared here (so that OpenAPI shows
them); limits that need the workspace layout or the upload plan are checked by the routes.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.api.common import Request

ObjectKey = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
"""An object key relative to the workspace root, e.g. ``jobs/mnist/shards/0.zip`` (the routes check
its characters and its place in the layout)."""
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
ContentType = Annotated[
    str,
    msgspec.Meta(
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*"
        r"(; ?[A-Za-z0-9_.-]+=[A-Za-z0-9_.-]+)*$",
    ),
]
"""A MIME type, optionally with parameters (``text/csv; charset=utf-8``); ASCII only."""
Size = Annotated[int, msgspec.Meta(ge=1)]
"""Bytes; an empty file cannot be uploaded (the 500 GB maximum is checked by the route: 413)."""
PartNumber = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
ETag = Annotated[str, msgspec.Meta(min_length=1, max_length=130, pattern=r'^"?[A-Za-z0-9-]+"?$')]


class TenantQuery(Request, frozen=True, kw_only=True):
    """``tenant``: only the operator names it (a tenant key always acts on its own workspace)."""

    tenant: str | None = None


class KeyQuery(TenantQuery, frozen=True, kw_only=True):
    """One object of the workspace."""

    key: ObjectKey


class ListObjectsQuery(TenantQuery, frozen=True, kw_only=True):
    """Objects whose key starts with ``prefix``, in key order, ``limit`` per page, after the cursor."""

    prefix: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    after: Annotated[str, msgspec.Meta(max_length=2048)] | None = None


class CreateUpload(Request, frozen=True, kw_only=True):
    """Start an upload of ``size`` bytes to ``key``.

    Attributes:
        key: where the object goes; it must lie in a writable part of the layout.
        size: the exact size in bytes; it is signed into every URL (send exactly these bytes).
        content_type: stored with the object and served back on download.
        sha256: hex digest of the whole file; kept as the object's ``sha256`` metadata and, for a
            single PUT, signed as ``x-amz-checksum-sha256`` so that an S3 server that checks it
            refuses corrupted bytes.
    """

    key: ObjectKey
    size: Size
    content_type: ContentType | None = None
    sha256: Sha256 | None = None


class PartsRequest(Request, frozen=True, kw_only=True):
    """More part URLs of a multipart upload: parts ``first`` .. ``first + count - 1`` (clipped to the
    last part; ``count`` defaults to 20, at most 1,000). ``key`` and ``size`` are the ones the upload
    was created with."""

    key: ObjectKey
    size: Size
    first: PartNumber = 1
    count: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20


class CompletedPart(Request, frozen=True, kw_only=True):
    """One uploaded part: its number and the ``ETag`` header its PUT answered (quotes optional)."""

    part_number: PartNumber
    etag: ETag


class CompleteUpload(Request, frozen=True, kw_only=True):
    """Every part of the upload, numbered 1..N in order, each with the ETag its PUT returned."""

    key: ObjectKey
    parts: Annotated[list[CompletedPart], msgspec.Meta(min_length=1, max_length=10_000)]


class PartUrl(msgspec.Struct, frozen=True, kw_only=True):
    """PUT exactly ``size`` bytes (part ``part_number`` of the file) to ``url``; keep the ``ETag``
    response header for the completion call."""

    part_number: int
    size: int
    url: str


class SingleUpload(msgspec.Struct, frozen=True, kw_only=True, tag="single", tag_field="kind"):
    """A file under 10 MB: one presigned PUT.

    Send ``PUT url`` with exactly ``size`` bytes, ``Content-Length: size`` (not chunked) and every
    header in ``headers``; the object exists as soon as the PUT answers 200.
    """

    key: str
    size: int
    method: Literal["PUT"] = "PUT"
    url: str
    headers: dict[str, str]
    expires_at: str


class MultipartUpload(msgspec.Struct, frozen=True, kw_only=True, tag="multipart", tag_field="kind"):
    """A file of 10 MB or more: a multipart plan.

    Every part but the last is ``part_size`` bytes. ``parts`` holds the URLs of the first parts;
    when ``next_part`` is set, ask ``POST /v1/workspace/uploads/{upload_id}/parts`` for the rest.
    Then complete (or abort) the upload.
    """

    key: str
    size: int
    upload_id: str
    part_size: int
    part_count: int
    parts: list[PartUrl]
    next_part: int | None = None
    expires_at: str


Upload = SingleUpload | MultipartUpload
"""What ``POST /v1/workspace/uploads`` answers, told apart by ``kind``."""


class PartUrls(msgspec.Struct, frozen=True, kw_only=True):
    """A page of part URLs; ``next_part`` is the first part not in this page (absent at the end)."""

    upload_id: str
    key: str
    part_count: int
    parts: list[PartUrl]
    next_part: int | None = None
    expires_at: str


class WorkspaceObject(msgspec.Struct, frozen=True, kw_only=True):
    """An object of the workspace. ``etag`` has no quotes; ``last_modified`` is ISO 8601 UTC."""

    key: str
    size: int
    etag: str
    last_modified: str


class Download(msgspec.Struct, frozen=True, kw_only=True):
    """A presigned GET of one object, valid one hour (``expires_at``); no auth header needed."""

    key: str
    method: Literal["GET"] = "GET"
    url: str
    size: int
    etag: str
    content_type: str
    sha256: str | None = None
    expires_at: str
