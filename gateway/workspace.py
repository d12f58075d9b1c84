"""Each tenant's workspace: a private bucket in the object store, reached only through presigned URLs.

The layout, and who writes where:

==============================================  ===================================  =======  ====
prefix                                          holds                                tenant   jobs
==============================================  ===================================  =======  ====
``jobs/{name}/...`` (``jobs/{name}/shards/``)   a job's inputs                       upload   read
``jobs/{name}/model_out/``, ``.../files_out/``  one job's outputs                    -        write
``scripts/``, ``configs/``                      training code and its configuration  upload   read
``models/``                                     weights an endpoint can serve        upload   read
``model_out/``, ``files_out/``                  final models, per-round metrics      -        write
``.../model_out/``, ``.../files_out/``          the outputs of a job's output_prefix -        write
==============================================  ===================================  =======  ====

A tenant lists, downloads and deletes anywhere in its workspace, but cannot upload into an output
folder: what a job's completion event names is what the job wrote. An output folder is any folder
named ``model_out`` or ``files_out``, at any depth: a job writes its outputs to
``{output_prefix}model_out/`` and ``{output_prefix}files_out/`` (``jobs/{name}/`` by default), and
``output_prefix`` may be any prefix, ``scripts/run-1/`` or ``models/mine/`` included, where tenants
do upload. The rule is on the folder's name rather than on the submitted prefixes so that it holds
for every job at once, past and future, with nothing to look up.

Sizes are decimal (1 MB = 10**6 bytes): 500 GB in 50 MB parts is exactly S3's 10,000-part maximum.
The size is signed into every presigned PUT (``Content-Length``), so no part, and no upload, can be
larger than planned.

The pure rules (keys, plan, part checks) come first; then the blocking boto3 calls, which the routes
run through :func:`s3_call` (a worker thread, S3 errors as API errors).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from gateway.errors import ApiError
from gateway.paging import decode_cursor
from schemas.api.workspace import PartUrl, WorkspaceObject

MB = 1_000_000
SINGLE_PUT_BELOW = 10 * MB
"""Files smaller than this get one presigned PUT; larger ones a multipart plan."""
PART_SIZE = 50 * MB
MAX_UPLOAD = 500_000 * MB
MAX_PARTS = 10_000
MIN_PART = 5 * 1024 * 1024
"""S3's smallest part (every part but the last)."""
MAX_PART = 5 * 1024**3
UPLOAD_URL_TTL_S = 15 * 60
DOWNLOAD_URL_TTL_S = 60 * 60
FIRST_PAGE = 20
"""Part URLs in the plan itself (1 GB at 50 MB parts); ask for the rest as the upload goes on, so that
no URL sits unused until it expires."""
WRITABLE_ROOTS = ("jobs", "scripts", "configs", "models")
OUTPUT_DIRS = ("files_out", "model_out")
_SEGMENT = re.compile(r"^[A-Za-z0-9._=-]+$")
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9._~=+-]{1,1024}$")
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------
# Keys and the layout


def _path_problem(path: str, what: str) -> str | None:
    """Why ``path`` (a key, or a prefix when it ends with ``/``) is malformed, or ``None``."""
    if path.startswith("/"):
        return f"{what} must be relative to the workspace: drop the leading '/'"
    segments = path.split("/")
    if path.endswith("/"):
        segments.pop()
    for segment in segments:
        if segment in ("", ".", ".."):
            return f"{what} {path!r} has an empty, '.' or '..' path segment"
        if len(segment) > 255:
            return f"{what} {path!r} has a path segment over 255 characters"
        if not _SEGMENT.match(segment):
            return (
                f"{what} {path!r} may only use letters, digits, '.', '_', '-', '=' and '/' between segments"
            )
    return None


def check_key(key: str) -> None:
    """400 unless ``key`` is a well-formed object key (any place in the workspace)."""
    problem = _path_problem(key, "key")
    if problem is None and key.endswith("/"):
        problem = f"key {key!r} ends with '/': name a file, not a folder"
    if problem is not None:
        raise ApiError(400, "invalid_key", problem)


