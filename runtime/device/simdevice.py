"""The simulated board in lockstep with the daemon's control loop: the plant (power.plant)
moves only in `advance`, by exactly the simulated time the loop has ticked, heated by the rung
and rate the daemon runs at that moment; then it writes the sysfs tree the daemon's sensors
read (the hardware boundary stays files). One clock (power.simclock.SimClock) carries the
simulated time to everything else that reads it: the sensors' timestamps, the synthetic
camera's frame slots, the simulated suspend. A busy host slows the simulation; it does not
change what the controller saw or decided (docs/power.md, "Daemon in the loop").

The load model and the tally are the simulator harness's own (power.closed_loop.run_load), so
a daemon-in-the-loop run and a pure simulation of the same scenario count the same things:
critical trips, throttled minutes, accuracy-weighted good inferences, rung changes. They reach
the operator (and bench/governor.py --daemon) in health["simulated"].
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from power.closed_loop import RunResult, run_load
from power.device import DeviceProfile
from power.plant import SCENARIOS, Plant, ambient, solar_trace
from power.rungs import Rung
from power.simclock import Pace, SimClock

log = logging.getLogger("edgerun.sim")

MAX_STEP_S = 1.0  # the plant's step (the pure simulation's dt): throttling and trips per step
SKY_STEP_S = 300.0  # the weather's irradiance, one value per this many simulated seconds
SKY_DAYS = 365  # the sky's year: a run past it meets the same year again (Plant repeats it)
MAX_RUNGS = 64  # rung_s in health: the longest-run rungs, at most this many (payloads.py)


class SimulatedDevice:
    """The plant, its clock and its pace against wall time (module doc)."""

    def __init__(self, device: DeviceProfile, root, scenario: str, speed: float,
                 start_hour: float, load: Callable[[], tuple[Rung | None, float]],
                 latency_target_s: float, wall: Callable[[], float] = time.monotonic,
                 duration_s: float = math.inf, irradiance: np.ndarray | None = None,
                 battery_frac: float = 1.0):
        kind, base, swing = SCENARIOS[scenario]
        self.root = root
        self.plant = Plant(device, ambient(kind, base, swing), t0=start_hour * 3600,
                           irradiance=irradiance, irradiance_step_s=SKY_STEP_S,
                           battery_frac=battery_frac, irradiance_repeats=True)
        self.plant.write_sysfs(root)
        self.t0 = self.plant.s.t
        self.clock = SimClock(self.t0)
        self.pace = Pace(speed, self.t0, wall())
        self.tally = RunResult("daemon")
        self._load, self._target, self._wall = load, latency_target_s, wall
        self.duration_s = duration_s  # simulated time after which the clock stops
        self._last_rung: str | None = None
        # what the demo's summary says (runtime/tools/demo.py): the hottest the die got, and
        # simulated seconds on each rung (by variant id; "" while nothing ran)
        self.die_max_c = self.plant.s.die_c
        self.rung_s: dict[str, float] = {}

    def start(self) -> None:
        """Serving starts: the pace counts from now (start-up and profiling took wall time,
        not simulated time)."""
        self.pace.restart(self.clock.now(), self._wall())

    def due_in(self, tick_s: float) -> float:
        """Wall seconds until the next tick of `tick_s` simulated seconds is due (inf once
        the simulated run is over)."""
        if self.finished:
            return math.inf
        return self.pace.due_in(self.clock.now() + tick_s, self._wall())

    def ticks_due(self, tick_s: float, most: int = 20) -> int:
        """How many ticks of `tick_s` are due now (at most `most`: the loop's other duties,
        commands and health, get their turn in between); 0 when the next is not yet due,
        and for good once `duration_s` has been simulated (the tally is final)."""
        if self.finished:
            return 0
        late = self.pace.late_s(self.clock.now() + tick_s, self._wall())
        if late < 0:
            return 0
        left = self.duration_s - (self.clock.now() - self.t0)  # never past the end
        return min(most, 1 + int(late * self.pace.speed / tick_s),
                   max(1, math.ceil(left / tick_s - 1e-9)) if math.isfinite(left) else most)

    @property
    def finished(self) -> bool:
        """True once `duration_s` of simulated time has passed."""
        return self.clock.now() - self.t0 >= self.duration_s - 1e-9

    def advance(self, dt: float) -> None:
        """Step the plant by exactly `dt` simulated seconds with the load running now (in
        steps of at most MAX_STEP_S), tally it, write the tree, move the clock."""
        end = self.plant.s.t + dt
        was_finished = self.finished
        try:
            rung, offered = self._load()
            n = max(1, math.ceil(dt / MAX_STEP_S - 1e-9))
            for _ in range(n):
                if rung is None:
                    self.plant.step(dt / n, 0.0)
                else:
                    run_load(self.plant, rung, offered, self._target, dt / n, self.tally)
                self.die_max_c = max(self.die_max_c, self.plant.s.die_c)
            vid = rung.variant_id if rung is not None else ""
            self.rung_s[vid] = self.rung_s.get(vid, 0.0) + dt
            if rung is not None:
                if self._last_rung is not None and rung.variant_id != self._last_rung:
                    self.tally.rung_changes += 1
                self._last_rung = rung.variant_id
            self.plant.write_sysfs(self.root)
        except Exception:  # the simulator failing must not stop the daemon
            log.exception("simulator step failed: the rest of this step is idle")
            with contextlib.suppress(Exception):  # time still moves by exactly dt
                if end - self.plant.s.t > 1e-9:
                    self.plant.step(end - self.plant.s.t, 0.0)
        self.clock.advance_to(self.plant.s.t)
        line = self.pace.reached(self.plant.s.t, self._wall())
        if line:
            log.warning("%s", line)
        if self.finished and not was_finished:  # said once, where the clock stops
            log.info("simulated %.4g h: the simulated clock stops here ([simulator] hours); "
                     "the control loop holds", (self.clock.now() - self.t0) / 3600)

    def report(self) -> dict:
        """What the simulated run delivered so far (for health), and its pace."""
        p, r = self.plant, self.tally
        speed = self.pace.speed_x()
        return {"t": p.s.t, "ambient_c": round(p.ambient_c(p.s.t), 2),
                "elapsed_s": round(p.s.t - self.t0, 1), "critical_trips": p.s.critical_trips,
                "throttled_min": round(p.s.throttled_s / 60, 2),
                "good": round(r.good, 1), "good_weighted": round(r.good_weighted, 1),
                "rung_changes": r.rung_changes, "energy_wh": round(r.energy_wh, 4),
                "suspended_h": round(p.s.suspended_s / 3600, 4), "suspends": p.s.suspends,
                "battery_frac": round(p.s.battery_wh / p.device.battery.capacity_wh, 4)
                if p.s.battery_wh is not None and p.device.battery else None,
                "speed": self.pace.speed, "speed_x": round(speed, 1) if speed else None,
                "slowed": self.pace.slowed, "slowdowns": self.pace.slowdowns,
                "die_max_c": round(self.die_max_c, 2),
                "rung_s": {k: round(v, 1) for k, v in
                           sorted(self.rung_s.items(), key=lambda kv: -kv[1])[:MAX_RUNGS]}}

    def stop(self) -> None:
        """Stop: whoever waits for simulated time is released (the tree keeps its values)."""
        self.clock.close()


SHM = Path("/dev/shm")


def default_root(state_dir: Path, shm: Path = SHM) -> Path:
    """Where the simulated sysfs tree goes when `[simulator] root` names none: in memory, as
    a kernel's sysfs is (`/dev/shm/edgerun-sim-<state_dir's hash>`, one per daemon), else
    `<state_dir>/sim-sysfs`. On the state disk its writes (a few files each step) were counted
    as the daemon's own: an outside run's simulated solar node "wrote" 3.7-5.4 GB a day and
    `edgerun check` gave its card 13 days (2026-12-07)."""
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        key = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
        return shm / f"edgerun-sim-{key}"
    return Path(state_dir) / "sim-sysfs"


def simulate(cfg: Any, device: DeviceProfile, state_dir: Path,
             load: Callable[[], tuple[Rung | None, float]]) -> SimulatedDevice:
    """The board `[simulator]` (`cfg`: runtime.config.Config) asks for, its sysfs tree under
    `state_dir` unless the section names one; `load`: the rung running and its rate."""
    sc = cfg.simulator
    root = Path(sc.root) if sc.root else default_root(state_dir)
    sky = sky_for(sc.weather_seed) if sc.weather_seed >= 0 and device.solar is not None else None
    if sc.weather_seed >= 0 and sky is None:
        log.warning("[simulator] weather_seed = %d: device profile %s has no solar panel; no "
                    "sky simulated", sc.weather_seed, device.name)
    if sc.battery_frac != 1.0 and device.battery is None:
        log.warning("[simulator] battery_frac = %g: device profile %s has no battery; ignored",
                    sc.battery_frac, device.name)
    sim = SimulatedDevice(device, root, sc.scenario, sc.speed, sc.start_hour, load,
                          cfg.constraints.latency_ms / 1e3,
                          duration_s=sc.hours * 3600 or math.inf, irradiance=sky,
                          battery_frac=sc.battery_frac)
    log.info("simulated %s, scenario %s at %gx, sysfs tree %s%s", device.name, sc.scenario,
             sc.speed, root, f", the sky of weather seed {sc.weather_seed}" if sky is not None
             else "")
    return sim


def sky_for(seed: int) -> np.ndarray:
    """A year of irradiance (power.plant.solar_trace, one value per SKY_STEP_S) from simulated
    hour 0, the plant repeating it past its end: one length whatever the run's start and end
    (the trace's random draws depend on its length), so every life of a device started again
    later meets the same weather on the same day."""
    return solar_trace(SKY_DAYS, seed, SKY_STEP_S)
