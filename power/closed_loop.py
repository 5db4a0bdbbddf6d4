"""Simulator harness: the plant (power/plant.py) + the shipped control step (power/control.py),
faster than real time. The harness owns only what is not product: time, the plant, sensor
noise, the baselines (kernel-only, cheapest, greedy/fixed/oracle energy) and the tally.

Used by bench/governor.py, bench/solar.py and the closed-loop tests. The load model: frames
are offered at `rate_hz`; the chosen rung runs at min(rate, what it can sustain); while the
device throttles, latency grows by the profile's factor (DVFS) and a frame whose latency
misses the target is not a good inference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from power import control
from power import energy as energy_mod
from power import governor as gov
from power.device import DeviceProfile
from power.plant import Plant
from power.rungs import Rung
from power.sensors import Reading

THERMAL_POLICIES = ("kernel", "cheapest", "step_wise", "power_allocator")


@dataclass
class RunResult:
    """What one simulated run delivered."""

    policy: str
    critical_trips: int = 0
    throttled_min: float = 0.0
    good: float = 0.0  # inferences within the latency target
    good_weighted: float = 0.0  # ... times the rung's accuracy
    energy_wh: float = 0.0
    below_reserve_h: float = 0.0
    rung_changes: int = 0
    bounded: bool = False  # the control step found the device physics-bounded
    trace: dict[str, list[float]] = field(default_factory=dict)

    @property
    def mean_accuracy(self) -> float:
        """Accuracy averaged over good inferences."""
        return self.good_weighted / self.good if self.good else 0.0


def run_load(plant: Plant, rung: Rung, offered_hz: float, latency_target_s: float, dt: float,
             res: RunResult) -> tuple[float, float]:
    """Step the plant by `dt` with `rung` offered frames at `offered_hz`, and tally what was
    delivered in `res`; returns (inferences/s delivered, latency s). The one load model of
    this harness and of the daemon's in-process simulator (runtime/device/simdevice.py)."""
    th = plant.device.thermal
    assert th is not None
    s = plant.s
    latency = rung.latency_s * (th.throttle_latency_factor if s.throttled else 1.0)
    delivered = min(offered_hz, rung.parallel / latency) if plant.on and not plant.suspended \
        else 0.0
    e = rung.energy_j * (th.throttle_energy_factor if s.throttled else 1.0)
    plant.step(dt, e * delivered)
    res.energy_wh += plant.s.power_w * dt / 3600
    if latency <= latency_target_s:
        res.good += delivered * dt
        res.good_weighted += delivered * dt * rung.accuracy
    res.critical_trips = plant.s.critical_trips
    res.throttled_min = plant.s.throttled_s / 60
    res.below_reserve_h = plant.s.below_reserve_s / 3600
    return delivered, latency