def output_folder(key: str) -> str | None:
    """The job-output folder ``key`` lies in (the prefix up to its first ``model_out/`` or
    ``files_out/`` folder, at any depth), or ``None``."""
    segments = key.split("/")
    for depth, segment in enumerate(segments[:-1]):
        if segment in OUTPUT_DIRS:
            return "/".join(segments[: depth + 1]) + "/"
    return None


def check_writable(key: str) -> None:
    """400 unless ``key`` lies in the layout; 403 when it lies in a job-output folder
    (:func:`output_folder`)."""
    check_key(key)
    segments = key.split("/")
    root = segments[0]
    folder = output_folder(key)
    if folder is not None:
        raise ApiError(
            403,
            "read_only_prefix",
            f"{key!r} is in a job-output folder ({folder}), which only jobs write; a folder named "
            "model_out or files_out is read-only anywhere in the workspace: upload inputs elsewhere "
            "under jobs/{name}/, scripts/, configs/ or models/",
        )
    needed = 3 if root == "jobs" else 2
    if root not in WRITABLE_ROOTS or len(segments) < needed:
        raise ApiError(
            400,
            "invalid_key",
            f"key {key!r} is outside the workspace layout: upload to jobs/{{name}}/<file>, "
            "scripts/<file>, configs/<file> or models/<file>",
        )


def check_prefix(prefix: str) -> None:
    """400 unless ``prefix`` could start a well-formed key (its last segment may be partial: ``jobs/mn``)."""
    folders, _, partial = prefix.rpartition("/")
    problem = _path_problem(folders + "/", "prefix") if folders or prefix.startswith("/") else None
    if problem is None and partial and not _SEGMENT.match(partial):
        problem = f"prefix {prefix!r} may only use letters, digits, '.', '_', '-', '=' and '/'"
    if problem is not None:
        raise ApiError(400, "invalid_prefix", problem)


def check_upload_id(upload_id: str) -> None:
    if not _UPLOAD_ID.match(upload_id):
        raise ApiError(400, "invalid_upload_id", "upload_id is not one this API issued")


def check_size(size: int) -> None:
    """413 above the 500 GB maximum."""
    if size > MAX_UPLOAD:
        raise ApiError(
            413,
            "upload_too_large",
            f"size {size:,} bytes is over the {MAX_UPLOAD:,}-byte (500 GB) maximum; split the file",
        )


CURSOR_SCOPE = "objects"
"""The listing's cursors are :mod:`gateway.paging`'s, of this list, positioned at an object key."""


def key_after(cursor: str, prefix: str) -> str:
    """The last key of the previous page of the listing of ``prefix``; 400 for a cursor this listing
    did not issue (another list's, a key outside the prefix, a key that is no key)."""
    key = decode_cursor(CURSOR_SCOPE, cursor)
    if _path_problem(key, "key") is not None or not key.startswith(prefix):
        raise ApiError(
            400,
            "invalid_cursor",
            "'after' is not a cursor of this listing (pass the 'next' of the previous page, with the "
            "same prefix), or list again without it",
        )
    return key


# ---------------------------------------------------------------------------------------------------
# The multipart plan


@dataclass(frozen=True)
class PartPlan:
    """How a file of ``size`` bytes is cut: ``count`` parts of ``part_size``, the last one shorter."""

    size: int
    part_size: int
    count: int

    def length(self, number: int) -> int:
        """Bytes of part ``number`` (1-based)."""
        return min(self.part_size, self.size - (number - 1) * self.part_size)


def plan_parts(size: int, part_size: int = PART_SIZE) -> PartPlan:
    """Cut ``size`` bytes into parts of ``part_size`` (default 50 MB), within S3's limits.

    The part size grows when ``size`` would need more than 10,000 parts (never at the default size up
    to 500 GB); it stays between S3's 5 MiB minimum and 5 GiB maximum.

    Raises:
        ValueError: ``part_size`` below 5 MiB or above 5 GiB, or ``size`` not positive or too large
            for 10,000 parts of 5 GiB.
    """
    if not MIN_PART <= part_size <= MAX_PART:
        raise ValueError(f"part size {part_size} is outside S3's {MIN_PART}..{MAX_PART} bytes")
    if size < 1:
        raise ValueError("size must be positive")
    part_size = max(part_size, math.ceil(size / MAX_PARTS))
    if part_size > MAX_PART:
        raise ValueError(f"{size} bytes do not fit in {MAX_PARTS} parts of {MAX_PART} bytes")
    return PartPlan(size=size, part_size=part_size, count=math.ceil(size / part_size))


