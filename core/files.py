"""Files that hold secrets or state: written whole or not at all, and readable by their owner only."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content`` atomically (a reader or a crash sees the old file or the new
    one, never half of one) and durably, owner-readable only (0600): credentials, keys, an agent's
    state with every running assignment's presigned URLs."""
    data = content.encode() if isinstance(content, str) else content
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
