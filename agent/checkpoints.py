"""Checkpoint files a workload reports, uploaded by its agent to the keys the kernel presigned.

The workload writes a checkpoint into ``$RESONTECH_CHECKPOINT_DIR`` and prints
``RESONTECH_CHECKPOINT {"path": ...}``; the agent PUTs the file to the next of its assignment's
presigned URLs (``WorkSpec.checkpoint_urls``, used in turn: the upload in flight never overwrites the
checkpoint a restart would resume from), removes the local file, and reports the object key. So
tenant code never holds object-store credentials, and the agent only URLs for these few keys.

A report the agent cannot honour (no URLs for this assignment, a path outside the folder, a link, a
FIFO, a hard link, a missing file, a refused upload) is logged and dropped: the job goes on, and a
restart resumes from the last checkpoint that did arrive. The folder is held by a directory fd taken
before the workload started, and every file is opened beneath it without following links
(:class:`core.files.TenantTree`): the workload writes the folder, so a name in it (or the folder's
own name) may point anywhere the agent could read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import httpx
import msgspec

from agent import checkpoint_parts
from agent.protocol import CheckpointLine
from agent.runtimes.base import StartFailed, checkpoint_dir
from core.errors import ResontechError
from core.files import TenantTree, UnsafeFile
from schemas.commands import StartWork

log = logging.getLogger("resontech.agent")
CHUNK = 1 << 20
UPLOAD_TIMEOUT_S = 600.0
"""The longest one checkpoint upload may take."""
MAX_CHECKPOINT_BYTES = 1 << 40
"""The largest checkpoint file uploaded (1 TiB): far above any model, below what a sparse file of a
workload could claim."""
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""Per read/write/connect: a stalled upload fails long before its deadline."""


class UploadFailed(ResontechError):
    """A checkpoint could not be uploaded; the message names it and says why."""

    code = "upload_failed"


class CheckpointUploads:
    """The checkpoint uploads of one assignment.

    Args:
        folder: the workload's ``$RESONTECH_CHECKPOINT_DIR``, held since before the workload started
            (:class:`core.files.TenantTree`: a link the workload puts in its place, or in it, is never
            followed); ``None``: every file report is refused.
        urls: object key -> presigned PUT URL, in the order they are used.
        name: the assignment id, for the log.
    """

    def __init__(
        self,
        folder: TenantTree | None,
        urls: dict[str, str],
        name: str,
        *,
        part_urls: dict[str, str] | None = None,
        slot: int = 0,
    ) -> None:
        self.folder = folder
        self.targets = list(urls.items())
        self.part_targets = list((part_urls or {}).items())
        self.name = name
        self.slot = slot
        self.count = 0
        self.parts = 0

    @classmethod
    def of(cls, cmd: StartWork, folder: TenantTree | None) -> CheckpointUploads:
        """The uploads of the assignment ``cmd`` starts."""
        spec = cmd.spec
        return cls(folder, spec.checkpoint_urls, cmd.assignment_id, part_urls=spec.part_urls, slot=cmd.slot)

    async def resolve(self, line: CheckpointLine) -> CheckpointLine | None:
        """The report as an object key: ``line`` itself when it names one, else after uploading its
        file or part (``None`` when it could not be uploaded)."""
        if line.dir is not None and line.step is not None and line.object_key is None:
            return await self._part(line, line.dir, line.step)
        if line.path is None:
            return line
        if not self.targets or self.folder is None:
            log.warning("%s: checkpoint %s ignored: this assignment has no upload URLs", self.name, line.path)
            return None
        key, url = self.targets[self.count % len(self.targets)]
        try:
            size = await upload_from(url, self.folder, line.path)
        except UploadFailed as exc:
            log.warning("%s: %s", self.name, exc.message)
            return None
        self.count += 1
        with contextlib.suppress(OSError, UnsafeFile):
            self.folder.unlink(line.path)
        log.info("%s: checkpoint %s (%d bytes) uploaded to %s", self.name, line.path, size, key)
        return msgspec.structs.replace(line, object_key=key, path=None)

    async def _part(self, line: CheckpointLine, name: str, step: int) -> CheckpointLine | None:
        """Upload the folder ``name`` as this node's part of the checkpoint of ``step``, to the next
        part URL: the turn advances on every part reported, uploaded or not, so that every node of
        the world uses the same folder for the same save (:mod:`projections.checkpoints`)."""
        turn, self.parts = self.parts, self.parts + 1
        if not self.part_targets or self.folder is None:
            log.warning("%s: checkpoint part %s ignored: this assignment has no part URLs", self.name, name)
            return None
        key, url = self.part_targets[turn % len(self.part_targets)]
        try:
            part = await asyncio.to_thread(
                checkpoint_parts.open_part, self.folder, name, step=step, slot=self.slot
            )
        except UnsafeFile as exc:
            log.warning("%s: checkpoint part %s refused: %s", self.name, name, exc.message)
            return None
        try:
            size = await _put(url, checkpoint_parts.stream(part), part.size, f"checkpoint part {name}")
        except UploadFailed as exc:
            log.warning("%s: %s", self.name, exc.message)
            return None
        finally:
            part.close()
        with contextlib.suppress(OSError, UnsafeFile):
            for member, _, _ in part.files:
                self.folder.unlink(f"{name}/{member}")
            os.rmdir(name, dir_fd=self.folder.fd)
        log.info(
            "%s: checkpoint part %s of step %d (%d bytes) uploaded to %s", self.name, name, step, size, key
        )
        return msgspec.structs.replace(line, object_key=key)


