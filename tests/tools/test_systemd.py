"""The units pass `systemd-analyze verify` and the hardening bar."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"),
                                reason="systemd-analyze is not installed (.ci/run installs it)")


@pytest.mark.parametrize("unit", ["edgerun.service", "edgerun-coordinator.service"])
def test_unit_verifies(unit, tmp_path):
    # verify needs the ExecStart binary to exist: point it at the installed console script.
    exe = shutil.which("edgerun")
    assert exe, "the edgerun console script is not installed"
    text = (UNITS / unit).read_text().replace("/opt/edgerun/venv/bin/edgerun", exe)
    (tmp_path / unit).write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and unit not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("unit", ["edgerun.service", "edgerun-coordinator.service"])
def test_unit_exposure_at_most_2_5(unit):
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNITS / unit)],
                         capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= 2.5


def test_daemon_unit_is_notify_with_watchdog():
    text = (UNITS / "edgerun.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "StateDirectory=edgerun",
                 "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text
