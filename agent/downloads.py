"""Fetch a workload's inputs before it starts: ``spec.downloads`` maps a relative path in the
assignment's working dir to a presigned GET URL (the kernel presigns them; the agent holds no
object-store credentials, and the workload sees only files).

Every path is checked to stay inside the working dir; every file is written under a temporary name
and renamed once complete, so a workload never sees half a file; a failed download names the file
and the store's answer, and the assignment fails to start with that reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import httpx

from agent.runtimes.base import StartFailed

PARALLEL = 4
TIMEOUT_S = httpx.Timeout(30.0, read=300.0)
CHUNK = 1 << 20


def target_of(workdir: Path, name: str) -> Path:
    """Where ``name`` goes under ``workdir``; refuses absolute paths and ``..``."""
    relative = PurePosixPath(name)
    if not name or name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        raise StartFailed(f"download target {name!r} must be a relative path inside the working dir")
    return workdir.joinpath(*relative.parts)


async def fetch_all(downloads: Mapping[str, str], workdir: Path) -> list[Path]:
    """Download every entry of ``downloads`` into ``workdir``; returns the files written.

    Raises:
        StartFailed: a target path is unsafe, or a download failed (the message names the file).
    """
    targets = {name: target_of(workdir, name) for name in downloads}
    if not targets:
        return []
    gate = asyncio.Semaphore(PARALLEL)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as http:

        async def one(name: str) -> Path:
            async with gate:
                return await _fetch(http, name, downloads[name], targets[name])

        return list(await asyncio.gather(*(one(name) for name in targets)))


async def _fetch(http: httpx.AsyncClient, name: str, url: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        async with http.stream("GET", url) as response:
            if response.status_code != 200:
                body = (await response.aread())[:300].decode(errors="replace")
                reason = "expired or invalid URL" if response.status_code in (400, 403) else "not available"
                raise StartFailed(
                    f"input {name}: the object store answered {response.status_code} ({reason}): {body}"
                )
            with partial.open("wb") as out:
                async for block in response.aiter_bytes(CHUNK):
                    out.write(block)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise StartFailed(f"input {name}: download failed: {type(exc).__name__}: {exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return target
