"""`edgerun check` says which mount options would spare the card under the state directory
(runtime/device/wear.py `mount_of`, `mount_advice`; runtime/device/cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import from_dict
from runtime.device.cli import _mount_line
from runtime.device.wear import mount_advice, mount_of

MOUNTS = """\
/dev/mmcblk0p2 / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/mmcblk0p1 /boot/firmware vfat rw,relatime,fmask=0022 0 0
/dev/sda1 /var/lib/edgerun ext4 rw,noatime,lazytime,commit=60 0 0
/dev/sda2 /var/lib/edge ext4 rw,relatime 0 0
tmpfs /run tmpfs rw,nosuid,nodev,size=100m 0 0
/dev/sdb1 /mnt/my\\040card ext4 rw,noatime 0 0
"""


@pytest.mark.parametrize("path, found", [
    ("/var/lib/edgerun/state", ("/var/lib/edgerun", "ext4", ("rw", "noatime", "lazytime",
                                                            "commit=60"))),
    ("/var/lib/edgerun", ("/var/lib/edgerun", "ext4", ("rw", "noatime", "lazytime",
                                                      "commit=60"))),
    ("/var/lib/edgerunner", ("/", "ext4", ("rw", "relatime"))),  # a prefix is not a parent
    ("/var/lib/edge/x", ("/var/lib/edge", "ext4", ("rw", "relatime"))),
    ("/run/edgerun", ("/run", "tmpfs", ("rw", "nosuid", "nodev", "size=100m"))),
    ("/mnt/my card/state", ("/mnt/my card", "ext4", ("rw", "noatime"))),
])
def test_the_mount_holding_a_path_is_the_longest_above_it(path, found):
    assert mount_of(Path(path), MOUNTS) == found


def test_no_mount_table_holds_nothing():
    assert mount_of(Path("/x"), "") is None


@pytest.mark.parametrize("fstype, options, advice", [
    ("ext4", ("rw", "relatime"), "commit=60"),  # Raspberry Pi OS's root
    ("ext4", ("rw", "noatime", "lazytime"), "commit=60"),
    ("ext4", ("rw", "commit=30"), "commit=60"),
    ("ext4", ("rw", "relatime", "commit=60"), None),
    ("ext4", ("rw", "commit=600"), None),
    ("ext4", ("rw", "commit=x"), "commit=60"),
    ("ext3", ("rw",), "commit=60"),
    ("tmpfs", ("rw",), None),  # nothing reaches a card
    ("f2fs", ("rw", "relatime"), None),  # not measured: no advice
])
def test_mount_advice(fstype, options, advice):
    assert mount_advice(fstype, options) == advice


def test_check_names_the_mount_and_what_to_add(tmp_path):
    (tmp_path / "mounts").write_text(f"/dev/vdz9 {tmp_path} ext4 rw,relatime 0 0\n")
    cfg = from_dict({"daemon": {"state_dir": str(tmp_path / "state" / "not-yet")}})
    line = _mount_line(cfg, tmp_path / "mounts")
    assert line is not None and line.startswith(
        f"storage: the state directory is on {tmp_path} (ext4, rw,relatime)")
    assert "metadata to the card every 5 s: mount it with commit=60" in line
    (tmp_path / "mounts").write_text(f"/dev/vdz9 {tmp_path} ext4 rw,relatime,commit=60 0 0\n")
    assert _mount_line(cfg, tmp_path / "mounts") is None
    assert _mount_line(cfg, tmp_path / "absent") is None  # no mount table: nothing said


def test_a_damaged_mount_table_costs_only_its_bad_lines():
    junk = "garbage\n\n/dev/x\n" + "a" * 100_000 + "\n\x00\x01 / \n" + MOUNTS
    assert mount_of(Path("/var/lib/edgerun/state"), junk)[0] == "/var/lib/edgerun"
    assert mount_of(Path("/srv"), "only three fields\n") is None


def test_check_names_an_outbox_directory_that_can_make_no_file(tmp_path):
    """A read-only outbox directory (a card gone read-only, a mount to fix) is said ahead:
    `serve` would keep its outbox in memory there, or not start."""
    import os
    import subprocess

    from runtime.device.cli import _state_disk_line

    state = tmp_path / "state"
    state.mkdir()
    cfg = from_dict({"telemetry": {"outbox": {"path": str(state / "outbox.db")}}})
    assert _state_disk_line(cfg) is None  # writable: nothing to say
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        line = _state_disk_line(cfg)
        assert line is not None and str(state) in line and "read-only" in line, line
        assert "in memory" in line
    finally:
        subprocess.run(["umount", str(state)], check=False)
