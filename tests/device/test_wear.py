"""Bytes written a day and a card's life at that rate (runtime/device/wear.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.config import ConfigError, from_dict
from runtime.device import wear

DAY = 86400.0


@pytest.mark.parametrize("per_day, tbw, days", [
    (None, 10.0, None),  # no rate yet
    (0.0, 10.0, None),  # nothing written: no end in sight, not a number
    (1e9, 0.0, None),  # rating unknown
    (1e9, 10.0, 10_000.0),  # 1 GB a day on a 10 TBW card
    (15e9, 10.0, 10e12 / 15e9),  # the outbox before the log: ~15 GB a day at 10 results/s
    (2.4e6 * 86.4, 30.0, 30e12 / (2.4e6 * 86.4)),
    # a rating the config takes (finite) whose life overflows: no number, not inf (health is
    # JSON without Infinity: an inf here would refuse the whole health message)
    (24.0, 1e300, None),
])
def test_life_days(per_day, tbw, days):
    got = wear.life_days(per_day, tbw)
    assert got == (None if days is None else pytest.approx(days))


@pytest.mark.parametrize("samples, per_day", [
    ([], None),
    ([(0.0, 0)], None),
    ([(0.0, 0), (30.0, 1000)], None),  # under MIN_SPAN_S: the start's writes
    ([(0.0, 0), (60.0, 6000)], 6000 / 60 * DAY),
    ([(0.0, 5000), (100.0, 1000)], None),  # a counter that went back: not a rate
])
def test_rate_over_the_window(samples, per_day):
    r = wear.WriteRate()
    for t, n in samples:
        r.add(t, n)
    assert r.per_day() == (None if per_day is None else pytest.approx(per_day))


def test_the_window_slides_and_keeps_its_oldest_sample_inside():
    r = wear.WriteRate(window_s=100.0)
    for i in range(0, 301, 10):  # 10 bytes a second, then 0 after t=200
        r.add(float(i), min(i, 200) * 10)
    assert r.span_s() == pytest.approx(100.0)
    assert r.per_day() == 0.0  # the last 100 s wrote nothing
    rep = wear.report(r, 0.0)
    assert rep == {"write_bytes_per_day": 0, "card_write_bytes_per_day": None,
                   "window_s": 100.0, "rated_tbw": None, "life_days": None}


def test_report_with_a_rating():
    r = wear.WriteRate()
    r.add(0.0, 0)
    r.add(600.0, 600 * 1000)  # 1 kB/s
    rep = wear.report(r, 1.0)
    assert rep["write_bytes_per_day"] == 86_400_000
    assert rep["window_s"] == 600.0  # two samples already span a window
    assert rep["life_days"] == pytest.approx(1e12 / 86.4e6, abs=0.1)


def test_the_cards_life_is_taken_from_the_cards_rate_when_known():
    daemon, card = wear.WriteRate(), wear.WriteRate()
    for t, mine, all_ in ((0.0, 0, 0), (600.0, 600 * 1000, 600 * 6000)):  # 1 kB/s, 6 kB/s
        daemon.add(t, mine)
        card.add(t, all_)
    rep = wear.report(daemon, 1.0, card)
    assert rep["write_bytes_per_day"] == 86_400_000
    assert rep["card_write_bytes_per_day"] == 6 * 86_400_000
    assert rep["life_days"] == pytest.approx(1e12 / (6 * 86.4e6), abs=0.1)
    assert wear.report(daemon, 1.0, wear.WriteRate())["life_days"] == pytest.approx(
        1e12 / 86.4e6, abs=0.1)  # the card not measured: the daemon's rate


def _stat_line(sectors_written: int) -> str:
    """A block device's stat line (Documentation/block/stat.rst: the 7th field)."""
    return f"  100 0 800 50 {sectors_written // 10} 0 {sectors_written} 70 0 60 120 0 0 0 0\n"