def simulate(device: DeviceProfile, rungs: Sequence[Rung], ambient_c: Callable[[float], float],
             policy: str, duration_s: float, rate_hz: float, latency_target_s: float,
             dt: float = 1.0, t0: float = 0.0, irradiance: np.ndarray | None = None,
             energy_policy: str = "none", record_every: int = 0,
             fixed_w: float | None = None, oracle_forecast: np.ndarray | None = None,
             oracle_days: int = 3, battery_frac: float = 1.0, noise_c: float = 0.0,
             drop_frac: float = 0.0, seed: int = 0,
             min_rate_hz: float = 0.2,
             band_c: float = gov.GovernorConfig.band_c,
             sensor: Callable[[float, float], float | None] | None = None) -> RunResult:
    """Run one policy; see module doc. `energy_policy`: none | energy (edgerun's budget) |
    greedy (full power above reserve) | fixed (constant `fixed_w`) | oracle (the planner fed the
    true future harvest per slot, `oracle_forecast`, `oracle_days` ahead). `noise_c` (Gaussian
    sd) and `drop_frac` (share of unreadable temperature files) make the sensor behave like a
    real one; `seed` makes that repeatable. `sensor(t, die °C)` is what the sensor reads
    instead (None: unreadable): a stuck, jumping or dead sensor."""
    plant = Plant(device, ambient_c, t0=t0, irradiance=irradiance, battery_frac=battery_frac)
    rng = np.random.default_rng(seed)
    thermal = policy in ("step_wise", "power_allocator")
    ladder_ = list(rungs[:1]) if policy == "cheapest" else list(rungs)
    ecfg = None
    if device.battery is not None and energy_policy == "energy":
        b = device.battery
        ecfg = energy_mod.EnergyConfig(b.capacity_wh, device.power.idle_w, math.inf,
                                       b.reserve_frac, b.charge_efficiency)
    ccfg = control.ControlConfig(
        governor=control.governor_config(device, policy, band_c=band_c) if thermal else None,
        energy=ecfg,
        rate_hz=rate_hz, min_rate_hz=min_rate_hz,
        **control.guard_settings(device.thermal.model if device.thermal else None))
    cstate = control.ControlState()
    res = RunResult(policy)
    current = len(ladder_) - 1
    names = ("t", "temp_c", "ambient_c", "rung", "rate_hz", "latency_ms", "accuracy",
             "battery_frac")
    res.trace = {k: [] for k in names} if record_every else {}
    top_w = ladder_[-1].power_w(rate_hz)
    steps = int(duration_s / dt)
    for i in range(steps):
        s = plant.s
        # read as sysfs gives it, in whole millidegrees (what the daemon in the loop reads: a
        # decision on a threshold must not differ between the two by a rounding)
        temp: float | None = round((s.die_c + (rng.normal(0, noise_c) if noise_c else 0.0))
                                   * 1000) / 1000
        problems: tuple[str, ...] = ()
        if drop_frac and rng.random() < drop_frac:
            temp, problems = None, ("temp: cannot read (simulated dropout)",)
        if sensor is not None and temp is not None:
            temp = sensor(s.t, temp)
            problems = () if temp is not None else ("temp: cannot read (simulated fault)",)
        r = Reading(s.t, temp_c=temp, battery_wh=s.battery_wh, harvest_w=s.harvest_w,
                    problems=problems)
        extra = None
        if device.battery is not None and energy_policy not in ("none", "energy"):
            extra = _energy_decision(energy_policy, device, top_w, r, s, fixed_w,
                                     oracle_forecast, oracle_days)
        cstate, out = control.step(cstate, r, ladder_, ccfg, current, extra=extra)
        if out.rung != current:
            res.rung_changes += 1
            current = out.rung
        rung = ladder_[current]
        delivered, latency = run_load(plant, rung, min(rate_hz, out.rate_cap_hz),
                                      latency_target_s, dt, res)
        res.bounded = res.bounded or cstate.bounded
        if record_every and i % record_every == 0:
            bat = device.battery
            vals = (s.t, s.die_c, ambient_c(s.t), current, delivered, latency * 1e3,
                    rung.accuracy, (s.battery_wh / bat.capacity_wh) if bat and s.battery_wh
                    is not None else math.nan)
            for k, v in zip(names, vals, strict=True):
                res.trace[k].append(float(v))
    return res


def _energy_decision(policy: str, device: DeviceProfile, max_w: float, r: Reading, s,
                     fixed_w: float | None, oracle: np.ndarray | None,
                     oracle_days: int = 3) -> gov.Decision:
    """The solar bench's baselines (not edgerun's policy, which runs inside control.step)."""
    b = device.battery
    assert b is not None
    cfg = energy_mod.EnergyConfig(b.capacity_wh, device.power.idle_w, max_w, b.reserve_frac,
                                  b.charge_efficiency)
    reserve = cfg.reserve_frac * cfg.capacity_wh
    if policy == "greedy":
        return gov.Decision(math.inf if (s.battery_wh or 0) > reserve else 0.0)
    if policy == "fixed":
        return gov.Decision(fixed_w if fixed_w is not None else math.inf)
    if policy == "oracle":
        # The best a planner can do: the true harvest of the next `oracle_days` days, no
        # margin, no buffer, no neutrality hedge (it knows what is coming).
        assert oracle is not None
        ocfg = replace(cfg, forecast_margin=0.0, neutral=False, buffer_h=0.0,
                       horizon_slots=oracle_days * cfg.slots_per_day)
        slot = int(r.t // (energy_mod.DAY / cfg.slots_per_day))
        window = oracle[slot: slot + ocfg.horizon_slots]
        window = np.pad(window, (0, ocfg.horizon_slots - len(window)))
        p = energy_mod.plan_power(s.battery_wh or 0.0, r.t, (), ocfg,
                                  ahead=tuple(float(w) for w in window))
        return gov.Decision(p if p < cfg.max_w else math.inf)
    raise ValueError(f"unknown energy policy {policy!r} (none, energy, greedy, fixed, oracle)")
