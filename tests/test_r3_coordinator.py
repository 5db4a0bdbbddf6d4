"""Review R3: a second coordinator on a busy API port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_a_busy_api_port_stops_start_up_before_the_broker_login(tmp_path, broker):
    """`edgerun coordinator` while one already runs (same config): it logged in to the broker
    first, with the fleet's fixed client id, which took over the running coordinator's MQTT
    session (it was disconnected), and then died with a traceback on the port. Now the port
    is checked first: one line, exit 2, no login."""
    creds = broker.coordinator("t")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cfg = tmp_path / "coord.toml"
    cfg.write_text(f"""[coordinator]
fleet = "t"
store = "{tmp_path / 'c.db'}"
http_port = {port}
client_id = "r3-second-coordinator"
[coordinator.broker]
host = "127.0.0.1"
port = {broker.port}
username = "{creds.username}"
password_file = "{creds.password_file}"
""")
    try:
        r = subprocess.run([sys.executable, "-m", "runtime.cli", "coordinator", "--config",
                            str(cfg)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        busy.close()
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"coordinator.http_port: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr
    assert "r3-second-coordinator" not in broker.log.read_text()  # never logged in
