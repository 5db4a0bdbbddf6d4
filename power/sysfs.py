"""Reading sysfs attributes under a configurable root, and listing the usual device nodes.

Everything here takes the sysfs root (normally `/`, a fixture tree in tests, the simulator's
tree in the demo) so the same code runs against a real board and a fake one.
"""

from __future__ import annotations

import re
from pathlib import Path

THERMAL = "sys/class/thermal"
HWMON = "sys/class/hwmon"
# INA3221 rails on Jetson are found under the i2c driver as well as under sys/class/hwmon
# (shared REFERENCE.md: /sys/bus/i2c/drivers/ina3221/*/hwmon/hwmonN/).
I2C_DRIVERS = "sys/bus/i2c/drivers"


class SensorError(OSError):
    """A sensor file is missing or holds garbage."""


def read_int(path: Path) -> int:
    """Read one integer sysfs attribute; garbage or absence raises SensorError."""
    try:
        raw = path.read_text().strip()
    except OSError as e:
        raise SensorError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        return int(raw)
    except ValueError as e:
        raise SensorError(f"{path}: expected an integer, got {raw[:40]!r}") from e


def read_str(path: Path) -> str:
    """Read one text sysfs attribute (e.g. `type`, `name`, `tempN_label`), stripped."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError as e:
        raise SensorError(f"{path}: cannot read ({e.strerror or e})") from e


def _number(p: Path) -> int:
    m = re.search(r"(\d+)$", p.name)
    return int(m.group(1)) if m else -1


def thermal_zones(root: Path) -> list[Path]:
    """Every `thermal_zoneN` directory under the root, in numeric order (zone10 after zone9)."""
    base = root / THERMAL
    return sorted(base.glob("thermal_zone*"), key=_number) if base.is_dir() else []


def hwmon_dirs(root: Path) -> list[Path]:
    """Every hwmon device under the root: sys/class/hwmon/hwmonN, then hwmon nodes of i2c
    drivers that are not also linked from sys/class/hwmon (fixtures may hold only one)."""
    base = root / HWMON
    out = sorted(base.glob("hwmon*"), key=_number) if base.is_dir() else []
    seen = {p.resolve() for p in out}
    drivers = root / I2C_DRIVERS
    if drivers.is_dir():
        nodes = drivers.glob("*/*/hwmon/hwmon*")
        for p in sorted(nodes, key=lambda q: (str(q.parent), _number(q))):
            if p.resolve() not in seen:
                seen.add(p.resolve())
                out.append(p)
    return out


def rel(root: Path, path: Path) -> str:
    """`path` relative to the sysfs root, as profiles and ThermalSource spell it."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
