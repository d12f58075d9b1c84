"""A node's part of a sharded checkpoint, as one archive: packed from what its ranks wrote, unpacked
before a restart (see :mod:`projections.checkpoints` for the keys and when a set counts).

**Up.** The workload saves with ``torch.distributed.checkpoint`` into a folder of
``$RESONTECH_CHECKPOINT_DIR`` and reports it (``RESONTECH_CHECKPOINT {"dir": ..., "step": ...}``).
The part is a POSIX ustar archive of the plain files directly in that folder (DCP writes them flat:
one ``__<rank>_<n>.distcp`` per rank, ``.metadata`` on the coordinator's node), each opened beneath
the held checkpoint folder without following links (:class:`core.files.TenantTree`), preceded by a
manifest of the agent's own (:data:`MANIFEST`: the step and the node). Its size is known before the
first byte (a 512-byte header and the data rounded up to 512 per file, two zero blocks at the end),
so it streams straight to the presigned PUT with its ``Content-Length``, never copied on disk. A
sub-folder, a link, a FIFO or a name outside :data:`NAME` fails the part: it is not uploaded.

**Down.** The parts come from the tenant's workspace, which tenant code can write: each is read as
a stranger's archive. Only regular-file members with a plain name are taken, each created with
``O_EXCL | O_NOFOLLOW`` in a folder the agent made before the workload runs; a name given twice, more
than :data:`MAX_PART_FILES` files, more than :data:`MAX_PART_BYTES` bytes, or a manifest that does not
name the step and the node the kernel says the set holds (a part overwritten by a later save) is
refused, and the start fails saying which part and why.
"""

from __future__ import annotations

import asyncio
import os
import re
import tarfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

import msgspec

from agent import downloads  # a module, not its names: agent.downloads imports agent.runtimes
from agent.runtimes.base import StartFailed
from core.files import TenantTree, UnsafeFile

MANIFEST = "resontech-part.json"
"""The agent's own first member of every part: ``{"step": ..., "slot": ...}``."""
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
"""A member's name: one plain component (never ``.`` or ``..``), at most ustar's 100 bytes."""
MAX_PART_FILES = 4096
MAX_PART_BYTES = 1 << 40
"""The largest part (1 TiB), packed or unpacked."""
BLOCK = 512
CHUNK = 1 << 20


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    slot: int


@dataclass(frozen=True, slots=True)
class Part:
    """A part ready to stream: its members' files already open (the caller closes them)."""

    files: list[tuple[str, BinaryIO, int]]
    manifest: bytes

    @property
    def size(self) -> int:
        members = [len(self.manifest), *(size for _, _, size in self.files)]
        return sum(BLOCK + _padded(size) for size in members) + 2 * BLOCK

    def close(self) -> None:
        for _, source, _ in self.files:
            source.close()


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o600, 0
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def open_part(folder: TenantTree, name: str, *, step: int, slot: int) -> Part:
    """Open every file of the folder ``name`` (see the module docstring).

    Raises:
        UnsafeFile: ``name`` is not a plain folder of the tree, or it holds something else than plain
            files with plain names, or too many, or too much.
    """
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise UnsafeFile(f"{name!r} is not a plain folder name")
    folder.folder(name).close()  # there, and a folder (not a link)
    members = folder.files(name, max_files=MAX_PART_FILES)
    if not members:
        raise UnsafeFile(f"{name!r} holds no files")
    if sorted(members) != sorted(folder.names(name)):
        raise UnsafeFile(f"{name!r} holds something else than plain files (a folder, a link, a FIFO)")
    files: list[tuple[str, BinaryIO, int]] = []
    try:
        for member in members:
            if not NAME.fullmatch(member) or member in (".", "..", MANIFEST):
                raise UnsafeFile(f"{name}/{member!r}: not a name a part may hold")
            source = folder.open_file(f"{name}/{member}", MAX_PART_BYTES)
            files.append((member, source, os.fstat(source.fileno()).st_size))
        manifest = msgspec.json.encode(Manifest(step=step, slot=slot))
        part = Part(files=files, manifest=manifest)
        if part.size > MAX_PART_BYTES:
            raise UnsafeFile(f"{name!r} holds more than {MAX_PART_BYTES} bytes")
        return part
    except BaseException:
        Part(files=files, manifest=b"").close()
        raise


