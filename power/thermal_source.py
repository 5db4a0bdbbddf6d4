"""Find the die temperature sensor and its trip points on real sysfs layouts.

Probe order, unless the profile names the sensor (`[thermal] zone_type`, or `hwmon_name` with
an optional `hwmon_label`, in which case only that is tried); the first candidate that reads
a plausible temperature (-40..150 °C) wins:

1. hwmon `coretemp` (Intel): the `tempN_input` whose `tempN_label` is "Package id 0" (the
   lowest package id when there are several).
2. hwmon `k10temp` (AMD): `Tctl` (temp1). The kernel's k10temp docs: Tctl is always temp1,
   Tdie (temp2, only on parts with an offset) is the real die temperature, Tccd1..8 are per
   chiplet. edgerun reads Tctl because the part's own throttling (HTC, `temp1_crit`) and its
   cooling act on Tctl, and Tctl >= Tdie, so it is never the optimistic reading. A profile may
   choose `hwmon_name = "k10temp"`, `hwmon_label = "Tdie"` instead.
3. thermal zone of type `x86_pkg_temp` (Intel package sensor, same MSR as coretemp).
4. thermal zone `tj-thermal` (Jetson Orin: the BPMP's maximum over every on-die sensor,
   TEGRA234_BPMP_THERMAL_ZONE_TJ_MAX in include/dt-bindings/thermal/tegra234-bpmp-thermal.h).
5. the hottest, at start-up, of the zones `cpu-thermal`, `gpu-thermal`, `cv0..2-thermal`,
   `soc0..2-thermal` (Raspberry Pi 5 has only `cpu-thermal`; Jetson Orin without tj-thermal).
6. thermal zone `acpitz` (ACPI board zone: not the die, so last among the known layouts).
7. the profile's `[thermal] zone` directory, whatever its type (edgerun's simulator writes
   its tree there with type `edgerun-sim`).

Trip mapping. edgerun's trips mean: `passive` = where edgerun holds the die (its own choice),
`hot` = where the kernel or the firmware starts throttling, `critical` = power-off. The kernel's
names mean something else, so they are mapped, never copied:

- thermal zone `passive` trip (the kernel starts passive cooling, i.e. throttling) -> edgerun
  `hot` (the lowest one when there are several);
- thermal zone `hot` and `critical` trips (ACPI `_HOT` hibernates, `critical` powers off; both
  stop the device) -> edgerun `critical` (the lowest of them);
- thermal zone `active` trips (fans) are ignored: a fan is not a throttle;
- hwmon `coretemp` `tempN_crit` (TjMax, where the CPU's thermal control throttles) and
  `k10temp` `temp1_crit` (the HTC limit, "the threshold at which the processor will throttle
  itself") -> edgerun `hot`; their `tempN_max` (coretemp Tcontrol, a fan point; k10temp's
  fixed Tctl maximum) is ignored; `tempN_crit_hyst` is an absolute temperature (hwmon ABI), so
  hysteresis = crit - crit_hyst;
- any other hwmon chip named by the profile follows the generic hwmon ABI: `tempN_max` ->
  edgerun `hot`, `tempN_crit` -> edgerun `critical`;
- the simulator's own zone (type `edgerun-sim`) is written in edgerun's terms: hot -> hot,
  critical -> critical.

edgerun's `passive` is always the sysfs-derived `hot` minus the profile's margin (profile hot -
profile passive). A kind the sysfs does not give comes from the profile; if the profile's value
would break passive < hot < critical against a sysfs value, it keeps the profile's distance to
that sysfs value instead, and a note says so. Trip files that are missing, garbage, or outside
0..150 °C (x86_pkg_temp exposes unset trips as 0) are ignored with a note.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from power.device import DeviceProfile, Thermal, TripPoint
from power.sysfs import SensorError, hwmon_dirs, read_int, read_str, rel, thermal_zones

TEMP_RANGE = (-40.0, 150.0)  # the physical bounds SensorSet applies to every reading
TRIP_MAX_C = 150.0
HYST_MAX_C = 30.0
SIM_ZONE_TYPE = "edgerun-sim"
JETSON_GROUP = ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal",
                "soc0-thermal", "soc1-thermal", "soc2-thermal")
# Drivers whose tempN_crit is the point where the part throttles itself (see docstring).
THROTTLE_AT_CRIT = ("coretemp", "k10temp")


@dataclass(frozen=True)
class ThermalSource:
    """The temperature sensor the governor reads, and the trips it acts on."""

    temp_file: str  # relative to the sysfs root, m°C
    label: str  # for operators, e.g. "thermal_zone0 (cpu-thermal)" or "hwmon2 k10temp Tctl"
    trips: tuple[TripPoint, ...]  # exactly one passive, hot and critical, rising
    trips_from: str  # "sysfs", "profile" or "sysfs+profile"
    notes: tuple[str, ...] = ()  # what discovery ignored or adjusted, for operators

    def trip(self, kind: str) -> TripPoint:
        """The trip of a kind (passive, hot, critical)."""
        return next(t for t in self.trips if t.type == kind)

    def describe(self) -> list[str]:
        """Lines for an operator: where the temperature comes from, the trips and notes."""
        trips = ", ".join(f"{t.type} {t.temp_c:g} °C (hyst {t.hyst_c:g})" for t in self.trips)
        return [f"thermal: {self.label}: {self.temp_file}",
                f"  trips from {self.trips_from}: {trips}",
                *(f"  note: {n}" for n in self.notes)]


# A trip found in sysfs, in edgerun's terms: (temp_c, hyst_c or None when sysfs had none).
_Trip = tuple[float, float | None]


@dataclass
class _Found:
    path: Path
    label: str
    temp_c: float
    hot: _Trip | None = None
    critical: _Trip | None = None
    notes: list[str] = field(default_factory=list)


def discover_thermal(root: Path, profile: DeviceProfile) -> ThermalSource:
    """The device's die temperature sensor and trips; raises SensorError naming every place
    tried and why none fit."""
    th = profile.thermal
    if th is None:
        raise SensorError(f"device profile '{profile.name}' has no [thermal] section: "
                          "nothing to fall back on for trips")
    tried: list[str] = []
    for where, probe in _probes(root, th):
        try:
            found = probe()
        except SensorError as e:
            tried.append(f"{where}: {e}")
            continue
        trips, trips_from, notes = merge_trips(found.hot, found.critical, th.trips)
        return ThermalSource(rel(root, found.path), found.label, trips, trips_from,
                             tuple(found.notes + notes))
    raise SensorError(f"no thermal sensor under {root}; tried:\n  " + "\n  ".join(tried))


def merge_trips(hot: _Trip | None, critical: _Trip | None, fallback: tuple[TripPoint, ...]
                ) -> tuple[tuple[TripPoint, ...], str, list[str]]:
    """edgerun's passive/hot/critical from the sysfs-derived hot and critical (either may be
    None) and the profile's trips; returns the trips, where they came from, and notes."""
    p = {t.type: t for t in fallback}
    margin = p["hot"].temp_c - p["passive"].temp_c
    notes: list[str] = []
    if hot is not None and critical is not None and hot[0] >= critical[0]:
        notes.append(f"sysfs throttle point {hot[0]:g} °C is not below the sysfs critical "
                     f"{critical[0]:g} °C: ignored")
        hot = None
    hot_t = None if hot is None else TripPoint(hot[0], "hot", _hyst(hot, p["hot"]))
    crit_t = None if critical is None else TripPoint(critical[0], "critical",
                                                     _hyst(critical, p["critical"]))
    gap = p["critical"].temp_c - p["hot"].temp_c
    if hot_t is None:
        h = p["hot"].temp_c
        if crit_t is not None and h >= crit_t.temp_c:
            h = crit_t.temp_c - gap
            notes.append(f"profile hot {p['hot'].temp_c:g} °C is not below the sysfs critical "
                         f"{crit_t.temp_c:g} °C: hot placed {gap:g} °C below it, as in the "
                         "profile")
        hot_t = TripPoint(h, "hot", p["hot"].hyst_c)
    if crit_t is None:
        c = p["critical"].temp_c
        if c <= hot_t.temp_c:
            c = hot_t.temp_c + gap
            notes.append(f"profile critical {p['critical'].temp_c:g} °C is not above the sysfs "
                         f"throttle point {hot_t.temp_c:g} °C: critical placed {gap:g} °C above "
                         "it, as in the profile")
        crit_t = TripPoint(c, "critical", p["critical"].hyst_c)
    passive_t = TripPoint(hot_t.temp_c - margin, "passive", p["passive"].hyst_c)
    if hot is not None and critical is not None:
        source = "sysfs"
    elif hot is None and critical is None:
        source = "profile"
    else:
        source = "sysfs+profile"
    return (passive_t, hot_t, crit_t), source, notes


