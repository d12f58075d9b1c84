"""Checkpoint files a workload reports, uploaded by its agent to the keys the kernel presigned.

The workload writes a checkpoint into ``$RESONTECH_CHECKPOINT_DIR`` and prints
``RESONTECH_CHECKPOINT {"path": ...}``; the agent PUTs the file to the next of its assignment's
presigned URLs (``WorkSpec.checkpoint_urls``, used in turn: the upload in flight never overwrites the
checkpoint a restart would resume from), removes the local file, and reports the object key. So
tenant code never holds object-store credentials, and the agent only URLs for these few keys.

A report the agent cannot honour (no URLs for this assignment, a path outside the folder, a missing
file, a refused upload) is logged and dropped: the job goes on, and a restart resumes from the last
checkpoint that did arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

import httpx
import msgspec

from agent.protocol import CheckpointLine
from core.errors import ResontechError

log = logging.getLogger("resontech.agent")
CHUNK = 1 << 20
UPLOAD_TIMEOUT_S = 600.0
"""The longest one checkpoint upload may take."""
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""Per read/write/connect: a stalled upload fails long before its deadline."""


class UploadFailed(ResontechError):
    """A checkpoint could not be uploaded; the message names it and says why."""

    code = "upload_failed"


class CheckpointUploads:
    """The checkpoint uploads of one assignment.

    Args:
        folder: the workload's ``$RESONTECH_CHECKPOINT_DIR``.
        urls: object key -> presigned PUT URL, in the order they are used.
        name: the assignment id, for the log.
    """

    def __init__(self, folder: Path, urls: dict[str, str], name: str) -> None:
        self.folder = folder
        self.targets = list(urls.items())
        self.name = name
        self.count = 0

    async def resolve(self, line: CheckpointLine) -> CheckpointLine | None:
        """The report as an object key: ``line`` itself when it names one, else after uploading its
        file (``None`` when the file could not be uploaded)."""
        if line.path is None:
            return line
        if not self.targets:
            log.warning("%s: checkpoint %s ignored: this assignment has no upload URLs", self.name, line.path)
            return None
        key, url = self.targets[self.count % len(self.targets)]
        try:
            path = _file_in(self.folder, line.path)
            size = await upload(url, path, f"checkpoint {line.path}")
        except UploadFailed as exc:
            log.warning("%s: %s", self.name, exc.message)
            return None
        self.count += 1
        with contextlib.suppress(OSError):
            path.unlink()
        log.info("%s: checkpoint %s (%d bytes) uploaded to %s", self.name, line.path, size, key)
        return msgspec.structs.replace(line, object_key=key, path=None)


def _file_in(folder: Path, name: str) -> Path:
    """``folder / name`` when that is a regular file (not a link) that really lies in ``folder``.

    Raises:
        UploadFailed: it is not.
    """
    parts = PurePosixPath(name).parts
    path = folder.joinpath(*parts)
    if PurePosixPath(name).is_absolute() or ".." in parts or path.is_symlink() or not path.is_file():
        raise UploadFailed(f"checkpoint {name!r} is not a file in the checkpoint folder")
    if not path.resolve().is_relative_to(folder.resolve()):
        raise UploadFailed(f"checkpoint {name!r} lies outside the checkpoint folder")
    return path


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as source:
        while chunk := await asyncio.to_thread(source.read, CHUNK):
            yield chunk


async def upload(url: str, path: Path, what: str) -> int:
    """PUT the file ``path`` to a presigned ``url``; return its size in bytes.

    Raises:
        UploadFailed: the store refused it (an expired URL) or it did not finish in time.
    """
    try:
        size = (await asyncio.to_thread(path.stat)).st_size
        async with asyncio.timeout(UPLOAD_TIMEOUT_S), httpx.AsyncClient(timeout=_TIMEOUT) as client:
            response = await client.put(url, content=_chunks(path), headers={"Content-Length": str(size)})
            response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise UploadFailed(f"cannot upload {what}: HTTP {exc.response.status_code}") from None
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        raise UploadFailed(f"cannot upload {what}: {type(exc).__name__}: {exc}") from None
    return size
