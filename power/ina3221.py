"""Jetson's INA3221 rails, each on its own: VDD_IN (the board), VDD_CPU_GPU_CV, VDD_SOC.

NVML reports no power on Jetson (others' users see NOT_SUPPORTED; REFERENCE.md): its rails
are INA3221 channels in sysfs, under sys/bus/i2c/drivers/ina3221/*/hwmon/hwmonN/ (or
sys/class/hwmon), with `inN_label` naming the rail, `inN_input` the bus voltage (mV) and
`currN_input` the current (mA): P = V x I (Documentation/hwmon/ina3221.rst; the chip has no
power file). The board's meter is the VDD_IN rail (power/sensors.py `detect_meter`); the
other rails say where the power goes (the GPU is on VDD_CPU_GPU_CV with the CPU and the
vision engines, so no rail is the GPU's alone). The driver's `update_interval` (ms) is the
rails' resolution (power/meter_resolution.py). `report` is health's `power_rails`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from power.meter_resolution import Resolution, hwmon_interval
from power.sysfs import SensorError, hwmon_dirs, read_int, read_str, rel

RAILS = ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")  # Jetson Orin (REFERENCE.md)


def channels(root: Path) -> list[tuple[str, Path, int]]:
    """Every INA3221 channel under the root: (label, hwmon dir, channel 1-3), in the order
    the devices are found."""
    out = []
    for d in hwmon_dirs(root):
        try:
            if read_str(d / "name") != "ina3221":
                continue
        except SensorError:
            continue
        for n in (1, 2, 3):  # in[123]_label: the three channels (in4..7 are shunt voltages)
            try:
                out.append((read_str(d / f"in{n}_label"), d, n))
            except SensorError:
                continue
    return out


class Rails:
    """The named rails' power, read together. A rail missing from the board is named in
    `missing`, never read as 0."""

    def __init__(self, root: Path, rails: tuple[str, ...] = RAILS):
        found = {}
        for label, d, n in channels(root):
            found.setdefault(label, (d, n))
        self.where = {r: f"{rel(root, found[r][0])}/in{found[r][1]}_input x "
                         f"curr{found[r][1]}_input" for r in rails if r in found}
        self._chan = {r: found[r] for r in rails if r in found}
        self.missing = tuple(r for r in rails if r not in found)
        if not self._chan:
            raise SensorError(f"no INA3221 channel labelled {', '.join(rails)} under {root}")

    def watts(self) -> dict[str, float | None]:
        """Each rail's power now (W); None for a rail whose files could not be read."""
        out: dict[str, float | None] = {}
        for r, (d, n) in self._chan.items():
            try:
                out[r] = abs(read_int(d / f"in{n}_input") * read_int(d / f"curr{n}_input")) / 1e6
            except SensorError:
                out[r] = None
        return out

    def resolution(self) -> Resolution | None:
        """The driver's documented update interval (None: no `update_interval` file)."""
        dirs = {d for d, _ in self._chan.values()}
        got = [r for r in (hwmon_interval(d) for d in dirs) if r is not None]
        return max(got, key=lambda r: r.period_s or 0.0) if got else None


def report(root: Path, rails: tuple[str, ...]) -> dict[str, Any] | None:
    """Health's `power_rails`: each named rail's power now (W, rounded to mW; null where its
    files could not be read), the rails the board lacks, and their resolution. None when the
    device profile names no rails ([sensors] ina3221_rails); no channel at all under `root`
    is said in `reason`, never read as 0 W."""
    if not rails:
        return None
    try:
        r = Rails(root, rails)
    except SensorError as e:
        return {"watts": {}, "missing": list(rails), "resolution": None, "reason": str(e)}
    res = r.resolution()
    return {"watts": {k: None if w is None else round(w, 3) for k, w in r.watts().items()},
            "missing": list(r.missing), "resolution": res.describe() if res else None,
            "reason": None}
