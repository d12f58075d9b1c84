"""Files that hold secrets or state: written whole or not at all, and readable by their owner only;
and files in a tree tenant code can write, opened beneath a directory fd without following links
(:class:`TenantTree`)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from pathlib import Path
from typing import Any

from core.errors import ResontechError


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


# -- trees tenant code can write -------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_TAIL_SOURCE = 1 << 50
"""A log's tail is read from a file of any size (only its end is read)."""
MAX_PARTS = 32
"""The most components a relative path into a tenant tree may have."""


class UnsafeFile(ResontechError):
    """A path in a tenant-writable tree is not a plain file (or folder) that lies in it: a symbolic
    link, a FIFO or device, a hard link to something else, too large, or missing. The message names
    the path and says which."""

    code = "unsafe_file"

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def _parts(relpath: str) -> list[str]:
    """The components of ``relpath``; only plain names (no ``..``, ``.``, empty or absolute)."""
    parts = relpath.split("/")
    if not relpath or len(parts) > MAX_PARTS or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise UnsafeFile(f"{relpath[:200]!r} is not a relative path of plain names")
    return parts


def _refusal(relpath: str, exc: OSError) -> UnsafeFile:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return UnsafeFile(f"{relpath!r}: a component is a symbolic link or not a folder")
    if exc.errno == errno.ENOENT:
        return UnsafeFile(f"{relpath!r} does not exist", missing=True)
    return UnsafeFile(f"{relpath!r}: {exc.strerror or exc}")


