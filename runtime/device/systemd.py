"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET per state change."""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    """READY=1, WATCHDOG=1, STATUS=..., STOPPING=1 to systemd (no-ops outside systemd)."""

    def __init__(self, env: dict[str, str] | None = None):
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr = ("\0" + addr[1:]) if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and ours else 0.0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self._addr else None

    @property
    def enabled(self) -> bool:
        """True when running under systemd with a notify socket."""
        return self._sock is not None

    def send(self, *fields: str) -> None:
        """Send `KEY=value` fields in one datagram; errors are ignored (systemd may be gone)."""
        if self._sock is None:
            return
        with contextlib.suppress(OSError):
            self._sock.sendto("\n".join(fields).encode(), self._addr)

    def ready(self, status: str) -> None:
        """Start-up is complete."""
        self.send("READY=1", f"STATUS={status}")

    def watchdog(self) -> None:
        """The work loop made progress."""
        self.send("WATCHDOG=1")

    def status(self, status: str) -> None:
        """A one-line status for `systemctl status`."""
        self.send(f"STATUS={status}")

    def stopping(self) -> None:
        """Shutdown has begun."""
        self.send("STOPPING=1", "STATUS=stopping: draining in-flight frames")
