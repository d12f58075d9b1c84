"""The fetcher: the init container of every pod the dispatcher renders
(``python3 -m ops.dispatcher.fetch WORKDIR [DOWNLOADS_JSON]``).

It makes the working dir's folders (``data``, ``checkpoints``, ``tmp``), copies the supervisor
(:mod:`ops.dispatcher.supervise`) into ``.resontech``, then fetches every entry of
the downloads file (``[{"path", "url", "unpack"?}]``, mounted from the pod's inputs Secret) with a
plain GET of its presigned URL into ``WORKDIR/<path>``, as an agent does (:mod:`agent.downloads`):
every path stays inside the working dir, a file is written under a temporary name and renamed once
whole, no redirect is followed; an entry with ``unpack`` is a ZIP unpacked into that folder (no member
may leave it) and then deleted. Any failure exits non-zero with one line naming the file, which fails
the pod and so the shard, with that line in its log.

Standard library only: it runs in the default image before the workload, with no credentials.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

TIMEOUT_S = 300
FOLDERS = ("data", "checkpoints", "tmp")
KERNEL_FOLDER = ".resontech"
SUPERVISOR = "supervise.py"
"""Copied into ``WORKDIR/.resontech``: the workload's image may be the tenant's
(:mod:`ops.dispatcher.supervise`)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def inside(root: Path, name: str) -> Path:
    """``root / name`` when ``name`` is a relative path without ``..``; else ``SystemExit``."""
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        raise SystemExit(f"fetch: {name!r} is not a relative path inside the working dir")
    return root.joinpath(*parts)


def fetch(root: Path, path: str, url: str) -> Path:
    target = inside(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(url, timeout=TIMEOUT_S) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except Exception as exc:  # one line, whatever failed: the pod's log tail says it
        partial.unlink(missing_ok=True)
        raise SystemExit(f"fetch: input {path}: {type(exc).__name__}: {exc}") from None
    partial.replace(target)
    return target


def unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if member.rstrip("/"):
                inside(dest, member.rstrip("/"))
        zf.extractall(dest)
    archive.unlink()


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    for folder in FOLDERS:
        (root / folder).mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / KERNEL_FOLDER).mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name(SUPERVISOR), root / KERNEL_FOLDER / SUPERVISOR)
    entries = json.loads(Path(argv[1]).read_text()) if len(argv) > 1 else []
    for entry in entries:
        target = fetch(root, entry["path"], entry["url"])
        if entry.get("unpack"):
            unpack(target, inside(root, entry["unpack"]))
    print(f"fetch: {len(entries)} input(s) in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
