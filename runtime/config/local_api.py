"""The `[local_api]` section: the device's loopback HTTP endpoint (runtime/device/local_api.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalApiConfig:
    """The `[local_api]` section."""

    port: int = 0  # 0 = off
    host: str = "127.0.0.1"  # no authentication: keep it on loopback unless firewalled
    stall_s: float = 30.0  # /healthz is 503 when the inference loop has not turned this long
    timeout_s: float = 5.0  # an idle or slow connection is closed after this

    def validate(self) -> tuple[str, str] | None:
        if not 0 <= self.port <= 65535:
            return "port", f"must be within 0..65535 (0 = off), got {self.port}"
        if not self.host:
            return "host", "must not be empty (127.0.0.1 keeps the endpoint on this box)"
        if self.stall_s <= 0:
            return "stall_s", f"must be > 0, got {self.stall_s}"
        if self.timeout_s <= 0:
            return "timeout_s", f"must be > 0, got {self.timeout_s}"
        return None
