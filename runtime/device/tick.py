"""The control tick (main loop only): read the sensors, run the one pure control step
(power/control.py), apply its rung and rate cap, and give live energy, the tiles' re-plan,
re-profiling, probation and duty cycling their turn; and the load the rung running puts on
the device (what a simulated plant heats with, health's power)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from power import control
from power.accel_throttle import read_devfreq
from power.cputime import named_threads_cpu_s
from power.nvml import meter_for
from power.rungs import Rung, with_other
from runtime.device import ladders, live_energy

if TYPE_CHECKING:
    from runtime.device.host import PartsHost

log = logging.getLogger("edgerun.daemon")  # one logger for all the daemon's parts


def control_tick(d: PartsHost) -> None:
    """Read sensors, run the one control step (power.control), apply its rung and rate cap;
    then live energy, probation, re-profiling and duty cycling get their turn."""
    r = d.sensors.read()
    d.reading = r
    if (said := d.sensor_watch.read(r, d.cfg.governor.hold_invalid_s)) is not None:
        d.event("sensor_invalid", "warning", problems=list(r.problems), bad_reads=said)
    live_energy.update_running(d)
    d.drift.tick(d)
    if d.box_energy is not None:
        d.box_energy.sample(time.monotonic(), *d.pipeline.take_stage_cpu(),
                            lambda: named_threads_cpu_s("mqtt"))
    assert d.ccfg is not None
    ladders.check_tiles(d)
    box = d.box
    rungs = box.control_rungs()
    if not d.sim and d.box_energy is not None:
        # budgets are box watts: the stages around inference draw power too (a simulated
        # plant heats with its rungs alone, so a simulation leaves them out)
        rungs = with_other(rungs, d.box_energy.around_j())
    d.cstate, out = control.step(d.cstate, r, rungs, d.ccfg, box.control_current(),
                                 d.operator.rate_hz)
    d.control_out = out
    if d.refusals.due(out.refused, r.t):
        log.info("not stepping up: %s (rung %d/%d)", out.refused, box.control_current() + 1,
                 len(rungs))
    for e in out.events:
        (log.critical if e.severity == "critical" else log.warning)("%s: %s", e.type, e.detail)
        d.event(e.type, e.severity, detail=e.detail)
    d.pipeline.rate_cap_hz = out.rate_cap_hz
    if out.rung != box.control_current() or box.off_chain:
        for m, i in box.picks(out.rung):  # the [model]'s rung, or each model's part
            ladders.move_model(d, m, i, out.reason or "budget")
        box.relocate()
    if box.control_current() != out.rung:  # the switch failed: keep what runs
        d.cstate = replace(d.cstate, hold=replace(d.cstate.hold, rung=box.control_current()))
    d.operator.keep_energy(d.cstate.energy)  # when an hour slot closed
    check_conditions(d, r.temp_c)
    d.ota.tick()  # probation of a new model version
    if d.sleeper:  # duty cycling: the schedule's cap, and the sleep between bursts
        d.sleeper.after_control()


def check_conditions(d: PartsHost, temp: float | None) -> None:
    """Re-profile when the device asks for it (runtime.device.profiling.Profiler.due);
    never for a simulated device: its temperature is not this host's."""
    if d.sim:
        return
    why, slow = d.profiler.due(temp, d.pipeline, d.box.model, d.cfg.daemon,
                               live_energy.running_j(d),
                               lambda device: accelerator_state(d, device))
    if slow:
        d.event("slow_inference", "warning", **slow)
    if why:
        d.reprofile(why)


def accelerator_state(d: PartsHost, actual_device: str) -> Any:
    """What the accelerator a session reports says of its clocks (NVML's clock-event
    reasons, else the profile's GPU devfreq; power/accel_throttle.py), or None."""
    m = meter_for(d.gpu_meters, actual_device)
    if m is not None:
        return m.clock_state()
    devfreq = d.device.sensors.gpu_devfreq if d.device else ""  # a SoC GPU: devfreq
    return read_devfreq(Path(d.cfg.device.sysfs_root) / devfreq) if devfreq else None


def offered_rate_hz(d: PartsHost) -> float:
    """The rate the control loop plans for, under the caps now in force."""
    assert d.ccfg is not None
    return min(d.ccfg.rate_hz, d.pipeline.rate_cap_hz)


def sim_load(d: PartsHost) -> tuple[Rung | None, float]:
    """The rung running and the rate it is offered (what the simulated device heats
    with)."""
    rung = d.frame_rung()
    return (rung, offered_rate_hz(d)) if rung is not None else (None, 0.0)


def load_w(d: PartsHost) -> float:
    """Dynamic power of the inference load: the running rung at the rate it runs. A
    simulated device reports the offered rate, which is what its plant heats with; a real
    one the rate achieved over the last 30 s (a source slower than the plan, or a pause,
    draws less than the plan)."""
    rung, rate = sim_load(d)
    if rung is None:
        return 0.0
    return rung.power_w(rate if d.sim else d.pipeline.rate_hz())
