"""Moving bytes between a file and the object store, through presigned URLs: files read in chunks
with progress (:data:`Progress`), hashed for the upload's checksum, answers checked, and a download
checked for its size and SHA-256 before it replaces its target."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from gateway.client.errors import TransferError
from schemas.api.workspace import Download

PARALLEL_PARTS = 5
"""Multipart upload parts in flight at once."""
CHUNK = 1 << 20
"""Bytes per read while streaming a PUT body (progress is reported per chunk)."""
Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Meter:
    """Thread-safe byte counter that calls the progress callback."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self.progress = progress
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            done = self.done
        if self.progress is not None:
            self.progress(done, self.total)


def _chunks(path: Path, offset: int, size: int, meter: _Meter) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(offset)
        left = size
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                raise TransferError(0, "file_changed", f"{path} shrank while it was being uploaded")
            left -= len(block)
            meter.add(len(block))
            yield block


def _stored(response: httpx.Response, what: str) -> str:
    if response.status_code >= 300:
        text = response.text.strip()[:300]
        raise TransferError(
            response.status_code, "object_store_refused", f"{what}: {text or response.reason_phrase}"
        )
    return str(response.headers.get("etag", "")).strip('"')


def _read(path: Path, offset: int, size: int, meter: _Meter) -> bytes:
    """``size`` bytes of ``path`` from ``offset`` (a part is at most 50 MB: fine to hold)."""
    return b"".join(_chunks(path, offset, size, meter))


def _target(dest: Path, key: str) -> Path:
    """The file a download of ``key`` writes: ``dest``, or the key's name inside ``dest`` if a dir."""
    return dest / Path(key).name if dest.is_dir() else dest


def _verify(partial: Path, info: Download, sha256: str) -> None:
    got = partial.stat().st_size
    if got != info.size:
        partial.unlink(missing_ok=True)
        raise TransferError(0, "incomplete_download", f"{info.key}: got {got} of {info.size} bytes")
    if info.sha256 and info.sha256 != sha256:
        partial.unlink(missing_ok=True)
        raise TransferError(0, "checksum_mismatch", f"{info.key}: SHA-256 differs from the uploaded file's")
