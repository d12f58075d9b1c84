"""A Hugging Face repo id as an endpoint's model: a snapshot folder of the host's Hugging Face cache.

A tenant names ``org/name`` (or a legacy ``name``), optionally ``@revision`` (a branch, a tag or a
40-hex commit; default ``main``). The agent resolves it, with ``huggingface_hub``'s own
``snapshot_download(local_files_only=True)``, in the hub cache's layout::

    <cache>/models--org--name/refs/<revision>          -> the commit, as text
    <cache>/models--org--name/snapshots/<commit>/...   -> symlinks to ../../blobs/<sha256 or git sha1>

The cache is the host's, found as ``huggingface_hub`` finds it: ``HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. The
engine is given the snapshot folder (a local path: it stays offline). The workload sandbox binds the
hub cache directory read-only (:func:`agent.host.host_sandbox`), so the snapshot's relative links to
``blobs/`` resolve inside it; nothing is copied (a 100 GB model is not stored twice, and the cache
stays the one store that ``hf cache`` tools manage). Only the hub directory is bound, never
``HF_HOME``, which holds the host's tokens.

Offline by default (the hosts here reach no hub): a repo the cache does not hold fails the replica at
once, with a reason that names the repo and the cache. A host with ``RESONTECH_HF_DOWNLOAD=1`` (and no
``HF_HUB_OFFLINE``) downloads it first, in the agent and never in the sandboxed engine: anonymously
(``token=False``: the host's own token, which may open gated or private repos, is never spent on a
tenant's behalf), weights in one format only, at most ``RESONTECH_HF_MAX_GB`` (default 100) GB.

The string is a tenant's, so it is checked before it touches a path: an ASCII repo-id grammar
(:data:`REPO_ID`: no ``..``, ``--``, ``/`` at either end, absolute path, ``~``, ``%``, control
character or newline) and a revision grammar (:data:`REVISION`: git-ref-like segments, no ``..``, no
segment starting with ``.``). What the cache then holds is checked too (:func:`check_snapshot`): the
snapshot lies under its repo's ``snapshots/``, every link resolves to a regular file in the repo's
``blobs/``, and no file or folder on the way is writable by group or others or owned by anyone but
the agent or root: a local user who could write the cache could poison what every tenant is served.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from core.errors import ResontechError
from core.hub import PREFIX, HubReference

COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_MAX_GB = 100.0
SKIPPED = (
    "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.onnx", "*.onnx_data", "*.mlmodel", "*.gguf",
    "onnx/*", "openvino/*", "coreml/*", "tf_model*", "flax_model*", "rust_model*",
)  # fmt: skip
"""Weights in formats no engine here loads (TensorFlow, Flax, Rust, ONNX, OpenVINO, Core ML, GGUF):
never downloaded. Where ``*.safetensors`` exist, the pickled ``*.bin``/``*.pt`` copies are skipped too."""
PICKLED = ("*.bin", "*.pt", "*.pth")


class HubModelError(ResontechError, FileNotFoundError):
    """A repo the host cannot serve: not in its cache (offline), unsafe, incomplete or not downloadable
    (a ``FileNotFoundError`` too: the runtime reports those as the replica's start failure)."""

    code = "model_unavailable"


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The host's Hugging Face hub cache, found as ``huggingface_hub`` finds it (module docstring)."""
    env = os.environ if env is None else env
    if explicit := env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(explicit).expanduser()
    if home := env.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    if xdg := env.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def downloads_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether this host downloads a repo its cache lacks: ``RESONTECH_HF_DOWNLOAD=1`` and no
    ``HF_HUB_OFFLINE`` (default: off)."""
    env = os.environ if env is None else env
    offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return env.get("RESONTECH_HF_DOWNLOAD", "").strip() == "1" and not offline


def max_download_bytes(env: Mapping[str, str] | None = None) -> int:
    """``RESONTECH_HF_MAX_GB`` (default 100) in bytes: the most one repo download may take."""
    env = os.environ if env is None else env
    try:
        return int(float(env.get("RESONTECH_HF_MAX_GB") or DEFAULT_MAX_GB) * 1e9)
    except ValueError:
        return int(DEFAULT_MAX_GB * 1e9)


def _foreign(st: os.stat_result) -> bool:
    return st.st_uid not in (os.geteuid(), 0) or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _refuse(path: Path, st: os.stat_result) -> None:
    if _foreign(st):
        raise HubModelError(
            f"{path} in the Hugging Face cache is writable by group or others, or owned by uid "
            f"{st.st_uid}: it could be poisoned (fix: chown to the agent and chmod -R go-w the cache)"
        )


def repo_folder(cache: Path, ref: HubReference) -> Path | None:
    """The repo's folder in ``cache``, or ``None``. Repo ids are case-insensitive on the hub: when the
    exact folder is missing, one folder whose name differs only in case is taken."""
    exact = cache / ref.folder
    if exact.is_dir():
        return exact
    try:
        found = [e for e in os.scandir(cache) if e.name.lower() == ref.folder.lower() and e.is_dir()]
    except OSError:
        return None
    return Path(found[0].path) if len(found) == 1 else None


def check_snapshot(snapshot: Path, repo: Path, cache: Path) -> Path:
    """``snapshot`` if it is a safe, non-empty snapshot of ``repo`` (module docstring).

    Raises:
        HubModelError: it is not (the message names the file and why).
    """
    if repo.is_symlink():
        raise HubModelError(f"{repo} is a link: a repo's folder must be the cache's own")
    real_repo = repo.resolve()
    if not snapshot.resolve().is_relative_to(real_repo / "snapshots"):
        raise HubModelError(f"{snapshot} is not under {repo}/snapshots")
    for path in (cache, repo, repo / "snapshots", repo / "blobs", snapshot):
        if path.exists():
            _refuse(path, path.lstat())
    files = 0
    for folder, dirs, names in os.walk(snapshot):
        for name in [*dirs, *names]:
            files += _check_entry(Path(folder, name), real_repo)
    if files == 0:
        raise HubModelError(f"the snapshot {snapshot} is empty")
    return snapshot


def _check_entry(path: Path, real_repo: Path) -> int:
    """1 for a good file, 0 for a good folder; raises for anything else."""
    st = path.lstat()
    if stat.S_ISDIR(st.st_mode):
        _refuse(path, st)
        return 0
    if stat.S_ISLNK(st.st_mode):
        target = path.resolve()
        if not target.is_relative_to(real_repo / "blobs"):
            raise HubModelError(f"{path} links outside its repo's blobs (to {target})")
        st = target.stat() if target.exists() else st
        path = target
    if not stat.S_ISREG(st.st_mode):
        raise HubModelError(f"{path} is not a regular file (a dangling link or a special file)")
    _refuse(path, st)
    return 1


def cached_snapshot(ref: HubReference, cache: Path) -> Path | None:
    """The checked snapshot folder of ``ref`` in ``cache``, or ``None`` when the cache lacks it.

    Raises:
        HubModelError: the cache holds it but incomplete or unsafe, or ``huggingface_hub`` is missing.
    """
    repo = repo_folder(cache, ref)
    if repo is None:
        return None
    hf, errors = _huggingface_hub()
    repo_id = "/".join(repo.name[len(PREFIX) :].split("--"))
    try:
        found = hf.snapshot_download(repo_id, revision=ref.revision, cache_dir=cache, local_files_only=True)
    except errors.IncompleteSnapshotError as exc:
        raise HubModelError(f"{ref}: the cached snapshot is incomplete ({_first_line(exc)})") from None
    except errors.LocalEntryNotFoundError:
        return None
    return check_snapshot(Path(str(found)), repo, cache)


def download_plan(files: Iterable[tuple[str, int]]) -> tuple[list[str], int]:
    """The ignore patterns for a repo of ``files`` (name, bytes) and the bytes left to download."""
    listed = list(files)
    skipped = list(SKIPPED)
    if any(name.endswith(".safetensors") for name, _ in listed):
        skipped += PICKLED
    wanted = [size for name, size in listed if not any(fnmatch.fnmatch(name, p) for p in skipped)]
    return skipped, sum(wanted)


def download(ref: HubReference, cache: Path, *, max_bytes: int) -> None:
    """Download ``ref`` from the Hub into ``cache`` anonymously, then take group and other write off
    what it wrote.

    Raises:
        HubModelError: the Hub refused or could not be reached, or the repo is over ``max_bytes``.
    """
    hf, _ = _huggingface_hub()
    try:
        info = hf.HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True, token=False)
        skipped, size = download_plan((s.rfilename, s.size or 0) for s in info.siblings or [])
        if size > max_bytes:
            raise HubModelError(f"{ref} is {size / 1e9:.1f} GB, over this host's {max_bytes / 1e9:.1f} GB")
        cache.mkdir(mode=0o755, parents=True, exist_ok=True)
        hf.snapshot_download(
            ref.repo_id, revision=ref.revision, cache_dir=cache, token=False, ignore_patterns=skipped
        )
    except HubModelError:
        raise
    except Exception as exc:  # the network edge: every failure becomes one line
        raise HubModelError(f"{ref}: download failed: {type(exc).__name__}: {_first_line(exc)}") from None
    _seal(cache / ref.folder)


def _seal(folder: Path) -> None:
    """Group and other write off what the agent owns under ``folder`` (a umask of 002 leaves it)."""
    for root, dirs, names in os.walk(folder):
        for name in [".", *dirs, *names]:
            path = Path(root, name)
            st = path.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid():
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


def snapshot(ref: HubReference, cache: Path, *, download_missing: bool, max_bytes: int) -> Path:
    """The local folder that serves ``ref``: from ``cache``, downloaded first when allowed.

    Raises:
        HubModelError: not in the cache on an offline host, or any failure above (one line).
    """
    found = cached_snapshot(ref, cache)
    if found is not None:
        return found
    if not download_missing:
        raise HubModelError(
            f"{ref} is not in this host's Hugging Face cache ({cache}) and the host does not download "
            "(RESONTECH_HF_DOWNLOAD is not 1)"
        )
    download(ref, cache, max_bytes=max_bytes)
    found = cached_snapshot(ref, cache)
    if found is None:
        raise HubModelError(f"{ref}: downloaded, but not found in {cache} afterwards")
    return found


def _huggingface_hub() -> tuple[Any, Any]:
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise HubModelError("huggingface_hub is not installed (the workloads extra)") from None
    return huggingface_hub, errors


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
