"""Review R3: `edgerun check` says what `serve` would only report after start-up about its
sources (as source_failed, retried for ever)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.under_test import child_env

ROOT = Path(__file__).parents[2]


def _check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[governor]\npolicy = "off"\n{source}')
    return subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                          capture_output=True, text=True, timeout=120,
                          env=child_env())


def test_check_notes_sources_serve_could_not_read(tmp_path):
    r = _check(tmp_path, f"""
[[sources]]
name = "plc"
kind = "trigger"
topic = "plc/line1/trigger"
rate_hz = 5
[[sources]]
name = "inbox"
kind = "folder"
path = "{tmp_path / 'missing'}"
rate_hz = 5
[[sources]]
name = "replay"
kind = "capture"
path = "{tmp_path / 'line.mp4'}"
rate_hz = 5
[[sources]]
name = "cam"
kind = "capture"
path = "rtsp://user:secret@10.0.0.21/stream1"
rate_hz = 5
""")
    assert r.returncode == 0, r.stderr  # a note, not an error: serve runs and retries
    lines = [x for x in r.stderr.splitlines() if x.startswith("source ")]
    assert lines[0].startswith("source plc: trigger; note: a trigger source needs "
                               "telemetry.broker.host")
    assert lines[1] == (f"source inbox: folder {tmp_path / 'missing'}; note: "
                        f"{tmp_path / 'missing'} is not a directory (yet?) (serve starts and "
                        "retries it with backoff)")
    assert "line.mp4 does not exist" in lines[2]
    assert lines[3] == "source cam: capture rtsp://***@10.0.0.21/stream1"  # no password
    assert "secret" not in r.stderr


def test_check_is_quiet_about_sources_that_are_there(tmp_path):
    (tmp_path / "inbox").mkdir()
    r = _check(tmp_path, f'[source]\nkind = "folder"\npath = "{tmp_path / "inbox"}"\n')
    assert r.returncode == 0
    assert f"source main: folder {tmp_path / 'inbox'}\n" in r.stderr


def test_the_example_on_a_box_without_a_thermometer_says_first_what_to_change(tmp_path):
    """The first thing a new user runs: `edgerun check` on the example config, on a machine
    with no thermometer (an empty sysfs tree here, so it is the same on every host). Exit 1,
    and what to change comes before the long resolved config, not only after it."""
    example = (ROOT / "firmware_config/examples/edgerun.toml").read_text()
    assert 'sysfs_root = "/"' in example
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(example.replace('sysfs_root = "/"', f'sysfs_root = "{tmp_path}"', 1))
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120, env=child_env())
    assert r.returncode == 1, r.stdout
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("INFO ")]
    assert lines[0] == f"{cfg}: would NOT run on this machine; change:", r.stdout
    assert lines[1].startswith('  - [governor] policy = "step_wise" needs a thermometer and '
                               f"none was found under {tmp_path}"), r.stdout
    assert 'set [governor] policy = "off"' in lines[1] and "zone_type" in lines[1]
    assert lines.index("{") > 1  # the resolved config after it
    assert lines[-1] == f"{cfg}: config ok, sensors NOT ok"


def test_a_config_that_would_run_says_nothing_up_front(tmp_path):
    r = _check(tmp_path, "")
    assert r.returncode == 0, r.stderr
    assert "would NOT run" not in r.stderr and r.stderr.rstrip().endswith(": ok")
