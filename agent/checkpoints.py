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

import contextlib
import logging
from pathlib import Path

import msgspec

from agent.protocol import CheckpointLine
from agent.transfer import TransferFailed, inside, upload

log = logging.getLogger("resontech.agent")


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
            path = inside(self.folder, line.path)
            if not _plain_file_in(path, self.folder):
                raise TransferFailed(f"checkpoint {line.path!r} is not a file in the checkpoint folder")
            size = await upload(url, path, f"checkpoint {line.path}")
        except TransferFailed as exc:
            log.warning("%s: %s", self.name, exc.message)
            return None
        self.count += 1
        with contextlib.suppress(OSError):
            path.unlink()
        log.info("%s: checkpoint %s (%d bytes) uploaded to %s", self.name, line.path, size, key)
        return msgspec.structs.replace(line, object_key=key, path=None)


def _plain_file_in(path: Path, folder: Path) -> bool:
    """True for a regular file (not a link) that really lies inside ``folder``."""
    return not path.is_symlink() and path.is_file() and path.resolve().is_relative_to(folder.resolve())
