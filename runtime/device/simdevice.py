"""The device simulator as a thread: steps power.plant.Plant with the daemon's actual rung and
rate, and writes the sysfs tree the daemon's sensors read (the hardware boundary stays files).

The load model and the tally are the simulator harness's own (power.closed_loop.run_load), so
a daemon-in-the-loop run and a pure simulation of the same scenario count the same things:
critical trips, throttled minutes, accuracy-weighted good inferences, rung changes. They reach
the operator (and bench/governor.py --daemon) in health["simulated"].
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from power.closed_loop import RunResult, run_load
from power.device import DeviceProfile
from power.plant import SCENARIOS, Plant, ambient
from power.rungs import Rung

log = logging.getLogger("edgerun.sim")


class SimulatedDevice:
    """Steps the plant by about one simulated second per step (at most 4 steps per wall
    second), so the sensors move as finely as the control loop reads them."""

    def __init__(self, device: DeviceProfile, root, scenario: str, speed: float,
                 start_hour: float, load: Callable[[], tuple[Rung | None, float]],
                 latency_target_s: float):
        kind, base, swing = SCENARIOS[scenario]
        self.plant = Plant(device, ambient(kind, base, swing), t0=start_hour * 3600, root=root)
        self.plant.write_sysfs()
        self.t0 = self.plant.s.t
        self.tally = RunResult("daemon")
        self._speed, self._load, self._target = speed, load, latency_target_s
        self._period = min(0.25, max(0.005, 1.0 / speed))
        self._last_rung: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simulator", daemon=True)

    def start(self) -> None:
        """Start stepping."""
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._period):
            now = time.monotonic()
            try:
                rung, offered = self._load()
                dt = (now - last) * self._speed
                if rung is None:
                    self.plant.step(dt, 0.0)
                else:
                    if self._last_rung is not None and rung.variant_id != self._last_rung:
                        self.tally.rung_changes += 1
                    self._last_rung = rung.variant_id
                    run_load(self.plant, rung, offered, self._target, dt, self.tally)
            except Exception:  # the simulator failing must not stop the daemon
                log.exception("simulator step failed")
            last = now

    def report(self) -> dict:
        """What the simulated run delivered so far (for health)."""
        p, r = self.plant, self.tally
        return {"t": p.s.t, "ambient_c": round(p.ambient_c(p.s.t), 2),
                "elapsed_s": round(p.s.t - self.t0, 1), "critical_trips": p.s.critical_trips,
                "throttled_min": round(p.s.throttled_s / 60, 2),
                "good": round(r.good, 1), "good_weighted": round(r.good_weighted, 1),
                "rung_changes": r.rung_changes, "energy_wh": round(r.energy_wh, 4),
                "suspended_h": round(p.s.suspended_s / 3600, 4), "suspends": p.s.suspends,
                "battery_frac": round(p.s.battery_wh / p.device.battery.capacity_wh, 4)
                if p.s.battery_wh is not None and p.device.battery else None}

    def stop(self) -> None:
        """Stop stepping (the tree keeps its last values)."""
        self._stop.set()
        self._thread.join(2)
