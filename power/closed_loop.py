"""Closed loop: simulated device + governor (+ energy budget) + ladder, faster than real time.

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

from power import energy as energy_mod
from power import governor as gov
from power.device import DeviceProfile
from power.plant import Plant
from power.sensors import Reading
from runtime.selector import Rung, select_for_budget

THERMAL_POLICIES = ("kernel", "cheapest", "step_wise", "power_allocator")


def device_ladder(rungs: Sequence[Rung], cpu_s: Sequence[float],
                  device: DeviceProfile) -> list[Rung]:
    """Recorded rungs (from the CI machine) as they would run on `device`: latency and CPU time
    scaled by perf_scale, energy = CPU-seconds x active W per core, one session per core."""
    pm = device.power
    return [replace(r, latency_s=r.latency_s * pm.perf_scale,
                    energy_j=c * pm.perf_scale * pm.active_w_per_core, parallel=pm.cores)
            for r, c in zip(rungs, cpu_s, strict=True)]


def governor_config(device: DeviceProfile, rungs: Sequence[Rung], rate_hz: float,
                    policy: str, design_ambient_c: float = 25.0) -> gov.GovernorConfig:
    """Governor settings derived from the device profile and the ladder."""
    th = device.thermal
    assert th is not None
    m = th.model
    control = th.trip("passive").temp_c
    # level 0 is unrestricted; then each rung at full rate; then the cheapest at 1/2, 1/4, 1/8
    levels = [math.inf] + [r.power_w(rate_hz) for r in reversed(rungs[:-1])]
    levels += [rungs[0].power_w(rate_hz) / 2 ** k for k in (1, 2, 3)]
    sustainable = max(0.1, (control - design_ambient_c) / (m.r_die_case + m.r_case_amb)
                      - device.power.idle_w)
    return gov.GovernorConfig(
        control_c=control, critical_c=th.trip("critical").temp_c, sustainable_w=sustainable,
        max_w=rungs[-1].power_w(rate_hz), levels_w=tuple(levels), policy=policy,  # type: ignore[arg-type]
        hyst_c=th.trip("passive").hyst_c)


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
    trace: dict[str, list[float]] = field(default_factory=dict)

    @property
    def mean_accuracy(self) -> float:
        """Accuracy averaged over good inferences."""
        return self.good_weighted / self.good if self.good else 0.0


def simulate(device: DeviceProfile, rungs: Sequence[Rung], ambient_c: Callable[[float], float],
             policy: str, duration_s: float, rate_hz: float, latency_target_s: float,
             dt: float = 1.0, t0: float = 0.0, irradiance: np.ndarray | None = None,
             energy_policy: str = "none", record_every: int = 0,
             fixed_w: float | None = None, oracle_forecast: np.ndarray | None = None,
             oracle_days: int = 3,
             battery_frac: float = 1.0) -> RunResult:
    """Run one policy; see module doc. `energy_policy`: none | energy (edgerun's budget) |
    greedy (full power above reserve) | fixed (constant `fixed_w`) | oracle (the planner fed the
    true future harvest per slot, `oracle_forecast`, `oracle_days` ahead)."""
    plant = Plant(device, ambient_c, t0=t0, irradiance=irradiance, battery_frac=battery_frac)
    top = len(rungs) - 1
    gcfg = governor_config(device, rungs, rate_hz, "step_wise" if policy in
                           ("kernel", "cheapest") else policy)
    gstate = gov.GovernorState()
    ecfg = estate = None
    if device.battery is not None and energy_policy != "none":
        b = device.battery
        ecfg = energy_mod.EnergyConfig(b.capacity_wh, device.power.idle_w, gcfg.max_w,
                                       b.reserve_frac, b.charge_efficiency)
        estate = energy_mod.initial_state(ecfg)
    res = RunResult(policy)
    current = top
    rung_state = gov.RungHold(top)
    names = ("t", "temp_c", "ambient_c", "rung", "rate_hz", "latency_ms", "accuracy",
             "battery_frac")
    res.trace = {k: [] for k in names} if record_every else {}
    th = device.thermal
    assert th is not None
    steps = int(duration_s / dt)
    for i in range(steps):
        s = plant.s
        r = Reading(s.t, temp_c=s.die_c, battery_wh=s.battery_wh, harvest_w=s.harvest_w)
        if policy == "kernel":
            decision = gov.Decision(math.inf)
        elif policy == "cheapest":
            decision = gov.Decision(rungs[0].power_w(rate_hz))
        else:
            gstate, decision = gov.step(gstate, r, gcfg)
        if ecfg is not None and estate is not None:
            if energy_policy == "energy":
                estate, edec = energy_mod.step(estate, r, ecfg)
            else:
                edec = _energy_decision(energy_policy, ecfg, r, s, fixed_w, oracle_forecast,
                                        oracle_days)
            decision = gov.combine(decision, edec)
        proposed, rate = select_for_budget(rungs, decision.budget_w, rate_hz, current)
        if policy == "cheapest":
            proposed = 0
        rung_state = gov.hold(rung_state, proposed, s.t, gcfg.dwell_s, gcfg.max_dwell_s)
        if rung_state.rung != current:
            res.rung_changes += 1
            current = rung_state.rung
        rung = rungs[current]
        latency = rung.latency_s * (th.throttle_latency_factor if s.throttled else 1.0)
        delivered = min(rate, rung.parallel / latency) if plant.on else 0.0
        e = rung.energy_j * (th.throttle_energy_factor if s.throttled else 1.0)
        plant.step(dt, e * delivered)
        res.energy_wh += plant.s.power_w * dt / 3600
        if latency <= latency_target_s:
            res.good += delivered * dt
            res.good_weighted += delivered * dt * rung.accuracy
        if record_every and i % record_every == 0:
            bat = device.battery
            vals = (s.t, s.die_c, ambient_c(s.t), current, delivered, latency * 1e3,
                    rung.accuracy, (s.battery_wh / bat.capacity_wh) if bat and s.battery_wh
                    is not None else math.nan)
            for k, v in zip(names, vals, strict=True):
                res.trace[k].append(float(v))
    res.critical_trips = plant.s.critical_trips
    res.throttled_min = plant.s.throttled_s / 60
    res.below_reserve_h = plant.s.below_reserve_s / 3600
    return res


def _energy_decision(policy: str, cfg: energy_mod.EnergyConfig, r: Reading, s,
                     fixed_w: float | None, oracle: np.ndarray | None,
                     oracle_days: int = 3) -> gov.Decision:
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
