"""The `[opcua]` section: the OPC UA server a PLC reads verdicts from and triggers inspections
through (runtime/telemetry/opcua_server.py, docs/plc.md). Standard library only.

Security "none" is accepted only on a loopback host: an unauthenticated, unencrypted server
that any machine on the line's network could write PartPresent on is refused at load, with
the keys that would make it safe named. Anything else is Basic256Sha256 (sign and encrypt)
with the server's own certificate and key, and clients identified by a user name and
password (`password_file`) or by a certificate in `trusted_certs`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

MAX_SESSIONS = 1000  # asyncua's own cap on TCP connections
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether `host` names this box only (127.0.0.0/8, ::1 or localhost): no wildcard
    (0.0.0.0, ::) and no interface address counts."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OpcUaConfig:
    """The `[opcua]` section (off unless enabled)."""

    enabled: bool = False
    host: str = "127.0.0.1"  # the address listened on; anything but loopback needs security
    port: int = 4840  # OPC UA's registered port (0: any free port, said in the log)
    # "none": only on loopback; "basic256sha256": Basic256Sha256, signed and encrypted
    security: Literal["none", "basic256sha256"] = "none"
    certificate: str = ""  # the server's certificate (DER or PEM), with security
    private_key: str = ""  # its private key (PEM), with security
    username: str = ""  # a client may log in with this name and the password in...
    password_file: str = ""  # ...this file (the config itself stays world-readable)
    trusted_certs: str = ""  # a directory of client certificates (.der/.pem) accepted
    max_sessions: int = 50  # the next CreateSession is refused with BadTooManySessions
    # a result whose label is one of these is Verdict "OK", any other "NOK" (the bundled
    # model's good class is "ok"; a detector that found nothing says "none")
    ok_labels: tuple[str, ...] = ("ok", "none")
    health_interval_s: float = 1.0  # counters, rung, model and health refreshed this often
    max_pending: int = 1000  # PLC edges queued per source; past it a trigger is refused

    def validate(self) -> tuple[str, str] | None:
        if not 0 <= self.port <= 65535:
            return "port", f"must be within 0..65535, got {self.port}"
        if not self.host or any(c.isspace() for c in self.host):
            return "host", f"must be an address or host name, got {self.host!r}"
        if not 1 <= self.max_sessions <= MAX_SESSIONS:
            return "max_sessions", f"must be within 1..{MAX_SESSIONS}, got {self.max_sessions}"
        if not 0.05 <= self.health_interval_s <= 3600:
            return "health_interval_s", f"must be within 0.05..3600, got {self.health_interval_s}"
        if not 1 <= self.max_pending <= 100_000:
            return "max_pending", f"must be within 1..100000, got {self.max_pending}"
        if not self.ok_labels or any(not s for s in self.ok_labels):
            return "ok_labels", "must list at least one label, none of them empty"
        if self.security == "none":
            if self.enabled and not is_loopback(self.host):
                return "security", (
                    f'"none" (no encryption, no login) is allowed only on loopback, and host '
                    f'is {self.host!r}: set security = "basic256sha256" with certificate, '
                    "private_key and username/password_file or trusted_certs, or host = "
                    '"127.0.0.1"')
            if self.username or self.password_file or self.trusted_certs:
                return "security", ('"none" takes no login: username, password_file and '
                                    'trusted_certs need security = "basic256sha256"')
            return None
        if not (self.certificate and self.private_key):
            return "certificate", ("security = \"basic256sha256\" needs the server's "
                                   "certificate and private_key")
        if bool(self.username) != bool(self.password_file):
            return "username", "username and password_file go together"
        if not (self.username or self.trusted_certs):
            return "username", ('security = "basic256sha256" needs a login: username with '
                                "password_file, or trusted_certs (client certificates)")
        return None