async def _chunks(source: BinaryIO, size: int) -> AsyncIterator[bytes]:
    left = size
    while left > 0 and (chunk := await asyncio.to_thread(source.read, min(CHUNK, left))):
        left -= len(chunk)
        yield chunk


async def upload_from(url: str, folder: TenantTree, name: str) -> int:
    """PUT the regular file ``name`` of ``folder`` (opened beneath it, never through a link: see
    :class:`core.files.TenantTree`) to a presigned ``url``; return its size in bytes (as it was
    when opened: a file that grows meanwhile is cut there, at most :data:`MAX_CHECKPOINT_BYTES`).

    Raises:
        UploadFailed: it is not a plain file in the folder (the message says why), or the store
            refused it (an expired URL), or it did not finish in time.
    """
    try:
        source = await asyncio.to_thread(folder.open_file, name, MAX_CHECKPOINT_BYTES)
    except UnsafeFile as exc:
        raise UploadFailed(f"checkpoint refused: not a plain file of its folder: {exc.message}") from None
    with source:
        size = os.fstat(source.fileno()).st_size
        return await _put(url, _chunks(source, size), size, f"checkpoint {name}")


async def _put(url: str, content: AsyncIterator[bytes], size: int, what: str) -> int:
    try:
        async with asyncio.timeout(UPLOAD_TIMEOUT_S), httpx.AsyncClient(timeout=_TIMEOUT) as client:
            response = await client.put(url, content=content, headers={"Content-Length": str(size)})
            response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise UploadFailed(f"cannot upload {what}: HTTP {exc.response.status_code}") from None
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        raise UploadFailed(f"cannot upload {what}: {type(exc).__name__}: {exc}") from None
    return size


def hold_checkpoints(workdir: Path) -> TenantTree:
    """The assignment's checkpoint folder, made if missing and held by an fd before its workload
    starts: the workload may later put a link in its place (or in it); the agent reads only beneath
    the folder it made.

    Raises:
        StartFailed: it is not a plain folder (a link left in the working dir).
    """
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        return TenantTree.create(checkpoint_dir(workdir))
    except UnsafeFile as exc:
        raise StartFailed(f"the checkpoint folder cannot be used: {exc.message}") from None
