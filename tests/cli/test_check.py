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