def _hyst(trip: _Trip, fallback: TripPoint) -> float:
    return fallback.hyst_c if trip[1] is None else trip[1]


# -- probes ------------------------------------------------------------------------------------

_Probe = tuple[str, Callable[[], _Found]]


def _probes(root: Path, th: Thermal) -> list[_Probe]:
    if th.zone_type:
        return [(f"thermal zones of type '{th.zone_type}' under {root / 'sys/class/thermal'}"
                 " (named by the profile)", lambda: _hottest_zone(root, (th.zone_type,)))]
    if th.hwmon_name:
        what = f"{th.hwmon_name} {th.hwmon_label or 'temp1'}"
        return [(f"hwmon '{what}' under {root / 'sys/class/hwmon'} (named by the profile)",
                 lambda: _hwmon(root, th.hwmon_name, th.hwmon_label or None))]
    hw = root / "sys/class/hwmon"
    tz = root / "sys/class/thermal"
    return [
        (f"hwmon coretemp 'Package id 0' under {hw}", lambda: _hwmon(root, "coretemp", None)),
        (f"hwmon k10temp 'Tctl' under {hw}", lambda: _hwmon(root, "k10temp", None)),
        (f"thermal zone 'x86_pkg_temp' under {tz}", lambda: _hottest_zone(root, ("x86_pkg_temp",))),
        (f"thermal zone 'tj-thermal' under {tz}", lambda: _hottest_zone(root, ("tj-thermal",))),
        (f"hottest thermal zone of {', '.join(JETSON_GROUP)} under {tz}",
         lambda: _hottest_zone(root, JETSON_GROUP)),
        (f"thermal zone 'acpitz' under {tz}", lambda: _hottest_zone(root, ("acpitz",))),
        (f"profile's zone {root / th.zone}", lambda: _profile_zone(root, th)),
    ]


