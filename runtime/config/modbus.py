"""The `[modbus]` section: a Modbus TCP server a PLC triggers inspections through and reads
verdicts from (runtime/telemetry/modbus_server.py, the register map in
runtime/telemetry/modbus_map.py, docs/plc.md). Standard library only.

Modbus TCP has no security at all: no login, no encryption, any client that reaches the port
can write. The server therefore listens on loopback unless `allow_remote = true` says the
line's network is trusted (a PLC cell behind its own switch); the daemon logs a warning then.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.opcua import is_loopback

MAX_CONNECTIONS = 64  # a PLC or two and an HMI: more is a misconfigured scanner
BLOCK = 16  # holding registers per triggered source (runtime/telemetry/modbus_map.py)
ADDRESSES = 65536  # Modbus addresses are 16-bit


@dataclass(frozen=True)
class ModbusConfig:
    """The `[modbus]` section (off unless enabled)."""

    enabled: bool = False
    host: str = "127.0.0.1"  # the address listened on; anything but loopback: allow_remote
    port: int = 5020  # Modbus's 502 needs root (CAP_NET_BIND_SERVICE); 0: any free port
    # Modbus has no security: a non-loopback host must be allowed explicitly (logged loudly)
    allow_remote: bool = False
    unit_id: int = 1  # the unit (slave) id answered; requests to any other are refused
    max_connections: int = 8  # the next TCP connection is closed at once
    coil_base: int = 0  # PartPresent of the k-th Modbus-triggered source is coil_base + k
    register_base: int = 0  # its holding registers start at register_base + 16 k
    # the Class register holds the result's label's index in this list, from 1 (0: not in
    # it); the bundled model's labels by default
    classes: tuple[str, ...] = ("ok", "scratch", "dent", "stain", "missing_part")
    # a result whose label is one of these is Verdict 1 (OK), any other 2 (NOK)
    ok_labels: tuple[str, ...] = ("ok", "none")
    max_pending: int = 1000  # PLC edges queued per source; past it a trigger is refused

    def validate(self) -> tuple[str, str] | None:
        if not 0 <= self.port <= 65535:
            return "port", f"must be within 0..65535, got {self.port}"
        if not self.host or any(c.isspace() for c in self.host):
            return "host", f"must be an address or host name, got {self.host!r}"
        if self.enabled and not is_loopback(self.host) and not self.allow_remote:
            return "allow_remote", (
                f"Modbus TCP has no login and no encryption: any machine that reaches "
                f"{self.host}:{self.port} can trigger inspections. Set allow_remote = true "
                "only on a trusted cell network, or host = \"127.0.0.1\"")
        if not 1 <= self.unit_id <= 247:
            return "unit_id", f"must be within 1..247, got {self.unit_id}"
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            return "max_connections", (f"must be within 1..{MAX_CONNECTIONS}, got "
                                       f"{self.max_connections}")
        if not 0 <= self.coil_base < ADDRESSES:
            return "coil_base", f"must be within 0..{ADDRESSES - 1}, got {self.coil_base}"
        if not 0 <= self.register_base < ADDRESSES:
            return "register_base", (f"must be within 0..{ADDRESSES - 1}, got "
                                     f"{self.register_base}")
        if not 1 <= self.max_pending <= 100_000:
            return "max_pending", f"must be within 1..100000, got {self.max_pending}"
        if not self.ok_labels or any(not s for s in self.ok_labels):
            return "ok_labels", "must list at least one label, none of them empty"
        if any(not s for s in self.classes) or len(set(self.classes)) != len(self.classes):
            return "classes", "must list distinct, non-empty labels"
        if len(self.classes) > 65534:
            return "classes", f"at most 65534 labels, got {len(self.classes)}"
        return None

    def fits(self, sources: int) -> tuple[str, str] | None:
        """Whether `sources` triggered sources' coils and register blocks fit the 16-bit
        address space (checked with the sources: the section alone cannot know)."""
        if self.coil_base + sources > ADDRESSES:
            return "coil_base", (f"{sources} sources' coils from {self.coil_base} pass "
                                 f"address {ADDRESSES - 1}")
        if self.register_base + BLOCK * sources > ADDRESSES:
            return "register_base", (f"{sources} sources' {BLOCK}-register blocks from "
                                     f"{self.register_base} pass address {ADDRESSES - 1}")
        return None
