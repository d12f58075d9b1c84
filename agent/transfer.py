"""Moving files between a worker and the tenant's workspace through presigned URLs only.

The agent never holds object-store credentials: the kernel hands it a presigned GET for each input
and a presigned PUT for each key it may write (:mod:`ops.workspecs`). Every transfer has a deadline,
a download is written to a temporary name and renamed when complete (a workload never reads half a
file), and a local name must stay inside its destination folder (a key like ``../x`` is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path, PurePosixPath

import httpx

from core.errors import ResontechError

CHUNK = 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0
"""The longest one file may take, either way."""
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""Per read/write/connect; a stalled transfer fails long before its deadline."""


class TransferFailed(ResontechError):
    """A download or upload failed; the message names the file and says why in one line."""

    code = "transfer_failed"


def inside(root: Path, name: str) -> Path:
    """``root / name`` for a relative name that stays inside ``root``.

    Raises:
        TransferFailed: ``name`` is absolute, empty, or climbs out with ``..``.
    """
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or any(p in ("..", ".") for p in parts):
        raise TransferFailed(f"{name!r} is not a relative path inside {root.name}/")
    return root.joinpath(*parts)


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, TimeoutError):
        return f"no end after {TRANSFER_TIMEOUT_S:.0f}s"
    return f"{type(exc).__name__}: {exc}"


async def fetch(client: httpx.AsyncClient, url: str, dest: Path, what: str) -> int:
    """Download ``url`` to ``dest`` (parents created); return the size in bytes.

    Raises:
        TransferFailed: the store refused it (an expired URL, a missing object) or it did not finish.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    size = 0
    try:
        async with asyncio.timeout(TRANSFER_TIMEOUT_S), client.stream("GET", url) as response:
            response.raise_for_status()
            with partial.open("wb") as sink:
                async for chunk in response.aiter_bytes(CHUNK):
                    sink.write(chunk)
                    size += len(chunk)
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise TransferFailed(f"cannot download {what}: {_why(exc)}") from None
    partial.replace(dest)
    return size


async def fetch_all(downloads: Mapping[str, str], root: Path) -> dict[str, Path]:
    """Download every ``name -> url`` into ``root / name``, four at a time; return the local paths.

    Raises:
        TransferFailed: for the first file that failed (by name), or a name outside ``root``.
    """
    paths = {name: inside(root, name) for name in downloads}
    limit = asyncio.Semaphore(4)

    async def one(client: httpx.AsyncClient, name: str) -> None:
        async with limit:
            await fetch(client, downloads[name], paths[name], name)

    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT) as client, asyncio.TaskGroup() as group:
            for name in sorted(downloads):
                group.create_task(one(client, name))
    except ExceptionGroup as failed:  # the first failure stopped the others
        raise failed.exceptions[0] from None
    return paths


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as source:
        while chunk := await asyncio.to_thread(source.read, CHUNK):
            yield chunk


async def upload(url: str, path: Path, what: str) -> int:
    """PUT the file ``path`` to a presigned ``url``; return its size in bytes.

    Raises:
        TransferFailed: the store refused it (an expired URL) or it did not finish.
    """
    try:
        size = (await asyncio.to_thread(path.stat)).st_size
        async with asyncio.timeout(TRANSFER_TIMEOUT_S), httpx.AsyncClient(timeout=_TIMEOUT) as client:
            response = await client.put(url, content=_chunks(path), headers={"Content-Length": str(size)})
            response.raise_for_status()
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        raise TransferFailed(f"cannot upload {what}: {_why(exc)}") from None
    return size