def test_the_card_is_the_block_device_holding_the_path(tmp_path):
    dev = os.stat(tmp_path).st_dev
    if os.major(dev) == 0:
        pytest.skip(f"{tmp_path} is on no block device here (major 0: tmpfs or overlay)")
    stat = tmp_path / "root/sys/dev/block" / f"{os.major(dev)}:{os.minor(dev)}" / "stat"
    stat.parent.mkdir(parents=True)
    stat.write_text(_stat_line(2048))
    assert wear.card_written(tmp_path, tmp_path / "root") == 2048 * 512
    stat.write_text("garbage\n")
    assert wear.card_written(tmp_path, tmp_path / "root") is None
    assert wear.card_written(tmp_path, tmp_path / "nothing") is None  # no such device file


@pytest.mark.parametrize("major, minor, written", [
    (8, 17, 2048 * 512),  # a partition (sdb1): its own counter, not the disk's nor sda's
    (179, 2, 2048 * 512),  # a card's second partition (mmcblk0p2)
    (0, 42, None),  # major 0 (tmpfs, overlay, NFS): no card, even where a file says one
])
def test_the_card_is_the_device_numbers_of_the_path(tmp_path, monkeypatch, major, minor,
                                                    written):
    """Which block device's counter is read, for device numbers this machine may not have
    (its test directory may be on a disk's minor 0, or on tmpfs): os.stat is the boundary."""
    root = tmp_path / "root"
    for mm, sectors in ((f"{major}:{minor}", 2048), (f"{major}:0", 1), ("8:0", 3)):
        stat = root / "sys/dev/block" / mm / "stat"
        stat.parent.mkdir(parents=True, exist_ok=True)
        stat.write_text(_stat_line(sectors))
    real_stat = os.stat
    state = tmp_path / "state"

    def fake_stat(path, *a, **k):
        if Path(path) == state:
            return os.stat_result((0o40755, 1, os.makedev(major, minor), 1, 0, 0, 0, 0, 0, 0))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(wear.os, "stat", fake_stat)
    assert wear.card_written(state, root) == written


def test_a_path_on_no_block_device_has_no_card():
    assert wear.card_written(Path("/proc")) is None  # major 0, like tmpfs and overlay


def test_this_machines_card_counter_grows_with_a_synced_write(tmp_path):
    before = wear.card_written(tmp_path)
    if before is None:
        pytest.skip(f"{tmp_path} is on no block device the kernel counts here")
    with open(tmp_path / "f", "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert wear.card_written(tmp_path) >= before + (1 << 20)


def test_this_process_write_bytes_is_read_and_grows(tmp_path):
    before = wear.read_write_bytes()
    if before is None:
        pytest.skip("this kernel does not report /proc/self/io write_bytes")
    with open(tmp_path / "f", "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert wear.read_write_bytes() >= before + (1 << 20)


def test_missing_proc_io_is_none(tmp_path):
    assert wear.read_write_bytes(tmp_path / "io") is None


@pytest.mark.parametrize("value, ok", [(0.0, True), (600.0, True), (-1.0, False)])
def test_storage_section(value, ok):
    if ok:
        assert from_dict({"storage": {"rated_tbw": value}}).storage.rated_tbw == value
    else:
        with pytest.raises(ConfigError, match="rated_tbw"):
            from_dict({"storage": {"rated_tbw": value}})


def test_the_last_mount_at_a_point_is_the_one_in_force():
    """Mounted over (an ext4 on / over the initramfs' rootfs): /proc/mounts lists both, and
    the later line is what holds the path now, so its options are the ones to judge."""
    mounts = ("rootfs / rootfs rw 0 0\n"
              "/dev/mmcblk0p2 / ext4 rw,relatime 0 0\n"
              "/dev/mmcblk0p3 /var/lib/edgerun ext4 rw,commit=60 0 0\n")
    assert wear.mount_of(Path("/srv/x"), mounts) == ("/", "ext4", ("rw", "relatime"))
    assert wear.mount_of(Path("/var/lib/edgerun/state"), mounts)[2] == ("rw", "commit=60")
