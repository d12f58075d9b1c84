"""The user-facing commands of ``resontech``: they talk to the gateway through the SDK
(:mod:`gateway.client`), never to NATS. ``login`` remembers the gateway URL and key; every command
takes ``--url`` and ``--key`` to override, then ``RESONTECH_GATEWAY_URL`` / ``RESONTECH_API_KEY``, then
what ``login`` stored, then the dev stack's ``dev.env``.

Output is a short human summary, or with ``--json`` the API's own JSON. Errors are one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from core.settings import read_env_file
from gateway.client import CREDENTIALS, Client, Progress

Command = Callable[[argparse.Namespace], int]


def _defaults(args: argparse.Namespace) -> dict[str, str]:
    data_dir = Path(getattr(args, "data_dir", None) or os.environ.get("RESONTECH_DATA_DIR") or ".resontech")
    env_file = data_dir / "dev.env"
    return read_env_file(env_file) if env_file.exists() else {}


def client(args: argparse.Namespace) -> Client:
    """A client configured from flags, environment, the login file, then dev.env."""
    fallback = _defaults(args)
    url = args.url or os.environ.get("RESONTECH_GATEWAY_URL")
    key = args.key or os.environ.get("RESONTECH_API_KEY")
    if not CREDENTIALS.exists():
        url = url or fallback.get("RESONTECH_GATEWAY_URL")
        key = key or fallback.get("RESONTECH_API_KEY")
    return Client(url, key)


def show(args: argparse.Namespace, value: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))
    else:
        print(human(value))


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


# -- commands ----------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    with client(args) as rt:
        if not rt.config.key:
            raise SystemExit("error: give the key: resontech login --key rt_... [--url URL]")
        me = rt.me()
    CREDENTIALS.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(CREDENTIALS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": rt.config.url, "key": rt.config.key}, f)
    show(
        args,
        me,
        lambda m: f"logged in to {rt.config.url} as {m.principal} ({m.role}); saved to {CREDENTIALS}",
    )
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    CREDENTIALS.unlink(missing_ok=True)
    print(f"removed {CREDENTIALS}")
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    with client(args) as rt:
        me = rt.me()
        show(args, me, lambda m: f"{m.principal} ({m.role}) at {rt.config.url}")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    source = Path(args.file)
    if not source.is_file():
        raise SystemExit(f"error: {source} is not a file")
    key = args.key_path or f"jobs/{source.stem}/{source.name}"
    with client(args) as rt:
        stored = rt.upload(source, key, content_type=args.content_type, progress=progress_bar(source.name))
    show(args, stored, lambda o: f"uploaded {source} -> {o.key} ({o.size:,} bytes)")
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


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the user commands to the ``resontech`` parser (``command(name, handler, help)``)."""

    def user(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        p = command(name, lambda args, _settings: handler(args), help_text)
        p.add_argument("--url", help="gateway URL (default: RESONTECH_GATEWAY_URL, login, dev.env)")
        p.add_argument("--key", help="API key (default: RESONTECH_API_KEY, login, dev.env)")
        return p

    user("login", cmd_login, "check a gateway URL and key, and remember them for later commands")
    user("logout", cmd_logout, "forget what login remembered")
    user("whoami", cmd_whoami, "who the current key is")
    p = user("upload", cmd_upload, "upload a file to your workspace (multipart for large files)")
    p.add_argument("file", help="the local file")
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
