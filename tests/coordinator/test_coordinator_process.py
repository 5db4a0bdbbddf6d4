"""Review R3: a second coordinator on a busy API port; SIGHUP to a running coordinator."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from support.daemon_toml import coordinator_toml
from support.under_test import child_env

ROOT = Path(__file__).parents[2]


def _config(tmp_path: Path, broker, port: int, **keys: str) -> Path:
    """A coordinator config on the test broker with its API on `port`."""
    cfg = tmp_path / "coord.toml"
    cfg.write_text(coordinator_toml(broker.coordinator("t"), fleet="t",
                                    store=tmp_path / "c.db", http_port=port, **keys))
    return cfg


def _start(tmp_path: Path, broker) -> tuple[subprocess.Popen, Path, int]:
    """`edgerun coordinator` with its API on a free port: the process, its log, the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _config(tmp_path, broker, port)
    log = tmp_path / "coord.log"
    with log.open("w") as out:
        p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator", "--config",
                              str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                             env=child_env())
    return p, log, port


def test_a_busy_api_port_stops_start_up_before_the_broker_login(tmp_path, broker):
    """`edgerun coordinator` while one already runs (same config): it logged in to the broker
    first, with the fleet's fixed client id, which took over the running coordinator's MQTT
    session (it was disconnected), and then died with a traceback on the port. Now the port
    is checked first: one line, exit 2, no login."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cfg = _config(tmp_path, broker, port, client_id="r3-second-coordinator")
    try:
        r = subprocess.run([sys.executable, "-m", "runtime.cli", "coordinator", "--config",
                            str(cfg)], capture_output=True, text=True, timeout=60,
                           env=child_env())
    finally:
        busy.close()
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"coordinator.http_port: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr
    assert "r3-second-coordinator" not in broker.log.read_text()  # never logged in


def test_sighup_does_not_stop_the_coordinator(tmp_path, broker):
    """SIGHUP's default action ended `edgerun coordinator` (R3): it now says it does not
    reload and keeps serving; SIGTERM still stops it cleanly."""
    import signal
    import time
    import urllib.request

    p, log, port = _start(tmp_path, broker)
    try:
        deadline = time.monotonic() + 60
        while "coordinator API on" not in log.read_text():
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        p.send_signal(signal.SIGHUP)
        while "does not reload" not in log.read_text():
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200  # still serving
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-2000:]
    finally:
        if p.poll() is None:
            p.kill()


def test_sighup_during_start_up_does_not_stop_the_coordinator(tmp_path, broker):
    """A SIGHUP while the coordinator was still starting (opening its store, logging in to
    the broker: the handler above exists only once the API serves) ended it: SIGHUP's
    default action, exit -1, nothing logged. A storm of them from the store's opening on
    must leave it running."""
    import os
    import signal
    import time

    def loading_sqlite(pid: int) -> bool:  # imported by cmd_coordinator, after main() began
        try:
            with open(f"/proc/{pid}/maps") as f:
                return "_sqlite3" in f.read()
        except OSError:
            return False

    p, log, _ = _start(tmp_path, broker)
    try:
        deadline = time.monotonic() + 60
        while not loading_sqlite(p.pid):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.001)
        sent = 0
        while "coordinator API on" not in log.read_text():
            assert p.poll() is None, f"ended by SIGHUP {sent}:\n{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            os.kill(p.pid, signal.SIGHUP)
            sent += 1
            time.sleep(0.01)
        assert sent > 0
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-2000:]
    finally:
        if p.poll() is None:
            p.kill()


def test_sigterm_says_the_coordinator_stopped(tmp_path, broker):
    """Outside run 2026-12-07: a coordinator stopped by SIGTERM (a restart mid-rollout) left
    no line in its log, so its log read the same as one killed -9 or crashed. It now says
    it stops, on which signal, and that it stopped."""
    import signal
    import time

    p, log, _ = _start(tmp_path, broker)
    try:
        deadline = time.monotonic() + 60
        while "coordinator API on" not in log.read_text():
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
    text = log.read_text()
    assert "coordinator stopping (SIGTERM)" in text, text[-2000:]
    assert text.rstrip().splitlines()[-1].endswith("coordinator stopped"), text[-2000:]