KNOWN_ZONES = ("x86_pkg_temp", "tj-thermal", *JETSON_GROUP, "acpitz", SIM_ZONE_TYPE)


def _profile_zone(root: Path, th: Thermal) -> _Found:
    """The last resort: the profile's zone directory, whatever its type (a board this module
    does not know, or the simulator's tree); says so when the type is not a known die sensor."""
    found = _zone(root, root / th.zone, None)
    ztype = found.label.split("(", 1)[-1].rstrip(")")
    if ztype not in KNOWN_ZONES:
        found.notes.append(f"{found.label} is not a known die sensor; used because it is the "
                           "profile's [thermal] zone. Name the right one with [thermal] "
                           "zone_type or hwmon_name if this is not the SoC/CPU")
    return found


def _read_temp(path: Path) -> float:
    t = read_int(path) / 1000
    lo, hi = TEMP_RANGE
    if not lo <= t <= hi:
        raise SensorError(f"{path}: {t:g} °C is outside {lo:g}..{hi:g} °C")
    return t


def _hottest_zone(root: Path, types: tuple[str, ...]) -> _Found:
    present: list[str] = []
    found: list[_Found] = []
    problems: list[str] = []
    for z in thermal_zones(root):
        try:
            ztype = read_str(z / "type")
        except SensorError as e:
            problems.append(str(e))
            continue
        present.append(ztype)
        if ztype in types:
            try:
                found.append(_zone(root, z, ztype))
            except SensorError as e:
                problems.append(str(e))
    if not found:
        why = "; ".join(problems) if problems else (
            f"none present (zone types here: {', '.join(present) or 'no zones'})")
        raise SensorError(why)
    best = max(found, key=lambda f: f.temp_c)
    if len(found) > 1:
        others = ", ".join(f"{f.label} {f.temp_c:g} °C" for f in found)
        best.label += f", hottest at start-up of {others}"
    best.notes.extend(f"skipped: {p}" for p in problems)
    return best


