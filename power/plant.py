"""Device simulator: two-node thermal RC, DVFS-like throttling, critical power-off, battery and
solar panel. It can write the same sysfs files the kernel would, so the normal sensors read it.

Thermal model (shared REFERENCE.md): C dT/dt = P - (T - T_amb)/R, exact step
T' = T_inf + (T - T_inf) e^(-dt/tau) + P R (1 - e^(-dt/tau)); two nodes die -> case -> ambient,
each stepped exactly with its neighbour held over a sub-step shorter than the die's tau.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from power.device import DeviceProfile

DAY = 86400.0
# A file under a simulated sysfs root listing paths (one a line, relative to the root) of
# sensors that are dead: the plant stops writing them and removes them, as a driver that
# lost its chip does, until the file is gone (the soak's fault injection at the boundary)
DEAD_SENSORS = ".dead-sensors"


def rc_step(temp: float, t_inf: float, power_w: float, r: float, c: float, dt: float) -> float:
    """Exact step of one RC node towards t_inf + P*R."""
    k = math.exp(-dt / (r * c))
    return t_inf + (temp - t_inf) * k + power_w * r * (1 - k)


# -- ambient scenarios ----------------------------------------------------------------------------

def ambient(kind: str, base_c: float, swing_c: float = 0.0) -> Callable[[float], float]:
    """Ambient temperature over time (s from midnight): constant, sun (cabinet in the sun from
    08:00 to 18:00, peak at 13:00) or daynight (sinusoid, peak at 15:00)."""
    if kind == "constant":
        return lambda t: base_c
    if kind == "sun":
        def sun(t: float) -> float:
            h = (t % DAY) / 3600
            return base_c + swing_c * max(0.0, math.sin(math.pi * (h - 8) / 10))
        return sun
    if kind == "daynight":
        return lambda t: base_c + swing_c * math.sin(2 * math.pi * ((t % DAY) / 3600 - 9) / 24)
    raise ValueError(f"unknown ambient kind {kind!r} (constant, sun, daynight)")


SCENARIOS: dict[str, tuple[str, float, float]] = {
    "cool": ("constant", 22.0, 0.0),
    "warm": ("daynight", 30.0, 6.0),
    "hot": ("constant", 40.0, 0.0),
    "sun": ("sun", 30.0, 25.0),
    # a cabinet the afternoon sun reaches: 22 °C at night, 42 °C at 13:00. On the rpi5 profile
    # idle stays under the trip all day and full load passes it from mid-morning: the demo's
    "cabinet": ("sun", 22.0, 20.0),
}


# -- solar ----------------------------------------------------------------------------------------

def solar_trace(days: int, seed: int, step_s: float = 300.0) -> np.ndarray:
    """Irradiance 0..1 every `step_s`, deterministic by seed: clear-sky bell 06:00-18:00 times a
    daily weather state from a Markov chain (sunny, partly cloudy, overcast) that makes
    multi-day cloudy spells, plus passing-cloud noise."""
    rng = np.random.default_rng(seed)
    states = {"sunny": 1.0, "partly": 0.55, "overcast": 0.15}
    stay = {"sunny": 0.7, "partly": 0.5, "overcast": 0.65}
    names = list(states)
    weather, day_factor = "sunny", []
    for _ in range(days):
        day_factor.append(states[weather])
        if rng.random() > stay[weather]:
            weather = rng.choice([n for n in names if n != weather])
    n = int(days * DAY / step_s)
    t = np.arange(n) * step_s
    h = (t % DAY) / 3600
    clear = np.clip(np.sin(np.pi * (h - 6) / 12), 0, None)
    factor = np.repeat(day_factor, int(DAY / step_s))[:n]
    noise = np.clip(1 - rng.gamma(0.5, 0.2, n) * (factor < 1), 0.05, 1.0)
    return clear * factor * noise


# -- the plant ------------------------------------------------------------------------------------

@dataclass
class PlantState:
    """Everything the simulator tracks."""

    t: float
    die_c: float
    case_c: float
    throttled: bool = False
    off_until: float = -math.inf
    battery_wh: float | None = None
    harvest_w: float = 0.0
    power_w: float = 0.0
    critical_trips: int = 0
    throttled_s: float = 0.0
    below_reserve_s: float = 0.0
    suspended_s: float = 0.0  # time spent suspended (drawing the profile's suspended_w)
    suspends: int = 0


class Plant:
    """One simulated device."""

    def __init__(self, device: DeviceProfile, ambient_c: Callable[[float], float],
                 t0: float = 0.0, irradiance: np.ndarray | None = None,
                 irradiance_step_s: float = 300.0, battery_frac: float = 1.0,
                 root: Path | None = None, irradiance_repeats: bool = False):
        if device.thermal is None:
            raise ValueError(f"device profile {device.name} has no [thermal] section")
        self.device, self.ambient_c, self.root = device, ambient_c, root
        self._th = device.thermal
        self._irr, self._irr_step = irradiance, irradiance_step_s
        # past its end the trace starts again (a year of weather for a run without an end),
        # else its last value holds (a trace made for exactly the run)
        self._irr_repeats = irradiance_repeats
        amb = ambient_c(t0)
        bat = device.battery.capacity_wh * battery_frac if device.battery else None
        self.s = PlantState(t0, amb, amb, battery_wh=bat)
        self._hot = self._th.trip("hot")
        self._critical = self._th.trip("critical")
        self.suspended_until = -math.inf  # simulated time the board sleeps until
        self._written: dict[Path, dict[str, str]] = {}  # per tree: what each file holds

    def suspend(self, until_t: float) -> None:
        """The board suspends now until `until_t` (simulated time): it draws the profile's
        suspended power and infers nothing until then (see power/suspend.py)."""
        st = self.device.states
        if st is None or not st.can_suspend:
            raise ValueError(f"device profile {self.device.name} cannot suspend")
        self.suspended_until = until_t
        self.s.suspends += 1
        # The transitions draw more than the suspended floor: billed at once, in full.
        extra_j = (st.suspend_j - st.suspended_w * st.suspend_s
                   + st.resume_j - st.suspended_w * st.resume_s)
        if self.s.battery_wh is not None and extra_j > 0:
            self.s.battery_wh = max(0.0, self.s.battery_wh - extra_j / 3600)

    @property
    def suspended(self) -> bool:
        """True while the board is suspended."""
        return self.s.t < self.suspended_until

    @property
    def on(self) -> bool:
        """False while powered off after a critical trip or an empty battery."""
        return self.s.t >= self.s.off_until and (self.s.battery_wh is None
                                                 or self.s.battery_wh > 0)

    def harvest_w(self, t: float) -> float:
        """Solar input power at time t."""
        if self.device.solar is None or self._irr is None:
            return 0.0
        i = int(t / self._irr_step)
        i = i % len(self._irr) if self._irr_repeats else min(i, len(self._irr) - 1)
        return self.device.solar.panel_w * float(self._irr[i])

    def step(self, dt: float, dynamic_w: float) -> PlantState:
        """Advance by dt seconds with the inference load drawing `dynamic_w` above idle
        (nothing above the suspended draw while suspended; a step that crosses the wake time
        is split there)."""
        if self.suspended:
            asleep = min(dt, self.suspended_until - self.s.t)
            self._step(asleep, 0.0, self.device.states.suspended_w)  # type: ignore[union-attr]
            self.s.suspended_s += asleep
            if dt - asleep > 1e-9:
                self._step(dt - asleep, dynamic_w)
            return self.s
        return self._step(dt, dynamic_w)

    def _step(self, dt: float, dynamic_w: float, base_w: float | None = None) -> PlantState:
        s, m = self.s, self._th.model
        base = self.device.power.idle_w if base_w is None else base_w
        power = (base + dynamic_w) if self.on else 0.0
        amb = self.ambient_c(s.t)
        n = max(1, math.ceil(dt / (m.r_die_case * m.c_die / 5)))
        h = dt / n
        for _ in range(n):
            die = rc_step(s.die_c, s.case_c, power, m.r_die_case, m.c_die, h)
            # the case takes the heat the die passes to it, and loses it to ambient
            r_par = 1 / (1 / m.r_die_case + 1 / m.r_case_amb)
            t_inf = r_par * (s.die_c / m.r_die_case + amb / m.r_case_amb)
            s.case_c = rc_step(s.case_c, t_inf, 0.0, r_par, m.c_case, h)
            s.die_c = die
        s.t += dt
        s.power_w = power
        if s.die_c >= self._critical.temp_c and self.on:
            s.critical_trips += 1
            s.off_until = s.t + self._th.cooldown_s
        if s.throttled:
            s.throttled = s.die_c >= self._hot.temp_c - self._hot.hyst_c
        else:
            s.throttled = s.die_c >= self._hot.temp_c
        if s.throttled and self.on:
            s.throttled_s += dt
        s.harvest_w = self.harvest_w(s.t)
        if s.battery_wh is not None and self.device.battery is not None:
            b = self.device.battery
            net = s.harvest_w - power
            gain = b.charge_efficiency * net if net > 0 else net
            s.battery_wh = min(b.capacity_wh, max(0.0, s.battery_wh + gain * dt / 3600))
            if s.battery_wh < b.reserve_frac * b.capacity_wh:
                s.below_reserve_s += dt
        if self.root is not None:
            self.write_sysfs()
        return s

    # -- sysfs -----------------------------------------------------------------------------------
    def write_sysfs(self, root: Path | None = None) -> None:
        """Write the files a kernel would expose for this state (atomically, file by file)
        under `root` (default: the plant's own, which every step writes to)."""
        root = root if root is not None else self.root
        if root is None:
            raise ValueError("write_sysfs needs a root: the plant was made without one")
        s, zone = self.s, self._th.zone
        files = {f"{zone}/temp": round(s.die_c * 1000), f"{zone}/type": "edgerun-sim"}
        for k, trip in enumerate(self._th.trips):
            files[f"{zone}/trip_point_{k}_temp"] = round(trip.temp_c * 1000)
            files[f"{zone}/trip_point_{k}_hyst"] = round(trip.hyst_c * 1000)
            files[f"{zone}/trip_point_{k}_type"] = trip.type
        b = self.device.battery
        if b is not None and s.battery_wh is not None:
            files[f"{b.path}/capacity"] = round(100 * s.battery_wh / b.capacity_wh)
            files[f"{b.path}/energy_now"] = round(s.battery_wh * 1e6)
            files[f"{b.path}/energy_full"] = round(b.capacity_wh * 1e6)
            files[f"{b.path}/power_now"] = round(s.power_w * 1e6)
            files[f"{b.path}/status"] = "Charging" if s.harvest_w > s.power_w else "Discharging"
        if self.device.solar is not None:
            files[f"{self.device.solar.path}/power_now"] = round(s.harvest_w * 1e6)
            files[f"{self.device.solar.path}/type"] = "Mains"
        for f in self.device.sensors.hwmon_power:
            files[f] = round(s.power_w * 1e6)
        written = self._written.setdefault(root, {})
        dead = root / DEAD_SENSORS
        if dead.exists():  # a sensor that died (bench/field_soak.py): its files vanish
            for rel in dead.read_text().split():
                files.pop(rel, None)
                written.pop(rel, None)  # written again once it comes back
                (root / rel).unlink(missing_ok=True)
        for rel, value in files.items():
            text = f"{value}\n"
            if written.get(rel) == text:
                continue  # unchanged: a rename costs ~1 ms on a busy disk, 11 files a step
            p = root / rel
            if rel not in written:
                p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, p)
            written[rel] = text
