"""The supervisor: the first process of a shard pod whose assignment has checkpoint upload URLs
(``python3 supervise.py URLS_JSON FOLDER -- ARGV...``), doing in the pod what an agent does on its host
for checkpoints (:mod:`agent.checkpoints`).

It holds ``FOLDER`` (``$RESONTECH_CHECKPOINT_DIR``) open before it starts ``ARGV`` (the workload, its
only child, with the same stdin and stderr), then copies the workload's stdout to its own line by line,
so that the pod's log, which the dispatcher reads, is what the workload printed, except for a
``RESONTECH_CHECKPOINT`` line that names a file (``"path"``): the file is PUT to the next of the
assignment's presigned URLs (``URLS_JSON``: ``[[object key, URL], ...]`` in the order they are used, so
the upload in flight never overwrites the checkpoint a restart would resume from), deleted, and the
line goes out naming the object key instead. The dispatcher claims that key as the agent would; the
intake takes only the assignment's own keys. A line that names an object key goes out as it is.

The workload writes the folder, so a name in it (or the folder's own name) may point anywhere: every
file is opened beneath the folder's descriptor, one component at a time, never through a link, and
only a regular file with one link is sent (at most :data:`MAX_BYTES`). A report that cannot be honoured
(not such a file, a refused or failed upload) is one line on stderr and no report: the job goes on, and
a restart resumes from the last checkpoint that did arrive.

SIGTERM and SIGINT are passed to the workload; the supervisor exits with the workload's status (128 + N
for a signal N, as a shell reports it). The URLs are in a Secret mounted in this container, where the
workload could read them too: they write only its own assignment's checkpoint keys, which its reports
name anyway. Standard library only: the fetcher copies this file into the working dir, so it runs in
any image with a Python (the workload's may be the tenant's).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any, BinaryIO

KEYWORD = "RESONTECH_CHECKPOINT"
"""The first word of a checkpoint report (:data:`core.protocol.CHECKPOINT`)."""
MAX_BYTES = 1 << 40
"""The largest checkpoint file sent (1 TiB, as the agent's limit)."""
TIMEOUT_S = 60
"""Per connect and per read of one upload: a stalled store fails it."""
CHUNK = 1 << 20
LINE_LIMIT = 1 << 20
"""The longest piece of the workload's stdout handled at once (a longer line passes through in pieces)."""


class CheckpointRefused(Exception):
    """A report that cannot be honoured; the message says why."""


def open_beneath(folder_fd: int, name: str) -> tuple[BinaryIO, int, str]:
    """``name`` (a relative path) opened beneath ``folder_fd`` without following any link: the file,
    the descriptor of its directory and its last component.

    Raises:
        CheckpointRefused: the path leaves the folder, a component is a link or missing, or the file is not a
            regular file with exactly one link.
    """
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in name:
        raise CheckpointRefused(f"{name!r} is not a relative path inside the checkpoint folder")
    dir_fd = os.dup(folder_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        os.close(dir_fd)
        raise CheckpointRefused(f"{name!r}: {exc.strerror} (a component may be a symbolic link)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        os.close(dir_fd)
        raise CheckpointRefused(f"{name!r} is not a regular file with one link")
    return os.fdopen(fd, "rb"), dir_fd, parts[-1]


def _chunks(source: BinaryIO, size: int) -> Iterator[bytes]:
    left = size
    while left > 0 and (chunk := source.read(min(CHUNK, left))):
        left -= len(chunk)
        yield chunk


def put(url: str, source: BinaryIO, size: int) -> None:
    """PUT the first ``size`` bytes of ``source`` to a presigned ``url`` (a file that grows meanwhile
    is cut there; no redirect followed).

    Raises:
        CheckpointRefused: the store refused it or could not be reached.
    """
    body = _chunks(source, size)
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Length": str(size)})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=TIMEOUT_S) as response:
            response.read()
    except Exception as exc:  # HTTPError (refused, expired), URLError, a timeout: one line says it
        raise CheckpointRefused(f"upload failed: {type(exc).__name__}: {exc}") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Uploads:
    """The checkpoint reports of one workload (module docstring)."""

    def __init__(self, folder_fd: int, targets: list[tuple[str, str]]) -> None:
        self.folder_fd = folder_fd
        self.targets = targets
        self.count = 0

    def line(self, raw: bytes) -> bytes:
        """What goes out for one line of the workload's stdout."""
        word, _, payload = raw.decode(errors="replace").strip().partition(" ")
        if word != KEYWORD:
            return raw
        try:
            report = json.loads(payload)
        except ValueError:
            return raw  # not a report: the dispatcher skips it as the agent does
        if not isinstance(report, dict) or "path" not in report:
            return raw
        try:
            key = self.upload(report["path"])
        except CheckpointRefused as exc:
            print(f"supervise: checkpoint refused: {exc}", file=sys.stderr, flush=True)
            return b""
        report = {k: v for k, v in report.items() if k != "path"} | {"object_key": key}
        return f"{KEYWORD} {json.dumps(report)}\n".encode()

    def upload(self, name: object) -> str:
        """Send the file ``name`` to the next URL and delete it; its object key."""
        if not isinstance(name, str):
            raise CheckpointRefused("the path is not a string")
        if not self.targets:
            raise CheckpointRefused("this assignment has no upload URLs")
        key, url = self.targets[self.count % len(self.targets)]
        source, dir_fd, last = open_beneath(self.folder_fd, name)
        try:
            with source:
                size = min(os.fstat(source.fileno()).st_size, MAX_BYTES)
                put(url, source, size)
            os.unlink(last, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        self.count += 1
        print(f"supervise: checkpoint {name} ({size} bytes) uploaded to {key}", file=sys.stderr, flush=True)
        return key


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: supervise.py URLS_JSON FOLDER -- ARGV...", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        targets = [(str(key), str(url)) for key, url in json.load(f)]
    folder_fd = os.open(argv[1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # before the workload
    try:
        child = subprocess.Popen(argv[3:], stdout=subprocess.PIPE, bufsize=0)
    except OSError as exc:
        print(f"supervise: cannot run {argv[3]!r}: {exc}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: child.send_signal(signum))
    uploads = Uploads(folder_fd, targets)
    assert child.stdout is not None
    for raw in iter(lambda: child.stdout.readline(LINE_LIMIT), b""):  # type: ignore[union-attr]
        out = uploads.line(raw)
        if out:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
