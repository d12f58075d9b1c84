"""Reading and writing beneath a directory handle (:mod:`core.files`): no link followed, regular files only,
sizes bounded, a folder swapped after it was held changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.files import TenantTree, UnsafeFile


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tenant"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.bin").write_bytes(b"mine")
    (tmp_path / "secret").write_text("the reader's own")
    return root


def test_a_plain_file_beneath_the_tree_is_read(tree: Path) -> None:
    with TenantTree.open(tree) as t:
        assert t.read_bytes("sub/ok.bin", 100) == b"mine"
        assert t.names("sub") == ["ok.bin"] and t.names("missing") == []
        t.unlink("sub/ok.bin")
        assert not (tree / "sub" / "ok.bin").exists()


def test_a_link_as_the_last_component_is_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "sub" / "link.bin").symlink_to(tmp_path / "secret")
    with TenantTree.open(tree) as t, pytest.raises(UnsafeFile, match="symbolic link"):
        t.read_bytes("sub/link.bin", 100)
    assert (tmp_path / "secret").read_text() == "the reader's own"


def test_a_link_in_a_middle_component_is_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "up").symlink_to(tmp_path)
    with TenantTree.open(tree) as t:
        with pytest.raises(UnsafeFile, match="symbolic link"):
            t.read_bytes("up/secret", 100)
        with pytest.raises(UnsafeFile, match="symbolic link"):
            t.names("up")
        for bad in ("../secret", "/etc/passwd", "sub/../../secret", "", "sub//ok.bin"):
            with pytest.raises(UnsafeFile, match="relative path of plain names"):
                t.read_bytes(bad, 100)


def test_a_fifo_is_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "sub" / "pipe")  # opened for reading without O_NONBLOCK, this blocks forever
    with TenantTree.open(tree) as t, pytest.raises(UnsafeFile, match="not a regular file"):
        t.read_bytes("sub/pipe", 100)


def test_a_hard_link_to_a_file_outside_is_refused(tree: Path, tmp_path: Path) -> None:
    os.link(tmp_path / "secret", tree / "sub" / "hard.bin")
    with TenantTree.open(tree) as t, pytest.raises(UnsafeFile, match="2 links"):
        t.read_bytes("sub/hard.bin", 100)


def test_a_file_larger_than_the_bound_is_refused_and_a_growing_one_is_cut(tree: Path) -> None:
    with (tree / "sub" / "huge.bin").open("wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte
    with TenantTree.open(tree) as t:
        with pytest.raises(UnsafeFile, match="more than 1024"):
            t.read_bytes("sub/huge.bin", 1024)
        with t.open_file("sub/ok.bin", 4) as f:
            (tree / "sub" / "ok.bin").write_bytes(b"mine and much more")  # it grows once checked
            assert f.read() == b"mine"


def test_a_folder_swapped_for_a_link_after_it_was_held_changes_nothing(tree: Path, tmp_path: Path) -> None:
    t = TenantTree.open(tree)
    identity = t.identity
    tree.rename(tmp_path / "moved")
    tree.symlink_to(tmp_path)  # the tree's own name now leads to the reader's files
    with t:
        assert t.read_bytes("sub/ok.bin", 100) == b"mine"  # the fd is the folder it was taken on
        with pytest.raises(UnsafeFile):
            t.read_bytes("secret", 100)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        TenantTree.open(tree)
    tree.unlink()
    tree.mkdir()
    with pytest.raises(UnsafeFile, match="not the folder it was"):
        TenantTree.open(tree, identity)


def test_writes_never_go_through_a_link(tree: Path, tmp_path: Path) -> None:
    (tree / "pid").symlink_to(tmp_path / "secret")
    with TenantTree.open(tree) as t:
        with pytest.raises(UnsafeFile, match="symbolic link"):
            t.write_bytes("pid", b"123")
        t.write_bytes("sub/pid", b"123")
        with t.open_write("sub/pid", append=True) as f:
            f.write(b"4")
    assert (tmp_path / "secret").read_text() == "the reader's own"
    assert (tree / "sub" / "pid").read_bytes() == b"1234"