def part_order_problem(numbers: list[int]) -> str | None:
    """Why a completion's part list is not exactly 1, 2, ..., N, or ``None``."""
    for position, number in enumerate(numbers, start=1):
        if number != position:
            return (
                f"list the parts in order 1, 2, ..., {len(numbers)} without gaps or repeats; "
                f"entry {position} is part {number}"
            )
    return None


def completion_problems(listed: list[tuple[int, str]], uploaded: dict[int, tuple[str, int]]) -> list[str]:
    """What is wrong with completing ``listed`` (number, ETag) given what the store holds.

    ``uploaded`` maps part number to (ETag, size) as the store lists them. Checked here rather than
    left to the store: some stores (rclone 1.75) drop the whole upload on a refused completion, and an
    uploaded part left out of the list would silently truncate the file.
    """
    problems = []
    for number, etag in listed:
        held = uploaded.get(number)
        if held is None:
            problems.append(f"part {number} was not uploaded")
        elif (stored := held[0].strip('"')) != etag.strip('"'):
            problems.append(f"part {number}'s ETag {etag} is not the stored part's ({stored})")
    last = len(listed)
    extra = sorted(n for n in uploaded if n > last)
    if extra:
        problems.append(f"parts {extra[:5]} were uploaded but are not listed: list every part")
    small = [n for n, (_, size) in sorted(uploaded.items()) if n < last and size < MIN_PART]
    if small:
        problems.append(f"parts {small[:5]} are under 5 MiB: only the last part may be")
    return problems[:5]


# ---------------------------------------------------------------------------------------------------
# The object store (blocking; call through s3_call)


def _expiry(ttl_s: int) -> str:
    return _iso(dt.datetime.fromtimestamp(time.time() + ttl_s, dt.UTC))


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def presign_put(
    s3: Any,
    bucket: str,
    key: str,
    *,
    size: int,
    content_type: str | None = None,
    sha256: str | None = None,
    expires_s: int = UPLOAD_URL_TTL_S,
) -> tuple[str, dict[str, str], str]:
    """A presigned PUT of exactly ``size`` bytes: ``(url, headers to send, expires_at)``."""
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "ContentLength": size}
    headers: dict[str, str] = {}
    if content_type:
        params["ContentType"] = headers["Content-Type"] = content_type
    if sha256:
        params["Metadata"] = {"sha256": sha256}
        headers["x-amz-meta-sha256"] = sha256
        params["ChecksumSHA256"] = headers["x-amz-checksum-sha256"] = base64.b64encode(
            bytes.fromhex(sha256)
        ).decode()
    url = s3.generate_presigned_url("put_object", Params=params, ExpiresIn=expires_s)
    return url, headers, _expiry(expires_s)


def start_multipart(s3: Any, bucket: str, key: str, content_type: str | None, sha256: str | None) -> str:
    """Create a multipart upload; its id."""
    params: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if content_type:
        params["ContentType"] = content_type
    if sha256:
        params["Metadata"] = {"sha256": sha256}
    return str(s3.create_multipart_upload(**params)["UploadId"])


def presign_parts(
    s3: Any,
    bucket: str,
    key: str,
    upload_id: str,
    plan: PartPlan,
    first: int,
    count: int,
    expires_s: int = UPLOAD_URL_TTL_S,
) -> tuple[list[PartUrl], int | None, str]:
    """Presigned PUTs of parts ``first`` .. ``first + count - 1`` (clipped to the plan):
    ``(parts, next part number or None, expires_at)``."""
    last = min(plan.count, first + count - 1)
    expires_at = _expiry(expires_s)
    parts = []
    for number in range(first, last + 1):
        length = plan.length(number)
        params = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": number,
            "ContentLength": length,
        }
        url = s3.generate_presigned_url("upload_part", Params=params, ExpiresIn=expires_s)
        parts.append(PartUrl(part_number=number, size=length, url=url))
    return parts, (last + 1 if last < plan.count else None), expires_at


