"""What the daemon says about itself in one line or one message: systemd's STATUS= line, the
MQTT birth message's fields, and what Home Assistant's entities describe. Each is derived from
one `DeviceState` (runtime/device/state.py) and reads nothing else, so the MQTT thread may call
birth and ha_info while the main loop changes the daemon."""

from __future__ import annotations

from typing import Any

from runtime import __version__
from runtime.device.health import versions
from runtime.device.rung_switch import rung_label
from runtime.device.state import DeviceState
from runtime.telemetry.homeassistant import DeviceInfo


def status_line(s: DeviceState) -> str:
    """One line for systemd STATUS= and the log."""
    out = s.out
    temp = s.reading.temp_c if s.reading else None
    return (f"{s.choice or '-'} rung {rung_label(s.rung, s.rungs)}"
            + (f", box rung {rung_label(s.joint_rung, s.joint_rungs)} over "
               f"{s.joint_models} models" if s.joint_rungs else "")
            + (f", {temp:.1f} °C" if temp is not None else "")
            + (f", {out.reason}" if out and out.reason else "")
            + (", GOVERNOR OFF: no thermal sensor" if s.thermal_disabled else ""))


def birth(s: DeviceState) -> dict[str, Any]:
    """The birth message's fields: versions, the [model]'s model and variant, its version."""
    return {"versions": versions(), "model": s.model, "choice": s.choice,
            "model_version": s.model_version}


def ha_info(s: DeviceState) -> DeviceInfo:
    """What Home Assistant's entities describe (called on the MQTT thread)."""
    return DeviceInfo(labels=s.labels, model=s.device_name, sw_version=__version__,
                      battery=s.battery)
