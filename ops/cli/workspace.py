"""``resontech upload``, ``download``, ``ls``: the tenant's workspace (its bucket in the object store),
through the gateway's presigned URLs, with a progress bar on a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.client import Progress
from ops.cli.session import UserCommand, client, show


def progress_bar(label: str) -> Progress:
    """A one-line progress bar on stderr (only when it is a terminal: logs stay clean)."""
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if not tty or (now - last[0] < 0.1 and done < total):
            return
        last[0] = now
        width = 30
        filled = width * done // max(total, 1)
        rate = done / max(now - start, 1e-6) / 1e6
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done >= total else ""
        sys.stderr.write(
            f"\r{label} [{bar}] {100 * done // max(total, 1):3d}% "
            f"{done / 1e6:,.1f}/{total / 1e6:,.1f} MB {rate:,.1f} MB/s{end}"
        )
        sys.stderr.flush()

    return report


def cmd_upload(args: argparse.Namespace) -> int:
    source = Path(args.file)
    if source.is_dir():
        return _upload_folder(args, source)
    if not source.is_file():
        raise SystemExit(f"error: {source} is not a file or a folder")
    key = args.key_path or f"jobs/{source.stem}/{source.name}"
    with client(args) as rt:
        stored = rt.upload(source, key, content_type=args.content_type, progress=progress_bar(source.name))
    show(args, stored, lambda o: f"uploaded {source} -> {o.key} ({o.size:,} bytes)")
    return 0


def _upload_folder(args: argparse.Namespace, source: Path) -> int:
    """Every file under ``source`` (hidden ones and ``__pycache__`` left out) to ``KEY/<its path>``:
    an NVFlare job folder, a script's folder."""
    prefix = args.key_path or ""
    if not prefix.endswith("/"):
        raise SystemExit("error: uploading a folder needs KEY, a prefix ending in '/' (jobs/x/flare/)")
    files = [
        path
        for path in sorted(source.rglob("*"))
        if path.is_file()
        and not any(p.startswith(".") or p == "__pycache__" for p in path.relative_to(source).parts)
    ]
    with client(args) as rt:
        stored = [rt.upload(path, prefix + path.relative_to(source).as_posix()) for path in files]
    show(
        args,
        stored,
        lambda objs: "\n".join(f"uploaded {o.key} ({o.size:,} bytes)" for o in objs) or "(empty)",
    )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    with client(args) as rt:
        target = rt.download(args.object_key, args.dest, progress=progress_bar(Path(args.object_key).name))
    if args.json:
        print(json.dumps({"key": args.object_key, "path": str(target)}))
    else:
        print(f"downloaded {args.object_key} -> {target}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as rt:
        page = rt.objects(args.prefix, limit=args.limit)
        items = list(page.items)
        while page.next and len(items) < args.limit:
            page = rt.objects(args.prefix, limit=args.limit, after=page.next)
            items += page.items
    show(
        args,
        items,
        lambda objs: "\n".join(f"{o.size:>14,}  {o.last_modified}  {o.key}" for o in objs) or "(empty)",
    )
    return 0


def register(user: UserCommand) -> None:
    """Add ``upload``, ``download`` and ``ls``."""
    p = user("upload", cmd_upload, "upload a file (or a folder's files) to your workspace")
    p.add_argument("file", help="the local file, or a folder (its files go under KEY, a prefix)")
    p.add_argument(
        "key_path", nargs="?", metavar="KEY", help="where in the workspace (default jobs/<stem>/<name>)"
    )
    p.add_argument("--content-type", help="MIME type stored with the object")
    p = user("download", cmd_download, "download an object of your workspace")
    p.add_argument("object_key", metavar="KEY", help="the object's key, e.g. model_out/final.pt")
    p.add_argument("dest", nargs="?", default=".", help="file or directory (default: here)")
    p = user("ls", cmd_ls, "list your workspace")
    p.add_argument("prefix", nargs="?", default="", help="only keys starting with this")
    p.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
