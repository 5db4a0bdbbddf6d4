"""`edgerun check` says whether `[sleep]` can work on this board, as `serve` will judge it
(runtime/device/sleep.py create). Outside run 2026-12-07: `[sleep] enabled = true` on the rpi5
profile (which cannot suspend) checked `ok` with no word about sleep; `serve` then ran awake
with a critical sleep_disabled event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env


def _check(tmp_path: Path, profile: str, root: Path) -> tuple[int, list[str]]:
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[device]\nprofile = "{profile}"\nsysfs_root = "{root}"\n'
                   '[governor]\npolicy = "off"\n'
                   f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                   "[sleep]\nenabled = true\nevery_s = 300\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=child_env())
    return r.returncode, [line for line in r.stderr.splitlines() if line.startswith("sleep:")]


def _sysfs(root: Path, offered: str = "freeze mem disk") -> Path:
    (root / "sys/class/rtc/rtc0").mkdir(parents=True)
    (root / "sys/class/rtc/rtc0/wakealarm").write_text("")
    (root / "sys/power").mkdir(parents=True)
    (root / "sys/power/state").write_text(offered + "\n")
    return root


@pytest.mark.parametrize("profile, offered, says", [
    ("rpi5", "freeze mem disk", "device profile rpi5 cannot suspend ([states] can_suspend)"),
    ("solar-node", "freeze", "offers ['freeze'], not 'mem'"),
    ("solar-node", None, "wakealarm does not exist"),
    ("solar-node", "freeze mem disk", "every 300 s"),
])
def test_check_says_whether_the_board_can_sleep(tmp_path, profile, offered, says):
    root = _sysfs(tmp_path / "root", offered) if offered else tmp_path / "root"
    root.mkdir(exist_ok=True)
    code, lines = _check(tmp_path, profile, root)
    assert code == 0  # never fatal: serve runs awake and says why
    assert len(lines) == 1, lines
    assert says in lines[0], lines
    if says != "every 300 s":
        assert "runs awake" in lines[0], lines
