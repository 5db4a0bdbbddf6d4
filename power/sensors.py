"""Power meters read through a configurable sysfs root.

Units follow the kernel (see shared REFERENCE.md): RAPL `energy_uj` in µJ and wrapping at
`max_energy_range_uj`; hwmon `powerN_input` µW, `energyN_input` µJ; power_supply
`power_now` µW, `voltage_now` µV, `current_now` µA (sign varies by driver).
Every meter names its `source` so every energy figure can carry it.
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

log = logging.getLogger(__name__)


class SensorError(OSError):
    """A sensor file is missing or holds garbage."""


class PowerMeter(Protocol):
    """Cumulative energy, monotonic, in joules."""

    source: str  # rapl | hwmon | battery | estimated

    def energy_j(self) -> float: ...


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


class RaplMeter:
    """Intel/AMD RAPL package energy counter, unwrapped into a monotonic total."""

    source = "rapl"

    def __init__(self, zone: Path):
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

    def __init__(self, file: Path):
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
                 clock: Callable[[], float] = time.monotonic):
        self.source = source
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


class EstimatedMeter:
    """No sensor: energy = idle_w * wall time + active_w_per_core * inference CPU time.

    Inference CPU time is the calling thread's plus the engines' own threads
    (power.cputime), never the whole process: the pipeline's other threads would otherwise be
    billed to whatever is being measured. Use differences taken in one thread. The profiler
    subtracts the idle baseline, so per-inference energy is CPU-seconds times the per-core
    active power: a spinning thread pool costs energy, as it does on real silicon.
    """

    source = "estimated"

    def __init__(self, idle_w: float, active_w_per_core: float,
                 clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = inference_cpu_s):
        self._idle_w, self._active_w = idle_w, active_w_per_core
        self._clock, self._cpu = clock, cpu_clock
        self._t0, self._c0 = clock(), cpu_clock()

    def energy_j(self) -> float:
        wall = self._clock() - self._t0
        cpu = self._cpu() - self._c0
        return self._idle_w * wall + self._active_w * cpu


def _candidates(root: Path, profile: DeviceProfile) -> list[tuple[str, Callable[[], PowerMeter]]]:
    s = profile.sensors
    out: list[tuple[str, Callable[[], PowerMeter]]] = []
    rapl = list(s.rapl) or ["sys/class/powercap/intel-rapl/intel-rapl:0"]
    for z in rapl:
        out.append((z, lambda z=z: RaplMeter(root / z)))
    for f in s.hwmon_energy:
        out.append((f, lambda f=f: HwmonEnergyMeter(root / f)))
    for f in s.hwmon_power:
        out.append((f, lambda f=f: IntegratingMeter("hwmon", hwmon_power_reader(root / f))))
    if s.battery:
        out.append((s.battery, lambda: IntegratingMeter(
            "battery", battery_power_reader(root / s.battery))))
    return out


def detect_meter(root: Path, profile: DeviceProfile) -> PowerMeter:
    """The best meter this device has: RAPL, hwmon energy, hwmon power, battery, else estimated."""
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
    """Trip points of a sysfs thermal zone (m°C files), sorted by temperature."""
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
    """Reads a device's thermal zone, battery and solar input through the sysfs root.

    A missing file or a value outside physical bounds becomes a problem in the Reading,
    so the governor can fail safe instead of acting on garbage.
    """

    def __init__(self, root: Path, thermal_zone: str = "", battery: str = "", solar: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self._root, self._clock = root, clock
        self._zone, self._battery, self._solar = thermal_zone, battery, solar

    def read(self) -> Reading:
        """One reading of every configured sensor."""
        problems: list[str] = []
        temp = bat_frac = bat_wh = harvest = None
        if self._zone:
            temp = self._value(self._zone + "/temp", 1e-3, -40.0, 150.0, "°C", problems)
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

    def _value(self, rel: str, scale: float, lo: float, hi: float, unit: str,
               problems: list[str]) -> float | None:
        try:
            v = read_int(self._root / rel) * scale
        except SensorError as e:
            problems.append(str(e))
            return None
        if not lo <= v <= hi:
            problems.append(f"{self._root / rel}: {v:g} {unit} is outside {lo:g}..{hi:g}")
            return None
        return v
