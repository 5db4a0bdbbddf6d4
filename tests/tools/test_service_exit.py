"""How the services exit when they refuse to start, read against their units' restart rules:
a config file whose content is refused stops the unit (systemd does not restart it every 5 s
for ever); what may come right by itself (the file not there yet) is retried."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

UNITS = Path(__file__).resolve().parents[2] / "systemd"
UNIT = {"serve": "edgerun.service", "coordinator": "edgerun-coordinator.service"}


def _prevented(unit: str) -> set[int]:
    """The exit statuses after which systemd does not restart `unit`."""
    text = (UNITS / unit).read_text()
    assert re.search(r"^Restart=on-failure$", text, re.M), unit
    return {int(v) for m in re.finditer(r"^RestartPreventExitStatus=(.*)$", text, re.M)
            for v in m.group(1).split()}


@pytest.mark.parametrize(("command", "content", "stops", "says"), [
    ("serve", "[daemon]\nqueue_size = 0\n", True, "queue_size"),
    ("serve", "[daemon\n", True, "not valid TOML"),
    ("serve", "[no_such_section]\n", True, "no_such_section"),
    ("serve", None, False, "cannot read"),  # not provisioned yet: retried
    ("serve", b"[daemon]\nqueue_size = 1 # \xe9t\xe9\n", True, "not UTF-8"),  # Latin-1
    # a model path on a mount not up yet, or provisioned after the config: retried; a bare
    # name not among the bundled models is a typo
    ("serve", '[[sources]]\nname = "a"\nkind = "synthetic"\nmodel = "/mnt/later/d.onnx"\n',
     False, "no model there"),
    ("serve", '[[sources]]\nname = "a"\nkind = "synthetic"\nmodel = "inspecton"\n', True,
     "no model there"),
    ("serve", '[source]\nkind = "pylon"\nfeatures_file = "/mnt/later/cam.pfs"\n', False,
     "no such file"),
    ("coordinator", "[coordinator]\nretention_days = -1\n", True, "retention_days"),
    ("coordinator", "[coordinator]\n", True, "coordinator.broker.host is not set"),
    ("coordinator", None, False, "cannot read"),
])
def test_a_refused_config_stops_the_unit_and_a_missing_one_is_retried(
        tmp_path, command, content, stops, says):
    cfg = tmp_path / "edgerun.toml"
    if isinstance(content, bytes):
        cfg.write_bytes(content)
    elif content is not None:
        cfg.write_text(content)
    r = subprocess.run([sys.executable, "-m", "runtime.cli", command, "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120,
                       env=child_env(HOME=str(tmp_path)))
    assert r.returncode != 0, r.stderr[-2000:]
    assert (r.returncode in _prevented(UNIT[command])) is stops, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and str(cfg) in lines[0], r.stderr[-2000:]


def test_check_exits_2_on_a_refused_config(tmp_path):
    """`edgerun check` is for a person at a shell: 2, as for any usage error."""
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text("[daemon]\nqueue_size = 0\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 2, r.stderr[-2000:]


def test_an_unknown_device_profile_stops_the_unit(tmp_path):
    """A profile name that is no bundled profile is a typo in the config: no restart fixes
    it (a path to a .toml that is not there yet is retried, like the config itself)."""
    cfg = tmp_path / "edgerun.toml"
    for profile, stops in (("rpi5x", True), (str(tmp_path / "later.toml"), False)):
        cfg.write_text(f'[device]\nprofile = "{profile}"\n')
        r = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=120,
                           env=child_env(HOME=str(tmp_path)))
        assert r.returncode != 0, r.stderr[-2000:]
        assert (r.returncode in _prevented(UNIT["serve"])) is stops, (profile, r.returncode,
                                                                      r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and profile in lines[-1], r.stderr[-2000:]
