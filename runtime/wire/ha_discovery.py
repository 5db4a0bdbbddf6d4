"""The Home Assistant discovery topics of a device: part of the wire contract.

The device publishes its retained discovery configs under them
(runtime/telemetry/homeassistant.py) and the coordinator's `fleet enroll --homeassistant`
grants exactly these topics in the broker ACL (runtime/coordinator/enroll.py); both read the
names from here, so the ACL and the configs cannot drift apart. Topic format:
`<discovery_prefix>/<component>/<node_id>/<object_id>/config`
(https://www.home-assistant.io/integrations/mqtt/, ids in `[a-zA-Z0-9_-]`).
"""

from __future__ import annotations

import re

ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")  # outside HA's id alphabet
COMPONENTS = ("sensor", "binary_sensor")  # the entity kinds a device publishes


def node_id(fleet: str, device: str) -> str:
    """The HA node id of a device: `edgerun_<fleet>_<device>` in HA's id alphabet."""
    return ID_UNSAFE.sub("_", f"edgerun_{fleet}_{device}")


def config_topic(prefix: str, component: str, fleet: str, device: str, obj: str) -> str:
    """The retained discovery config topic of one entity of a device."""
    return f"{prefix}/{component}/{node_id(fleet, device)}/{obj}/config"


def config_topics(prefix: str, fleet: str, device: str) -> tuple[str, ...]:
    """Topic filters this device's broker identity must be allowed to publish (ACL lines)."""
    return tuple(config_topic(prefix, component, fleet, device, "+")
                 for component in COMPONENTS)