def _zone(root: Path, zone: Path, ztype: str | None) -> _Found:
    if ztype is None:
        try:
            ztype = read_str(zone / "type")
        except SensorError:
            ztype = "type unknown"
    found = _Found(zone / "temp", f"{zone.name} ({ztype})", _read_temp(zone / "temp"))
    trips = _zone_trips(root, zone, found.notes)
    if ztype == SIM_ZONE_TYPE:
        hot = [t for k, *t in trips if k == "hot"]
        crit = [t for k, *t in trips if k == "critical"]
    else:
        hot = [t for k, *t in trips if k == "passive"]
        crit = [t for k, *t in trips if k in ("hot", "critical")]
        active = sum(1 for k, *_ in trips if k == "active")
        if active:
            found.notes.append(f"{active} active (fan) trip(s) of {found.label} ignored: "
                               "a fan is not a throttle")
    found.hot = _lowest(hot)
    found.critical = _lowest(crit)
    return found


def _lowest(trips: list[list]) -> _Trip | None:
    if not trips:
        return None
    temp, hyst = min(trips, key=lambda t: t[0])
    return temp, hyst


def _trip_no(p: Path) -> int:
    m = re.match(r"trip_point_(\d+)_temp$", p.name)
    return int(m.group(1)) if m else -1


def _zone_trips(root: Path, zone: Path, notes: list[str]) -> list[tuple[str, float, float | None]]:
    """(kernel type, temp °C, hyst °C or None) of every usable trip of a zone."""
    out = []
    for f in sorted(zone.glob("trip_point_*_temp"), key=_trip_no):
        k = _trip_no(f)
        try:
            temp = read_int(f) / 1000
            ttype = read_str(zone / f"trip_point_{k}_type")
        except SensorError as e:
            notes.append(f"{_rel_msg(root, e)}: trip ignored")
            continue
        if ttype not in ("active", "passive", "hot", "critical"):
            notes.append(f"{rel(root, f)}: unknown trip type {ttype[:20]!r}: ignored")
            continue
        if not 0 < temp <= TRIP_MAX_C:
            notes.append(f"{rel(root, f)}: {temp:g} °C is not a usable trip "
                         f"(outside 0..{TRIP_MAX_C:g} °C): ignored")
            continue
        out.append((ttype, temp, _opt_hyst(root, zone / f"trip_point_{k}_hyst", notes)))
    return out


def _opt_hyst(root: Path, f: Path, notes: list[str]) -> float | None:
    if not f.exists():
        return None
    try:
        h = read_int(f) / 1000
    except SensorError as e:
        notes.append(f"{_rel_msg(root, e)}: profile hysteresis used")
        return None
    if not 0 <= h <= HYST_MAX_C:
        notes.append(f"{rel(root, f)}: hysteresis {h:g} °C outside 0..{HYST_MAX_C:g}: "
                     "profile hysteresis used")
        return None
    return h