async def stream(part: Part) -> AsyncIterator[bytes]:
    """The archive of ``part``, in chunks.

    Raises:
        OSError: a file shrank while it was read (the upload fails; nothing counts).
    """
    manifest = part.manifest
    yield _header(MANIFEST, len(manifest)) + manifest + bytes(_padded(len(manifest)) - len(manifest))
    for member, source, size in part.files:
        yield _header(member, size)
        left = size
        while left > 0:
            chunk = await asyncio.to_thread(source.read, min(CHUNK, left))
            if not chunk:
                raise OSError(f"{member} shrank while it was uploaded")
            left -= len(chunk)
            yield chunk
        yield bytes(_padded(size) - size)
    yield bytes(2 * BLOCK)


async def fetch_set(parts: Mapping[str, str], workdir: Path, step: int) -> Path:
    """Download every part of the set to resume from (key -> URL, in node order) and unpack them
    into one folder, ``<workdir>/resume/checkpoint``, which it returns.

    Raises:
        StartFailed: a part cannot be fetched, or is refused (see the module docstring).
    """
    archives = workdir / "resume" / "parts"
    target = workdir / "resume" / "checkpoint"
    try:
        target.mkdir(mode=0o700, parents=True)
    except FileExistsError:  # this assignment started here before: its workload may have written it
        raise StartFailed("the folder to resume in exists already: this assignment ran here before") from None
    names = {f"{slot}.tar": url for slot, url in enumerate(parts.values())}
    fetched = await downloads.fetch_all(names, archives)
    with TenantTree.open(target) as out:
        seen: set[str] = set()
        for slot, (key, archive) in enumerate(zip(parts, fetched, strict=True)):
            try:
                await asyncio.to_thread(unpack, archive, out, seen, Manifest(step=step, slot=slot))
            except (UnsafeFile, tarfile.TarError, msgspec.DecodeError, OSError) as exc:
                why = exc.message if isinstance(exc, UnsafeFile) else f"{type(exc).__name__}: {exc}"
                raise StartFailed(f"checkpoint part {key}: refused: {why}") from None
            archive.unlink()
    return target


def unpack(archive: Path, out: TenantTree, seen: set[str], expected: Manifest) -> None:
    """Unpack the part ``archive`` into ``out`` (names in ``seen`` are taken: a second is refused).

    Raises:
        UnsafeFile: a member is not a plain file with a plain name, a name comes twice, too much, or
            the manifest is missing or names another step or node.
    """
    manifest: Manifest | None = None
    total = 0
    with tarfile.open(archive, mode="r:") as tar:
        for member in tar:
            if not member.isreg() or not NAME.fullmatch(member.name) or member.name in (".", ".."):
                raise UnsafeFile(f"member {member.name[:100]!r} is not a plain file with a plain name")
            source = tar.extractfile(member)
            if source is None:
                raise UnsafeFile(f"member {member.name!r} has no content")
            if member.name == MANIFEST:
                manifest = msgspec.json.decode(source.read(4096), type=Manifest)
                continue
            total += member.size
            if member.name in seen or len(seen) >= MAX_PART_FILES or total > MAX_PART_BYTES:
                raise UnsafeFile(f"member {member.name!r} comes twice, or the set holds too much")
            seen.add(member.name)
            _copy(source, out, member.name)
    if manifest != expected:
        got = "no manifest" if manifest is None else f"step {manifest.step} of node {manifest.slot}"
        raise UnsafeFile(f"it holds {got}, not step {expected.step} of node {expected.slot} (overwritten?)")


def _copy(source: IO[bytes], out: TenantTree, name: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=out.fd)
    with os.fdopen(fd, "wb") as sink:
        while chunk := source.read(CHUNK):
            sink.write(chunk)
