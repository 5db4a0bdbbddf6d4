"""The `[homeassistant]` section: MQTT discovery for Home Assistant (docs/homeassistant.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}(/[A-Za-z0-9_-]{1,64}){0,3}$")


@dataclass(frozen=True)
class HomeAssistantConfig:
    """The `[homeassistant]` section."""

    enabled: bool = False
    discovery_prefix: str = "homeassistant"  # HA's default; change it only if HA's is changed

    def validate(self) -> tuple[str, str] | None:
        if not _PREFIX.match(self.discovery_prefix):
            return "discovery_prefix", ("must be topic levels of A-Z a-z 0-9 _ - separated by "
                                        f"'/', no wildcards, got {self.discovery_prefix!r}")
        return None