def _opt_limit(root: Path, f: Path, notes: list[str]) -> float | None:
    """An optional hwmon limit file in °C; absent, garbage or implausible -> None (noted)."""
    if not f.exists():
        return None
    try:
        t = read_int(f) / 1000
    except SensorError as e:
        notes.append(f"{_rel_msg(root, e)}: ignored")
        return None
    if not 0 < t <= TRIP_MAX_C:
        notes.append(f"{rel(root, f)}: {t:g} °C is not a usable limit: ignored")
        return None
    return t


def _rel_msg(root: Path, e: SensorError) -> str:
    return str(e).replace(f"{root}/", "")


def _labels(d: Path) -> dict[str, int]:
    """tempN_label text -> N for one hwmon device."""
    out = {}
    for f in sorted(d.glob("temp*_label")):
        m = re.match(r"temp(\d+)_label$", f.name)
        if m:
            try:
                out.setdefault(read_str(f), int(m.group(1)))
            except SensorError:
                continue
    return out


def _pick(name: str, want: str | None, labels: dict[str, int]) -> tuple[int, str] | None:
    if want is not None:
        return (labels[want], want) if want in labels else None
    if name == "coretemp":
        # "Package id Y" (Documentation/hwmon/coretemp.rst); the lowest package id first
        pkgs = sorted((_number_in(lab), n, lab) for lab, n in labels.items()
                      if lab.startswith("Package id"))
        return (pkgs[0][1], pkgs[0][2]) if pkgs else None
    if name == "k10temp" and "Tctl" in labels:
        return labels["Tctl"], "Tctl"
    by_number = {n: lab for lab, n in labels.items()}
    return 1, by_number.get(1, "temp1")  # unlabelled chips (and pre-Zen k10temp): temp1


def _number_in(text: str) -> int:
    m = re.search(r"(\d+)\s*$", text)
    return int(m.group(1)) if m else 1 << 30


def _hwmon(root: Path, name: str, label: str | None) -> _Found:
    present: list[str] = []
    problems: list[str] = []
    for d in hwmon_dirs(root):
        try:
            dname = read_str(d / "name")
        except SensorError:
            continue
        present.append(dname)
        if dname != name:
            continue
        labels = _labels(d)
        pick = _pick(name, label, labels)
        if pick is None:
            problems.append(f"{rel(root, d)} {name} has no temp label "
                            f"{label or 'Package id N'!r} (labels: {', '.join(labels) or 'none'})")
            continue
        n, lab = pick
        try:
            return _hwmon_found(root, d, name, n, lab)
        except SensorError as e:
            problems.append(str(e))
    if problems:
        raise SensorError("; ".join(problems))
    raise SensorError(f"no hwmon device named {name} (names here: {', '.join(present) or 'none'})")


def _hwmon_found(root: Path, d: Path, name: str, n: int, label: str) -> _Found:
    found = _Found(d / f"temp{n}_input", f"{d.name} {name} {label}",
                   _read_temp(d / f"temp{n}_input"))
    notes = found.notes
    crit = _opt_limit(root, d / f"temp{n}_crit", notes)
    crit_hyst_abs = _opt_limit(root, d / f"temp{n}_crit_hyst", notes)
    mx = _opt_limit(root, d / f"temp{n}_max", notes)
    crit_hyst = None
    if crit is not None and crit_hyst_abs is not None and 0 <= crit - crit_hyst_abs <= HYST_MAX_C:
        crit_hyst = crit - crit_hyst_abs  # hwmon ABI: crit_hyst is absolute, not a delta
    if name in THROTTLE_AT_CRIT:
        if crit is not None:
            found.hot = (crit, crit_hyst)
        if mx is not None:
            notes.append(f"{rel(root, d)}/temp{n}_max ({mx:g} °C) is a cooling point for "
                         f"{name}, not a throttle: ignored")
    else:
        if mx is not None:
            found.hot = (mx, None)
        if crit is not None:
            found.critical = (crit, crit_hyst)
    return found
