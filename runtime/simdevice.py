"""The device simulator as a thread: drives power.plant.Plant with the daemon's real load and
writes the sysfs tree the daemon's sensors read (the hardware boundary stays files)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from power.device import DeviceProfile
from power.plant import SCENARIOS, Plant, ambient

log = logging.getLogger("edgerun.sim")


class SimulatedDevice:
    """Steps the plant every `period_s` of wall time by `period_s * speed` simulated seconds."""

    def __init__(self, device: DeviceProfile, root: Path, scenario: str, speed: float,
                 start_hour: float, load_w: Callable[[], float], period_s: float = 0.25):
        kind, base, swing = SCENARIOS[scenario]
        self.plant = Plant(device, ambient(kind, base, swing), t0=start_hour * 3600, root=root)
        self.plant.write_sysfs()
        self._speed, self._period, self._load_w = speed, period_s, load_w
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
                self.plant.step((now - last) * self._speed, self._load_w())
            except Exception:  # the simulator failing must not stop the daemon
                log.exception("simulator step failed")
            last = now

    def stop(self) -> None:
        """Stop stepping (the tree keeps its last values)."""
        self._stop.set()
        self._thread.join(2)
