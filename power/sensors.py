"""Power meters and the governor's readings, through a configurable sysfs root.

Units follow the kernel (see shared REFERENCE.md): RAPL `energy_uj` in µJ and wrapping at
`max_energy_range_uj`; hwmon `powerN_input` µW, `energyN_input` µJ; INA3221 `inN_input` mV and
`currN_input` mA (no power file: P = V*I, Documentation/hwmon/ina3221.rst); power_supply
`power_now` µW, `voltage_now` µV, `current_now` µA (sign varies by driver).
Every meter names its `source` so every energy figure can carry it, and `where` it reads.
Which temperature sensor the governor reads, and its trips: `power.thermal_source`
(`discover_thermal`, re-exported here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from power.cputime import inference_cpu_s
from power.device import DeviceProfile
from power.ina3221 import channels
from power.sysfs import SensorError, read_int, rel
from power.thermal_source import ThermalSource, discover_thermal

# Names other modules import from here although they live in power.sysfs / thermal_source.
__all__ = ["SensorError", "ThermalSource", "discover_thermal", "read_int"]

log = logging.getLogger(__name__)

# Labels of the board's input rail on INA3221 channels: Jetson Orin (VDD_IN), Jetson Nano
# (POM_5V_IN). A profile may name another with [sensors] ina3221_rail.
INA3221_RAILS = ("VDD_IN", "POM_5V_IN")


class PowerMeter(Protocol):
    """Cumulative energy, monotonic, in joules."""

    source: str  # rapl | hwmon | battery | estimated
    where: str  # what it reads, for operators (a sysfs path relative to the root, or a model)

    def energy_j(self) -> float: ...


class RaplMeter:
    """Intel/AMD RAPL package energy counter, unwrapped into a monotonic total."""

    source = "rapl"

    def __init__(self, zone: Path, where: str = ""):
        self.where = where or str(zone)
        self._file = zone / "energy_uj"
        self._range = read_int(zone / "max_energy_range_uj")
        self._last = read_int(self._file)
        self._total_uj = 0
        self._lock = threading.Lock()

    def energy_j(self) -> float:
        with self._lock:
            now = read_int(self._file)
            delta = now - self._last
            if delta < 0:  # the counter wrapped past max_energy_range_uj
                delta += self._range + 1
            self._last = now
            self._total_uj += delta
            return self._total_uj / 1e6


class HwmonEnergyMeter:
    """hwmon `energyN_input` (µJ, cumulative)."""

    source = "hwmon"

    def __init__(self, file: Path, where: str = ""):
        self.where = where or str(file)
        self._file = file
        self._first = read_int(file)

    def energy_j(self) -> float:
        return (read_int(self._file) - self._first) / 1e6


class IntegratingMeter:
    """Integrates an instantaneous power reading (W) over time, trapezoid rule.

    Accuracy depends on how often `energy_j` is called: the profiler calls it after every
    inference and every 50 ms while it measures the idle baseline.
    """

    def __init__(self, source: str, read_w: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic, where: str = ""):
        self.source, self.where = source, where
        self._read_w = read_w
        self._clock = clock
        self._lock = threading.Lock()
        self._t = clock()
        self._p = read_w()
        self._total = 0.0

    def energy_j(self) -> float:
        with self._lock:
            t, p = self._clock(), self._read_w()
            self._total += (p + self._p) / 2 * (t - self._t)
            self._t, self._p = t, p
            return self._total


def hwmon_power_reader(file: Path) -> Callable[[], float]:
    """A reader of hwmon `powerN_input` in watts."""
    return lambda: read_int(file) / 1e6


def battery_power_reader(supply: Path) -> Callable[[], float]:
    """A reader of a power_supply's power in watts: power_now, else |voltage_now * current_now|."""
    if (supply / "power_now").exists():
        return lambda: abs(read_int(supply / "power_now")) / 1e6
    v, i = supply / "voltage_now", supply / "current_now"
    read_int(v), read_int(i)  # fail now, not on first use
    return lambda: abs(read_int(v) * read_int(i)) / 1e12


