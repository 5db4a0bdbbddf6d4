"""The simulated sysfs tree lives in memory (runtime/device/simdevice.py default_root). Found
in an outside run (2026-12-07): under `<state_dir>/sim-sysfs` the plant's writes, a few files
every step, were counted as the daemon's own disk writes (3.7-5.4 GB a day for a simulated
solar node) and `edgerun check` gave its card 13 days."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.device.profiles import load_profile
from runtime.device.simdevice import SHM, SimulatedDevice, default_root


def _write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def test_the_default_root_is_in_memory_one_per_state_dir(tmp_path):
    if not SHM.is_dir():
        pytest.skip("no /dev/shm on this box: the tree goes under the state directory")
    a, b = default_root(tmp_path / "a"), default_root(tmp_path / "b")
    assert a.parent == SHM and b.parent == SHM and a != b
    assert default_root(tmp_path / "a") == a  # the same daemon finds its tree again
    assert default_root(tmp_path / "a", shm=tmp_path / "none") == tmp_path / "a" / "sim-sysfs"


def test_a_simulated_day_writes_nothing_to_the_state_disk(tmp_path):
    if not SHM.is_dir():
        pytest.skip("no /dev/shm on this box")
    device = load_profile("solar-node")
    root = default_root(tmp_path / "state")
    try:
        sim = SimulatedDevice(device, root, "sun", 1.0, 9.0, lambda: (None, 0.0), 0.02)
        before = _write_bytes()
        for _ in range(600):  # ten simulated minutes in 1 s ticks
            sim.advance(1.0)
        written = _write_bytes() - before
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    # 600 steps under the state directory dirtied ~2 pages a step (measured: 4.9 MB)
    assert written < 64 * 1024, f"{written} bytes written for the simulated sysfs tree"
