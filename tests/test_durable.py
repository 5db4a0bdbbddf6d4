"""runtime/durable.py: the one atomic small-file write every state file goes through."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from runtime.durable import make_dir, write_atomic


def test_replaces_the_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "state.json"
    p.write_text("old")
    write_atomic(p, '{"v": 1}')
    assert p.read_text() == '{"v": 1}'
    write_atomic(p, b"\x00bytes")
    assert p.read_bytes() == b"\x00bytes"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["state.json"]


def test_mode_is_exact_and_default_follows_the_umask(tmp_path):
    write_atomic(tmp_path / "key", "k", mode=0o600)
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "plain", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o600


def test_a_planted_temp_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / ".state.json.tmp")
    write_atomic(tmp_path / "state.json", "new", mode=0o644)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "state.json").is_symlink()
    assert (tmp_path / "state.json").read_text() == "new"


def test_a_failing_setup_keeps_the_old_file_and_no_temp(tmp_path):
    p = tmp_path / "acl"
    p.write_text("old")

    def refuse(fd: int) -> None:
        raise PermissionError("not replaced")

    with pytest.raises(PermissionError):
        write_atomic(p, "new", setup=refuse, tmp=p.with_name("acl.tmp"))
    assert p.read_text() == "old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["acl"]


def test_a_crash_between_fsync_and_rename_leaves_the_old_file(tmp_path):
    p = tmp_path / "current.json"
    p.write_text("old")
    code = ("import sys; from pathlib import Path; from runtime.durable import write_atomic; "
            "write_atomic(Path(sys.argv[1]), 'new', crash_at='swap')")
    env = {**os.environ, "EDGERUN_CRASH_AT": "swap"}
    r = subprocess.run([sys.executable, "-c", code, str(p)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -9, r.stderr
    assert p.read_text() == "old"
    assert (tmp_path / ".current.json.tmp").read_text() == "new"  # written, never renamed
    write_atomic(p, "next")  # the leftover is replaced, not in the way
    assert p.read_text() == "next" and not (tmp_path / ".current.json.tmp").exists()


def test_make_dir_says_why_a_directory_cannot_be_had(tmp_path):
    """make_dir: None when the directory is there or made (parents too), else the reason in
    words for the caller's error: a file in its place or in a parent's, or the OS's own."""
    assert make_dir(tmp_path / "a" / "b") is None and (tmp_path / "a" / "b").is_dir()
    assert make_dir(tmp_path / "a" / "b") is None  # already there
    (tmp_path / "f").write_text("x")
    assert make_dir(tmp_path / "f") == "is not a directory"
    assert make_dir(tmp_path / "f" / "sub") == "is not a directory"
    assert make_dir(tmp_path / ("x" * 300)) == "cannot be made (File name too long)"
