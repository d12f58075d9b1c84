"""Fetching an assignment's inputs: presigned GETs to files, ZIPs unpacked safely.

The URLs come with the assignment (``WorkSpec.downloads``), are valid for an hour, and are used once:
the agent holds no credentials for the tenant's bucket. Both functions block; the agent calls them in
a worker thread.
"""

from __future__ import annotations

import shutil
import stat
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from core.errors import ResontechError

TIMEOUT_S = 60.0
"""Per read of a download (not the whole transfer: a large shard may take long; a stalled one may not)."""
MAX_UNPACKED_BYTES = 500 * 10**9
CHUNK = 1024 * 1024


class FetchFailed(ResontechError):
    """A download or an archive failed; the message names it and says why."""

    code = "fetch_failed"


def download(url: str, dest: Path, what: str) -> int:
    """GET ``url`` into ``dest``; the number of bytes.

    Raises:
        FetchFailed: an HTTP error, a network error or a stalled transfer (the message names ``what``).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, dest.open("wb") as sink:
            size = 0
            while chunk := response.read(CHUNK):
                sink.write(chunk)
                size += len(chunk)
            return size
    except urllib.error.HTTPError as exc:
        detail = "not found (or the link expired)" if exc.code in (403, 404) else f"HTTP {exc.code}"
        raise FetchFailed(f"cannot download {what}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FetchFailed(f"cannot download {what}: {reason}") from None


def unpack(archive: Path, dest: Path, what: str) -> int:
    """Unpack a ZIP into ``dest``; the number of files.

    Members that would land outside ``dest`` (absolute paths, ``..``) and symbolic links are
    refused, and so is an archive that claims more than :data:`MAX_UNPACKED_BYTES`.

    Raises:
        FetchFailed: not a ZIP, corrupt, or unsafe (the message names ``what``).
    """
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if sum(m.file_size for m in members) > MAX_UNPACKED_BYTES:
                raise FetchFailed(f"{what} unpacks to more than {MAX_UNPACKED_BYTES // 10**9} GB")
            for member in members:
                _check_member(member, what)
            bad = zf.testzip()
            if bad is not None:
                raise FetchFailed(f"{what} is corrupt: {bad} fails its CRC check")
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
        raise FetchFailed(f"{what} is not a valid ZIP file ({exc})") from None
    except (OSError, EOFError) as exc:
        raise FetchFailed(f"{what} could not be unpacked: {exc}") from None


def _check_member(member: zipfile.ZipInfo, what: str) -> None:
    path = PurePosixPath(member.filename)
    if path.is_absolute() or ".." in path.parts or "\\" in member.filename:
        raise FetchFailed(f"{what} holds an unsafe path: {member.filename!r}")
    if stat.S_ISLNK(member.external_attr >> 16):
        raise FetchFailed(f"{what} holds a symbolic link: {member.filename!r}")
