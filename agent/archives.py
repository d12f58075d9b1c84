"""Unpacking an assignment's ZIPs (a shard, a startup kit) safely, into its working dir.

Members that would land outside the destination (absolute paths, ``..``) and symbolic links are
refused, and so is an archive whose CRCs fail or that claims more than :data:`MAX_UNPACKED_BYTES`.
It blocks; the agent calls it in a worker thread.
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from core.errors import ResontechError

MAX_UNPACKED_BYTES = 500 * 10**9
CHUNK = 1024 * 1024


class BadArchive(ResontechError):
    """An archive cannot be unpacked; the message names it and says why."""

    code = "bad_archive"


def unpack(archive: Path, dest: Path, what: str) -> int:
    """Unpack a ZIP into ``dest``; the number of files.

    Raises:
        BadArchive: not a ZIP, corrupt, or unsafe (the message names ``what``).
    """
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
                raise BadArchive(f"{what} unpacks to more than {MAX_UNPACKED_BYTES // 10**9} GB")
            for member in members:
                _check_member(member, what)
            bad = zf.testzip()
            if bad is not None:
                raise BadArchive(f"{what} is corrupt: {bad} fails its CRC check")
            dest.mkdir(parents=True, exist_ok=True)
            for member in members:
                target = dest / member.filename
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as source, target.open("wb") as sink:
                    shutil.copyfileobj(source, sink, CHUNK)
            return sum(1 for m in members if not m.is_dir())
    except zipfile.BadZipFile as exc:
        raise BadArchive(f"{what} is not a valid ZIP file ({exc})") from None
    except (OSError, EOFError) as exc:
        raise BadArchive(f"{what} could not be unpacked: {exc}") from None


def _check_member(member: zipfile.ZipInfo, what: str) -> None:
    path = PurePosixPath(member.filename)
    if path.is_absolute() or ".." in path.parts or "\\" in member.filename:
        raise BadArchive(f"{what} holds an unsafe path: {member.filename!r}")
    if stat.S_ISLNK(member.external_attr >> 16):
        raise BadArchive(f"{what} holds a symbolic link: {member.filename!r}")