def find_ina3221_rail(root: Path, rails: tuple[str, ...] = INA3221_RAILS) -> tuple[Path, int, str]:
    """The INA3221 hwmon device and channel whose `inN_label` is the first of `rails` present;
    raises SensorError naming the devices and labels seen."""
    seen: list[str] = []
    chans: dict[str, tuple[Path, int]] = {}
    for label, d, n in channels(root):
        seen.append(f"{rel(root, d)} in{n} {label}")
        chans.setdefault(label, (d, n))
    for rail in rails:
        if rail in chans:
            d, n = chans[rail]
            return d, n, rail
    if not seen:
        raise SensorError(f"no hwmon device named ina3221 under {root}")
    raise SensorError(f"no INA3221 channel labelled {' or '.join(rails)} "
                      f"(channels: {', '.join(seen)})")


def ina3221_power_reader(hwmon: Path, channel: int) -> Callable[[], float]:
    """A reader of one INA3221 channel's power in watts: bus mV x mA (the chip has no power
    file; Documentation/hwmon/ina3221.rst). The sign of the current is dropped, as the shunt
    may be wired either way round."""
    v, i = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
    return lambda: abs(read_int(v) * read_int(i)) / 1e6


class EstimatedMeter:
    """No sensor: energy = idle_w * wall time + active_w_per_core * inference CPU time.

    Inference CPU time is the calling thread's plus the engines' own threads
    (power.cputime), never the whole process: the pipeline's other threads would otherwise be
    billed to whatever is being measured. Use differences taken in one thread. The profiler
    subtracts the idle baseline, so per-inference energy is CPU-seconds times the per-core
    active power: a spinning thread pool costs energy, as it does on real silicon.
    """

    source = "estimated"

    where = "model: idle_w + active_w_per_core x inference CPU-seconds (power.cputime)"

    def __init__(self, idle_w: float, active_w_per_core: float,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = inference_cpu_s):
        self._idle_w, self.active_w_per_core = idle_w, active_w_per_core
        self._clock, self._cpu = clock, cpu_clock
        self._t0, self._c0 = clock(), cpu_clock()

    def energy_j(self) -> float:
        wall = self._clock() - self._t0
        cpu = self._cpu() - self._c0
        return self._idle_w * wall + self.active_w_per_core * cpu


def _candidates(root: Path, profile: DeviceProfile) -> list[tuple[str, Callable[[], PowerMeter]]]:
    s = profile.sensors
    out: list[tuple[str, Callable[[], PowerMeter]]] = []
    rapl = list(s.rapl) or ["sys/class/powercap/intel-rapl/intel-rapl:0"]
    for z in rapl:
        out.append((z, lambda z=z: RaplMeter(root / z, z)))
    for f in s.hwmon_energy:
        out.append((f, lambda f=f: HwmonEnergyMeter(root / f, f)))
    for f in s.hwmon_power:
        out.append((f, lambda f=f: IntegratingMeter("hwmon", hwmon_power_reader(root / f),
                                                    where=f)))
    rails = (s.ina3221_rail,) if s.ina3221_rail else INA3221_RAILS
    out.append((f"INA3221 rail {' or '.join(rails)}", lambda: _ina3221_meter(root, rails)))
    if s.battery:
        out.append((s.battery, lambda: IntegratingMeter(
            "battery", battery_power_reader(root / s.battery), where=s.battery)))
    return out


def _ina3221_meter(root: Path, rails: tuple[str, ...]) -> IntegratingMeter:
    d, n, rail = find_ina3221_rail(root, rails)
    where = f"{rel(root, d)}/in{n}_input x curr{n}_input ({rail})"
    return IntegratingMeter("hwmon", ina3221_power_reader(d, n), where=where)


