"""The control step's settings from the device profile, the sensor found at start-up and the
governor's settings (the [governor] config section): the one place they are translated into
power/control.py's ControlConfig. power/ imports nothing of runtime/, so the section comes in
as anything with its typed fields (`GovernorSettings`; runtime.config.GovernorSection is one,
where its validation names the key at fault).
"""

from __future__ import annotations

import math
from typing import Protocol

from power import control
from power import energy as energy_mod
from power.device import DeviceProfile
from power.thermal_source import ThermalSource


class GovernorSettings(Protocol):
    """The governor's settings the control step uses ([governor] in the config file)."""

    @property
    def policy(self) -> str: ...  # step_wise | power_allocator | off
    @property
    def energy(self) -> bool: ...  # battery devices: also run the energy budget
    @property
    def min_rate_hz(self) -> float: ...
    @property
    def hold_invalid_s(self) -> float: ...
    @property
    def dwell_s(self) -> float: ...
    @property
    def max_dwell_s(self) -> float: ...
    @property
    def band_c(self) -> float: ...


def control_config(device: DeviceProfile, g: GovernorSettings, thermal: ThermalSource | None,
                   rate_hz: float, duty_cycled: bool = False) -> control.ControlConfig:
    """The control step's settings: the thermal governor on the trips of `thermal` (None: no
    usable sensor, no governor), the energy budget for the battery, the core's timers, `g` the
    governor's settings, `rate_hz` the rate rung powers are planned at; `duty_cycled`: a
    duty cycle spends the battery ([sleep] enabled on a board that can suspend).

    Duty cycled, the energy budget is learnt and planned but leaves the rung and the rate to
    the thermal governor (ControlConfig.energy_binds): the box sleeps most of the time, and
    the duty cycle (power/duty_cycle.py) plans the battery over the suspended floor, the wakes'
    transitions, camera and awake time and the running rung's burst, re-planned at every
    wake; a second budget planned as if the box drew its idle power all day asked for 0 W
    while the sleep plan had 1.19 W (two planners, one battery), and stepping the rung down
    saved microjoules a burst next to the ~20 J of a wake, at a loss of accuracy, while its
    rate cap kept the box awake longer. Re-planning the rung budget over the suspended floor
    at the burst rate instead would either always fit (a burst's inference is a tiny part of
    a period's energy) or, counting the wakes, duplicate the duty cycle's plan and take the
    battery twice. docs/sleep.md, "One battery, one planner"."""
    th = device.thermal
    gcfg = None
    if thermal is not None and g.policy != "off":
        gcfg = control.governor_config(device, g.policy,
                                       control_c=thermal.trip("passive").temp_c,
                                       critical_c=thermal.trip("critical").temp_c,
                                       hyst_c=thermal.trip("passive").hyst_c,
                                       band_c=g.band_c)
    ecfg = None
    if device.battery is not None and g.energy:
        b = device.battery
        ecfg = energy_mod.EnergyConfig(b.capacity_wh, device.power.idle_w, math.inf,
                                       b.reserve_frac, b.charge_efficiency)
    return control.ControlConfig(
        governor=gcfg, energy=ecfg, rate_hz=rate_hz, min_rate_hz=g.min_rate_hz,
        floor_w=device.power.idle_w,  # budgets in box watts with or without a governor
        energy_binds=not duty_cycled,
        hold_invalid_s=g.hold_invalid_s, dwell_s=g.dwell_s, max_dwell_s=g.max_dwell_s,
        **control.guard_settings(th.model if th else None))
