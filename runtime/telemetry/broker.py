"""A local MQTT broker as a child process: Mosquitto on a free port.

Used by the tests and benchmarks (a real broker, stopped and restarted at will) and by
`edgerun demo` when no broker is configured.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Block until something accepts connections on `port`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on port {port} after {timeout_s} s")


class Mosquitto:
    """`mosquitto -c conf` as a child process; `extra` lines go into its config."""

    def __init__(self, workdir: Path, extra: str = ""):
        if not shutil.which("mosquitto"):
            raise RuntimeError("mosquitto is not installed (apt install mosquitto)")
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        # As root, mosquitto drops to the `mosquitto` user and then cannot read password or
        # key files in a private temp dir; a test/demo broker has no reason to switch users.
        user = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                             f"persistence false\n{user}{extra}\n")
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Mosquitto:
        """Start and wait until it accepts connections."""
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf), "-v"],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        """Stop it (queued messages for offline clients are lost: persistence is off)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
