"""Device profiles: what a kind of box has (sensors, power model), from firmware_config/devices."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from runtime.schema import ConfigError, load_toml


@dataclass(frozen=True)
class PowerModel:
    """Coefficients of the estimated meter: P = idle_w + active_w_per_core * busy cores."""

    idle_w: float
    active_w_per_core: float
    basis: str = "assumed"  # measured | cited | assumed: where the numbers come from

    def validate(self) -> tuple[str, str] | None:
        if self.idle_w < 0 or self.active_w_per_core <= 0:
            return "active_w_per_core", "power coefficients must be positive"
        return None


@dataclass(frozen=True)
class SensorPaths:
    """sysfs paths relative to the sysfs root; empty means 'probe the usual places'."""

    rapl: tuple[str, ...] = ()  # e.g. "sys/class/powercap/intel-rapl/intel-rapl:0"
    hwmon_power: tuple[str, ...] = ()  # e.g. "sys/class/hwmon/hwmon2/power1_input"
    hwmon_energy: tuple[str, ...] = ()
    battery: str = ""  # e.g. "sys/class/power_supply/BAT0"


@dataclass(frozen=True)
class DeviceProfile:
    """One kind of device."""

    name: str
    description: str
    power: PowerModel
    sensors: SensorPaths = field(default_factory=SensorPaths)


def profile_path(name_or_path: str) -> Path:
    """Resolve a profile name (bundled) or a path to a .toml file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return p
    bundled = resources.files("firmware_config") / "devices" / f"{name_or_path}.toml"
    path = Path(str(bundled))
    if not path.exists():
        known = sorted(x.name.removesuffix(".toml") for x in path.parent.glob("*.toml"))
        raise ConfigError(
            f"device profile '{name_or_path}' not found (bundled profiles: {', '.join(known)};"
            " or give a path to a .toml file)"
        )
    return path


def load_profile(name_or_path: str) -> DeviceProfile:
    """Load and validate a device profile."""
    return load_toml(profile_path(name_or_path), DeviceProfile)