def uploaded_parts(s3: Any, bucket: str, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
    """Part number -> (ETag, size) of every part the store holds for the upload (all pages)."""
    held: dict[int, tuple[str, int]] = {}
    marker = 0
    while True:
        page = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker)
        for part in page.get("Parts", []):
            held[int(part["PartNumber"])] = (str(part["ETag"]), int(part["Size"]))
        next_marker = int(page.get("NextPartNumberMarker") or 0)
        if not page.get("IsTruncated") or next_marker <= marker:
            return held
        marker = next_marker


def complete(s3: Any, bucket: str, key: str, upload_id: str, parts: list[tuple[int, str]]) -> None:
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]},
    )


def abort(s3: Any, bucket: str, key: str, upload_id: str) -> None:
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


def head(s3: Any, bucket: str, key: str) -> dict[str, Any]:
    result: dict[str, Any] = s3.head_object(Bucket=bucket, Key=key)
    return result


def describe(key: str, head_result: dict[str, Any]) -> WorkspaceObject:
    return WorkspaceObject(
        key=key,
        size=int(head_result["ContentLength"]),
        etag=str(head_result.get("ETag", "")).strip('"'),
        last_modified=_iso(head_result["LastModified"]),
    )


def sha256_of(head_result: dict[str, Any]) -> str | None:
    """The ``sha256`` metadata recorded at upload (keys compared case-blind: rclone capitalises)."""
    metadata = {k.lower(): v for k, v in head_result.get("Metadata", {}).items()}
    return metadata.get("sha256")


def presign_get(s3: Any, bucket: str, key: str, expires_s: int = DOWNLOAD_URL_TTL_S) -> tuple[str, str]:
    """A presigned GET: ``(url, expires_at)``."""
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s)
    return url, _expiry(expires_s)


def list_page(
    s3: Any, bucket: str, prefix: str, limit: int, after: str | None
) -> tuple[list[WorkspaceObject], bool]:
    """Up to ``limit`` objects under ``prefix`` after key ``after``; and whether more follow."""
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": limit}
    if after:
        params["StartAfter"] = after
    page = s3.list_objects_v2(**params)
    items = [
        WorkspaceObject(
            key=str(o["Key"]),
            size=int(o["Size"]),
            etag=str(o.get("ETag", "")).strip('"'),
            last_modified=_iso(o["LastModified"]),
        )
        for o in page.get("Contents", [])
    ]
    return items, bool(page.get("IsTruncated")) and bool(items)


def delete(s3: Any, bucket: str, key: str) -> None:
    s3.delete_object(Bucket=bucket, Key=key)


_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchUpload"})
_BAD_PARTS = frozenset({"InvalidPart", "InvalidPartOrder", "EntityTooSmall"})


async def s3_call(
    fn: Callable[..., T], *args: Any, missing: str = "not found in the workspace", **kwargs: Any
) -> T:
    """Run a blocking store call in a thread; store errors become API errors.

    ``missing`` is the 404 message when the store says the object or upload does not exist.
    A store that cannot be reached is a 503; any other store refusal a 502 naming its code.
    """
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _NOT_FOUND:
            raise ApiError(404, "not_found", missing) from None
        if code == "NoSuchBucket":
            raise ApiError(
                404, "workspace_missing", "this tenant's bucket does not exist; ask the operator"
            ) from None
        if code in _BAD_PARTS:
            raise ApiError(400, "invalid_parts", f"the object store refused the parts ({code})") from None
        raise ApiError(502, "object_store_error", f"the object store answered {code or exc}") from None
    except BotoCoreError as exc:
        raise ApiError(503, "object_store_unavailable", f"the object store is unreachable: {exc}") from None
