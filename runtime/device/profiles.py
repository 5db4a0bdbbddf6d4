"""Reading a device profile (firmware_config/devices/*.toml or a path) into power.device's
typed classes, with the config schema: power/ receives typed data and parses no TOML."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from power.device import DeviceProfile
from runtime.config.schema import ConfigInvalid, load_toml


def profile_path(name_or_path: str) -> Path:
    """Resolve a profile name (bundled) or a path to a .toml file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return p
    bundled = resources.files("firmware_config") / "devices" / f"{name_or_path}.toml"
    path = Path(str(bundled))
    if not path.exists():
        known = sorted(x.name.removesuffix(".toml") for x in path.parent.glob("*.toml"))
        # a name no bundled profile has is a typo in the config: a restart cannot help
        raise ConfigInvalid(
            f"device profile '{name_or_path}' not found (bundled profiles: {', '.join(known)};"
            " or give a path to a .toml file)"
        )
    return path


def load_profile(name_or_path: str) -> DeviceProfile:
    """Load and validate a device profile."""
    return load_toml(profile_path(name_or_path), DeviceProfile)