class TenantTree:
    """A folder tenant code can write (a workload's directory, an FL server's federation), held by
    a directory fd taken before tenant code ran in it.

    Rules (the class of attack: a name swapped for a link, by code that writes the folder, makes a
    reader outside the sandbox read or write the reader's own files):

    * every path is walked from the fd, one component at a time, each opened with ``O_NOFOLLOW``: a
      symbolic link anywhere (middle or last component) is refused, never followed; ``..`` and
      absolute paths are refused;
    * what is read is a regular file (opened ``O_NONBLOCK``, then ``fstat``: a FIFO never blocks the
      reader), of at most ``max_bytes``, with one link (a hard link to a file outside the tree is
      refused: tenant code never creates a file with two names that the kernel must read);
    * renaming the folder away or replacing it with a link changes nothing: the fd is the folder it
      was taken on (:meth:`open` checks a folder's identity, ``st_dev``/``st_ino``, when given one);
    * what the reader writes (a log, a pid file) is created or opened ``O_NOFOLLOW`` too.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: Path, identity: tuple[int, int] | None = None) -> TenantTree:
        """Hold the folder ``path`` (its last component must not be a link; the folders above it are
        the reader's own). With ``identity``, it must be that folder (``(st_dev, st_ino)``).

        Raises:
            UnsafeFile: it is a link, not a folder, missing, or another folder.
        """
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            raise _refusal(str(path), exc) from None
        tree = cls(fd, path)
        if identity is not None and tree.identity != identity:
            tree.close()
            raise UnsafeFile(f"{path} is not the folder it was when it was made")
        return tree

    @classmethod
    def create(cls, path: Path, mode: int = 0o700) -> TenantTree:
        """Make the folder ``path`` (and its parents) if missing and hold it, before tenant code
        runs in it."""
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode, parents=True)
        return cls.open(path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # a workload's handle outlives its supervision: its fd goes with it
        with contextlib.suppress(OSError, AttributeError):
            self.close()

    def __enter__(self) -> TenantTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _walk(self, parts: list[str], relpath: str, make_mode: int | None = None) -> int:
        """An fd of the folder ``parts`` names below the tree (the caller closes it); with
        ``make_mode``, each missing folder is made first."""
        fd = os.dup(self.fd)
        try:
            for part in parts:
                if make_mode is not None:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, make_mode, dir_fd=fd)
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _refusal(relpath, exc) from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def makedirs(self, relpath: str, mode: int = 0o700) -> None:
        """Make the folders of ``relpath`` that are missing, each beneath the last (a link in the
        way is refused, never followed).

        Raises:
            UnsafeFile: a component is a link or not a folder.
        """
        os.close(self._walk(_parts(relpath), relpath, make_mode=mode))

    def folder(self, relpath: str) -> TenantTree:
        """The sub-folder ``relpath``, held by an fd of its own (the caller closes it).

        Raises:
            UnsafeFile: a component is a link or not a folder, or it is missing.
        """
        return TenantTree(self._walk(_parts(relpath), relpath), self.path / relpath)

    def names(self, relpath: str = "") -> list[str]:
        """The names in the sub-folder ``relpath`` (``""``: the tree itself); empty if it is missing.

        Raises:
            UnsafeFile: a component is a link or not a folder.
        """
        try:
            fd = self._walk(_parts(relpath) if relpath else [], relpath)
        except UnsafeFile as exc:
            if exc.missing:
                return []
            raise
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def files(self, relpath: str = "", max_files: int = 100_000) -> list[str]:
        """The regular files beneath the sub-folder ``relpath`` (``""``: the whole tree), as sorted
        paths relative to it, walked folder by folder beneath fds: a link (to a file or a folder) and
        anything not a file or a folder is left out, never followed; empty if it is missing.

        Raises:
            UnsafeFile: a component of ``relpath`` is a link or not a folder, or more than
                ``max_files`` files.
        """
        try:
            fd = self._walk(_parts(relpath) if relpath else [], relpath)
        except UnsafeFile as exc:
            if exc.missing:
                return []
            raise
        found: list[str] = []
        try:
            self._collect(fd, "", found, max_files, depth=0)
        finally:
            os.close(fd)
        return sorted(found)

    def _collect(self, fd: int, prefix: str, found: list[str], max_files: int, depth: int) -> None:
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode):
                found.append(prefix + name)
                if len(found) > max_files:
                    raise UnsafeFile(f"more than {max_files} files beneath {self.path}")
            elif stat.S_ISDIR(st.st_mode) and depth + 1 < MAX_PARTS:
                try:
                    inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:  # swapped for a link since: left out, as a link is
                    continue
                try:
                    self._collect(inner, f"{prefix}{name}/", found, max_files, depth + 1)
                finally:
                    os.close(inner)

    def open_file(self, relpath: str, max_bytes: int) -> io.BufferedReader:
        """Open the regular file ``relpath`` for reading (see the class's rules).

        Raises:
            UnsafeFile: it is not a regular file with one link of at most ``max_bytes`` in the tree.
        """
        *folders, name = _parts(relpath)
        parent = self._walk(folders, relpath)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _refusal(relpath, exc) from None
        finally:
            os.close(parent)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeFile(f"{relpath!r} is not a regular file")
            if st.st_nlink != 1:
                raise UnsafeFile(f"{relpath!r} has {st.st_nlink} links (a hard link is refused)")
            if st.st_size > max_bytes:
                raise UnsafeFile(f"{relpath!r} holds {st.st_size} bytes, more than {max_bytes}")
            os.set_blocking(fd, True)
            return io.BufferedReader(_Bounded(os.fdopen(fd, "rb", closefd=True), max_bytes))
        except UnsafeFile:
            os.close(fd)
            raise

    def read_bytes(self, relpath: str, max_bytes: int) -> bytes:
        """The content of the regular file ``relpath`` (see :meth:`open_file`)."""
        with self.open_file(relpath, max_bytes) as f:
            return f.read()

    def tail_bytes(self, relpath: str, n: int) -> bytes:
        """The last ``n`` bytes of the regular file ``relpath`` (a log of any size: see
        :meth:`open_file` for what is refused).

        Raises:
            UnsafeFile: it is not a plain regular file in the tree.
        """
        with self.open_file(relpath, MAX_TAIL_SOURCE) as f:
            size = os.fstat(f.fileno()).st_size
            return os.pread(f.fileno(), min(n, size), max(0, size - n))

    def exists(self, relpath: str) -> bool:
        """Whether ``relpath`` names something (a link counts: it is there, and refused when read)."""
        *folders, name = _parts(relpath)
        try:
            parent = self._walk(folders, relpath)
        except UnsafeFile:
            return False
        try:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            os.close(parent)

    def unlink(self, relpath: str) -> None:
        """Remove the name ``relpath`` (never what a link points at); nothing if it is missing."""
        *folders, name = _parts(relpath)
        parent = self._walk(folders, relpath)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def open_write(self, relpath: str, *, append: bool = False, mode: int = 0o600) -> io.BufferedWriter:
        """Open ``relpath`` for writing (created if missing; truncated unless ``append``), never
        through a link, and only if it is a regular file with one link.

        Raises:
            UnsafeFile: a component is a link, or the file is not a plain regular file.
        """
        *folders, name = _parts(relpath)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        parent = self._walk(folders, relpath)
        try:
            fd = os.open(name, flags | (os.O_APPEND if append else 0), mode, dir_fd=parent)
        except OSError as exc:
            raise _refusal(relpath, exc) from None
        finally:
            os.close(parent)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise UnsafeFile(f"{relpath!r} is not a plain regular file")
        os.set_blocking(fd, True)
        if not append:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "ab" if append else "wb")

    def write_bytes(self, relpath: str, content: bytes) -> None:
        """Replace the content of ``relpath`` (see :meth:`open_write`)."""
        with self.open_write(relpath) as f:
            f.write(content)


class _Bounded(io.RawIOBase):
    """A reader that yields at most ``limit`` bytes of ``source`` (a file that grows while it is
    read never makes the reader take more than it checked)."""

    def __init__(self, source: io.BufferedReader, limit: int) -> None:
        self.source = source
        self.left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)[: max(0, self.left)]
        n = self.source.readinto(view) if len(view) else 0
        self.left -= n or 0
        return n or 0

    def fileno(self) -> int:
        return self.source.fileno()

    def close(self) -> None:
        self.source.close()
        super().close()