def detect_meter(root: Path, profile: DeviceProfile) -> PowerMeter:
    """The best meter this device has: RAPL, hwmon energy, hwmon power, the INA3221 input rail,
    battery, else estimated."""
    tried = []
    for where, make in _candidates(root, profile):
        try:
            meter = make()
            meter.energy_j()
            return meter
        except SensorError as e:
            tried.append(f"{where}: {e}")
    log.info("no power sensor under %s (tried %d); energy is estimated from CPU time with "
             "device profile '%s' (%s coefficients)", root, len(tried), profile.name,
             profile.power.basis)
    return EstimatedMeter(profile.power.idle_w, profile.power.active_w_per_core)


# -- thermal, battery and solar readings (for the governor) ------------------------------------

TRIP_TYPES = ("active", "passive", "hot", "critical")


@dataclass(frozen=True)
class Trip:
    """One trip point of a thermal zone, in °C."""

    temp_c: float
    hyst_c: float
    type: str


@dataclass(frozen=True)
class Reading:
    """What the sensors said at time t. Invalid parts are None with a reason; never raises."""

    t: float
    temp_c: float | None = None
    battery_frac: float | None = None  # state of charge, 0..1
    battery_wh: float | None = None
    harvest_w: float | None = None  # solar input
    problems: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        """True when every sensor that was asked for answered sanely."""
        return not self.problems


def read_trips(zone: Path) -> list[Trip]:
    """Raw trip points of a sysfs thermal zone (m°C files, kernel types), sorted by temperature.
    The governor's trips come from `discover_thermal`, which maps kernel types to edgerun's."""
    trips = []
    for f in sorted(zone.glob("trip_point_*_temp")):
        k = f.name.removeprefix("trip_point_").removesuffix("_temp")
        try:
            ttype = (zone / f"trip_point_{k}_type").read_text().strip()
        except OSError:
            ttype = "passive"
        hyst_f = zone / f"trip_point_{k}_hyst"
        hyst = read_int(hyst_f) / 1000 if hyst_f.exists() else 0.0
        trips.append(Trip(read_int(f) / 1000, hyst, ttype))
    return sorted(trips, key=lambda t: t.temp_c)


class SensorSet:
    """Reads a device's temperature, battery and solar input through the sysfs root.

    `temp_file` is a m°C file relative to the root (a ThermalSource's `temp_file`, e.g.
    "sys/class/hwmon/hwmon2/temp1_input"); a thermal zone directory is accepted too and its
    `temp` is read. A missing file or a value outside physical bounds becomes a problem in the
    Reading, so the governor can fail safe instead of acting on garbage.
    """

    def __init__(self, root: Path, temp_file: str = "", battery: str = "", solar: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self._root, self._clock = root, clock
        self._temp, self._battery, self._solar = temp_file, battery, solar

    def read(self) -> Reading:
        """One reading of every configured sensor."""
        problems: list[str] = []
        temp = bat_frac = bat_wh = harvest = None
        if self._temp:
            f = self._temp
            if (self._root / f).is_dir():  # a thermal zone named by its directory
                f += "/temp"
            temp = self._value(f, 1e-3, -40.0, 150.0, "°C", problems)
        if self._battery:
            cap = self._value(self._battery + "/capacity", 1.0, 0.0, 100.0, "%", problems)
            bat_frac = None if cap is None else cap / 100
            energy = self._root / self._battery / "energy_now"
            if energy.exists():
                bat_wh = self._value(self._battery + "/energy_now", 1e-6, 0.0, 1e6, "Wh",
                                     problems)
        if self._solar:
            harvest = self._value(self._solar + "/power_now", 1e-6, 0.0, 1e5, "W", problems)
        return Reading(self._clock(), temp, bat_frac, bat_wh, harvest, tuple(problems))

    def _value(self, path: str, scale: float, lo: float, hi: float, unit: str,
               problems: list[str]) -> float | None:
        try:
            v = read_int(self._root / path) * scale
        except SensorError as e:
            problems.append(str(e))
            return None
        if not lo <= v <= hi:
            problems.append(f"{self._root / path}: {v:g} {unit} is outside {lo:g}..{hi:g}")
            return None
        return v
