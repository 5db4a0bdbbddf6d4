"""The device's sensors as the daemon opens them at start-up: the thermal sensor and trips
(power.thermal_source; trips from sysfs where present, the profile's otherwise), battery and
solar, and the watches that say when readings go bad or an upgrade is refused. The control
step's settings they allow are power/control_settings.py's.

A configured governor whose sensor cannot be found or read at start-up runs disabled, saying
why (a critical line here; the daemon adds the event and health): inspection goes on at full
precision, and the operator is told.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from power.device import DeviceProfile
from power.sensors import SensorError, SensorSet
from power.thermal_source import ThermalSource, discover_thermal

log = logging.getLogger("edgerun.daemon")

_OFF = "the thermal governor is off and nothing protects the device from overheating"


@dataclass
class Sensing:
    """What `open_sensors` found."""

    sensors: SensorSet
    thermal: ThermalSource | None = None
    trips: dict[str, float] = field(default_factory=dict)  # trip type -> °C
    disabled: str = ""  # why the thermal governor is off despite the config


def open_sensors(root: Path, device: DeviceProfile, policy: str,
                 clock: Callable[[], float]) -> Sensing:
    """Open the sensors of `device` under sysfs `root` (`policy`: [governor] policy;
    `clock`: the readings' time)."""
    th = device.thermal
    battery = device.sensors.battery or (device.battery.path if device.battery else "")
    solar = device.solar.path if device.solar else ""
    thermal, disabled = None, ""
    if th is not None and policy != "off":
        try:
            thermal = discover_thermal(root, device)
            for line in thermal.describe():
                log.info("%s", line)
        except SensorError as e:
            disabled = f"no thermal sensor found ({e}): {_OFF}"
            log.critical("%s", disabled)
    sensors = SensorSet(root, thermal.temp_file if thermal else "", battery, solar, clock)
    trips: dict[str, float] = {}
    if thermal is not None:
        trips = {t.type: t.temp_c for t in thermal.trips}
        r = sensors.read()
        if r.temp_c is None:
            disabled = (f"thermal sensor {thermal.label} unreadable at start-up "
                        f"({'; '.join(r.problems)}): {_OFF}")
            log.critical("%s", disabled)
    elif th is not None:
        trips = {t.type: t.temp_c for t in th.trips}
    return Sensing(sensors, thermal, trips, disabled)


class SensorWatch:
    """Says when sensor readings go bad: at the first bad read after good ones, at most once
    a minute (a flaky file must not flood the log), with a count of the bad reads so far."""

    def __init__(self) -> None:
        self.last: tuple[str, ...] = ()  # the last reading's problems
        self.bad = 0  # invalid reads so far
        self.said = -math.inf  # monotonic time it was last said

    def read(self, r: Any, hold_s: float) -> int | None:
        """Note reading `r` (`hold_s`: how long the governor holds the last valid value);
        the count of bad reads when it is to be said (an event), else None."""
        if bool(r.problems) == bool(self.last):
            return None
        self.last = r.problems
        if not r.problems:
            return None
        self.bad += 1
        now = time.monotonic()
        if now - self.said < 60:
            return None
        self.said = now
        log.warning("sensor problem: %s (the last valid value is held for %g s, then the "
                    "governor fails safe; %d bad reads so far)", "; ".join(r.problems), hold_s,
                    self.bad)
        return self.bad


def refusal_kind(refused: str) -> str:
    """What a refused upgrade is about, without its changing figures: the words before the
    first number standing alone (`"rung hold"`, `"on an excursion"`, a variant and `would
    settle near`); a digit inside a word is the word's (a variant `yolov8n@...` against
    `yolov5s@...` are two kinds, not one `yolov`)."""
    return _FIGURE.split(refused, maxsplit=1)[0].strip(" :(")


_FIGURE = re.compile(r"(?<![\w@./-])[-+]?\d")  # a number not inside a name


class RefusalWatch:
    """Says why the governor does not step up (control.Output.refused): when the reason's
    kind changes, else at most once per `every_s` of device time, so the log explains a
    rung held low without a line a tick."""

    def __init__(self, every_s: float = 300.0) -> None:
        self.every_s = every_s
        self.kind = ""
        self.said_t = -math.inf

    def due(self, refused: str, t: float) -> bool:
        """True when `refused` (device time `t`) is to be said now."""
        kind = refusal_kind(refused)
        if t < self.said_t:  # device time went back (NTP at boot): start again
            self.said_t = -math.inf
        if not refused:
            self.kind = ""
            return False
        if kind == self.kind and t - self.said_t < self.every_s:
            return False
        self.kind, self.said_t = kind, t
        return True
