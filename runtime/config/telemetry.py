"""The `[telemetry]` section: broker, identity, outbox and delivery settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # no MQTT wildcards or separators in ids


def check_name(what: str, value: str) -> str | None:
    """Why `value` cannot be a fleet/device id in a topic, or None when it can."""
    if not _NAME.match(value):
        return (f"{what} must be 1-64 characters of A-Z a-z 0-9 _ . - (it is a topic level), "
                f"got {value!r}")
    return None


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the broker; all paths empty = plain TCP."""

    ca: str = ""
    cert: str = ""
    key: str = ""


@dataclass(frozen=True)
class BrokerConfig:
    """Where the MQTT broker is and how to log in. host empty = no broker (demo embeds one)."""

    host: str = ""
    port: int = 1883
    keepalive_s: int = 30
    username: str = ""
    password_file: str = ""  # a file holding the password, so configs can be world-readable
    tls: TlsConfig = field(default_factory=TlsConfig)
    protocol: Literal["3.1.1", "5"] = "5"

    def validate(self) -> tuple[str, str] | None:
        if not 0 < self.port < 65536:
            return "port", f"must be 1..65535, got {self.port}"
        if self.keepalive_s < 2:
            return "keepalive_s", f"must be >= 2, got {self.keepalive_s}"
        return None


@dataclass(frozen=True)
class OutboxConfig:
    """The durable queue between the pipeline and the broker."""

    path: str = "~/.local/state/edgerun/outbox.db"
    fsync: Literal["full", "normal"] = "normal"  # full: survives power loss; normal: process crash
    max_bytes: int = 256 * 1024 * 1024  # results past this evict the oldest (event + counter)
    health_keep: int = 20  # only the latest N health messages wait for the broker
    event_keep: int = 1000
    # while the disk refuses writes (full): results wait in memory up to this many bytes of
    # JSON (past it new ones are refused, counted) and a write is retried every retry_s
    memory_max_bytes: int = 16 * 1024 * 1024
    retry_s: float = 5.0
    # A result is first appended to the result log (`<path>.log`: its own bytes, nothing
    # more); those still unacked after spill_after_s, or past spill_bytes, move into the
    # database in one transaction. 0 = every result straight into the database (a
    # page-sized write or more each: docs/telemetry.md, "Disk writes").
    spill_after_s: float = 60.0
    spill_bytes: int = 1024 * 1024
    log_restart_bytes: int = 1024 * 1024  # an all-acked log past this starts again

    def validate(self) -> tuple[str, str] | None:
        if self.max_bytes < 64 * 1024:
            return "max_bytes", f"must be >= 65536, got {self.max_bytes}"
        # one key a check, named by itself: the key locates the line in the file
        if self.memory_max_bytes < 0:
            return "memory_max_bytes", f"must be >= 0, got {self.memory_max_bytes}"
        if not 0.1 <= self.retry_s <= 3600:
            return "retry_s", f"must be within 0.1..3600, got {self.retry_s}"
        if not 0 <= self.spill_after_s <= 86400:
            return "spill_after_s", f"must be within 0..86400, got {self.spill_after_s}"
        if self.spill_bytes < 4096:
            return "spill_bytes", f"must be >= 4096, got {self.spill_bytes}"
        if self.log_restart_bytes < 4096:
            return "log_restart_bytes", f"must be >= 4096, got {self.log_restart_bytes}"
        for key in ("health_keep", "event_keep"):
            if getattr(self, key) < 1:
                return key, f"must be >= 1, got {getattr(self, key)}"
        return None


@dataclass(frozen=True)
class TelemetryConfig:
    """Identity, broker, outbox and delivery tuning of one device."""

    fleet: str = "default"
    device: str = ""  # empty = the host name
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    batch_max: int = 50  # results per MQTT message when a backlog exists
    inflight: int = 200  # results published but not yet acked by the coordinator
    ack_timeout_s: float = 10.0  # re-send unacked results after this long without ack progress
    health_interval_s: float = 5.0
    # Also publish each result as its own message on `.../result/each` (Node-RED, Home
    # Assistant): best effort, at most once per process; the batched `result` topic stays the
    # durable, acked path to the coordinator (docs/homeassistant.md).
    result_per_message: bool = False
    trusted_keys: tuple[str, ...] = ()  # Ed25519 public keys (PEM files) allowed to command
    # Ed25519 private key (PEM or raw 32 bytes) signing this device's command replies; empty =
    # `<state_dir>/device.key`, made at first start (0600) with `device.pub` beside it.
    device_key: str = ""
    max_command_bytes: int = 8192
    clock_skew_s: float = 300.0  # commands issued this far in the future are still accepted
    # the longest command lifetime (expires_at - issued_at) accepted, and so how long an id is
    # remembered against replay; a sleeper's cap is raised to cover its broker session
    # ([sleep] session_expiry_s + 1 h), so commands queued for its wake still fit
    max_command_ttl_s: float = 86400.0

    def validate(self) -> tuple[str, str] | None:
        for key in ("fleet", "device"):
            value = getattr(self, key)
            if value and (why := check_name(key, value)):
                return key, why
        if self.batch_max < 1:
            return "batch_max", f"must be >= 1, got {self.batch_max}"
        if self.inflight < self.batch_max:
            return "inflight", (f"need 1 <= batch_max <= inflight, "
                                f"got {self.batch_max}, {self.inflight}")
        for key in ("ack_timeout_s", "health_interval_s"):  # the one set wrong, by name
            if getattr(self, key) <= 0:
                return key, f"must be > 0, got {getattr(self, key)}"
        # Either below refused every command (too small, or "issued in the future" for all):
        # a device no one can command, roll back or re-deploy remotely.
        if not 1024 <= self.max_command_bytes <= 1 << 20:
            return "max_command_bytes", ("must be 1024..1048576 (a signed deploy is ~1 KiB), "
                                         f"got {self.max_command_bytes}")
        if self.clock_skew_s < 0:
            return "clock_skew_s", f"must be >= 0, got {self.clock_skew_s}"
        # below a minute refuses the coordinator's own 60 s commands; a month is already far
        # more than any command needs (a sleeper gets its session on top, see above)
        if not 60 <= self.max_command_ttl_s <= 30 * 86400:
            return "max_command_ttl_s", ("must be 60..2592000 s (a minute to 30 days), got "
                                         f"{self.max_command_ttl_s}")
        return None
