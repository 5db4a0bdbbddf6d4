"""A local MQTT broker as a child process: Mosquitto on a free port.

Used by the tests and benchmarks (a real broker, stopped and restarted at will) and by
`edgerun demo` when no broker is configured. Authentication and ACLs are on by default, with
the same files and username convention as a real fleet (`runtime/wire/brokerauth.py`):
`device()`, `coordinator()` and `client()` enrol an identity and return the BrokerConfig
that logs in as it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from runtime.config.telemetry import BrokerConfig
from runtime.wire.brokerauth import BrokerAuth, Identity, device_username, write_secret


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_login(port: int, username: str, password: str, timeout_s: float = 2.0) -> bool:
    """Whether the broker on 127.0.0.1:`port` accepts this username and password (MQTT 3.1.1
    CONNECT; False on refusal or timeout)."""
    import paho.mqtt.client as mqtt

    result: list[bool] = []
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         protocol=mqtt.MQTTv311)
    client.username_pw_set(username, password)
    client.on_connect = lambda c, u, f, rc, p: result.append(not rc.is_failure)
    try:
        client.connect("127.0.0.1", port, 5)
        deadline = time.monotonic() + timeout_s
        while not result and time.monotonic() < deadline:
            client.loop(0.05)
        client.disconnect()
    except OSError:
        return False
    return bool(result and result[0])


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Block until something accepts connections on `port`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on port {port} after {timeout_s} s")


# Where Debian and Raspberry Pi OS put daemons: not on a normal user's PATH.
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"


def mosquitto_path() -> str | None:
    """The mosquitto binary: on PATH, else in SBIN_DIRS."""
    return shutil.which("mosquitto") or shutil.which("mosquitto", path=SBIN_DIRS)


class Mosquitto:
    """`mosquitto -c conf` as a child process; `extra` lines go into its config.

    `auth=True` (default): `allow_anonymous false`, a password file and an ACL file in
    `workdir/broker-auth/`; `auth=False` is an open broker (for benchmarks that measure the
    transport alone)."""

    def __init__(self, workdir: Path, extra: str = "", auth: bool = True,
                 nodelay: bool = True):
        self.exe = mosquitto_path()
        if not self.exe:
            raise RuntimeError("mosquitto is not installed (apt install mosquitto)")
        self.port = free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.auth = BrokerAuth(workdir / "broker-auth") if auth else None
        if self.auth is not None:
            self.auth.ensure()  # the files must exist before mosquitto starts
            security = self.auth.conf_lines()
        else:
            security = "allow_anonymous true\n"
        # As root, mosquitto drops to the `mosquitto` user and then cannot read password or
        # key files in a private temp dir; a test/demo broker has no reason to switch users.
        user = "user root\n" if os.geteuid() == 0 else ""
        # set_tcp_nodelay: small MQTT packets (acks, bundle chunk requests) would otherwise
        # wait behind a ~40 ms delayed ACK (bench/bundle_transfer.py, docs/ota.md)
        tcp = "set_tcp_nodelay true\n" if nodelay else ""
        self.conf.write_text(f"listener {self.port} 127.0.0.1\n{security}"
                             f"persistence false\n{tcp}{user}{extra}\n")
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None
        self._issued: dict[Identity, BrokerConfig] = {}

    def credentials(self, ident: Identity, keepalive_s: int = 30) -> BrokerConfig:
        """Enrol `ident` (new random password, written to a 0600 file next to the broker's
        files) and return the BrokerConfig that logs in as it. A running broker is reloaded
        (SIGHUP) and this returns once the new login works. Asking again for the same
        identity returns the same credentials (a new password would log out its holder)."""
        if self.auth is None:
            return BrokerConfig(host="127.0.0.1", port=self.port, keepalive_s=keepalive_s)
        if ident in self._issued:
            return replace(self._issued[ident], keepalive_s=keepalive_s)
        password = self.auth.enrol(ident)
        pw_file = write_secret(self.workdir / "broker-creds" /
                               (ident.username.replace("/", "__") + ".password"), password)
        if self.proc is not None and self.proc.poll() is None:
            self.reload(ident.username, password)
        cfg = BrokerConfig(host="127.0.0.1", port=self.port, keepalive_s=keepalive_s,
                           username=ident.username, password_file=str(pw_file))
        self._issued[ident] = cfg
        return cfg

    def device(self, fleet: str, device: str, read: tuple[str, ...] = (),
               keepalive_s: int = 30) -> BrokerConfig:
        """Credentials of device `device` of fleet `fleet` (username `fleet/device`)."""
        return self.credentials(Identity(device_username(fleet, device), "device", read=read),
                                keepalive_s)

    def coordinator(self, fleet: str, name: str = "coordinator",
                    keepalive_s: int = 30) -> BrokerConfig:
        """Credentials of a coordinator of `fleet`."""
        return self.credentials(Identity(name, "coordinator", fleets=(fleet,)), keepalive_s)

    def client(self, name: str, read: tuple[str, ...] = (), write: tuple[str, ...] = (),
               keepalive_s: int = 30) -> BrokerConfig:
        """Credentials of another client (a camera, a test probe) with explicit topics."""
        return self.credentials(Identity(name, "client", read=read, write=write), keepalive_s)

    def reload(self, username: str = "", password: str = "", timeout_s: float = 10.0) -> None:
        """SIGHUP: Mosquitto re-reads its password and ACL files. The reload is asynchronous:
        with a username, wait until that login is accepted; without one, until the broker's
        log says it reloaded (it logs before reloading, on its one thread: a packet it reads
        after that line meets the new files). A revocation or an ACL change is then in force
        when this returns (was: not yet, for a caller that checked at once)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        before = 0 if username else self._reloads()
        self.proc.send_signal(signal.SIGHUP)
        if not username:
            deadline = time.monotonic() + timeout_s
            while self._reloads() <= before:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mosquitto did not reload {timeout_s} s after SIGHUP")
                time.sleep(0.02)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if can_login(self.port, username, password):
                return
            time.sleep(0.05)
        raise TimeoutError(f"mosquitto did not accept {username!r} {timeout_s} s after SIGHUP")

    def _reloads(self) -> int:
        """How many reloads the broker's log (-v) records."""
        try:
            return self.log.read_bytes().count(b"Reloading config.")
        except OSError:
            return 0

    def start(self, own_group: bool = False) -> Mosquitto:
        """Start and wait until it accepts connections; `own_group`: in its own process
        group, so a terminal's Ctrl-C reaches only its parent, which stops it in order."""
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf), "-v"],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     process_group=0 if own_group else None)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        """Stop it (queued messages for offline clients are lost: persistence is off)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
