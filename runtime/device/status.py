"""What the daemon says about itself in one line or one message: systemd's STATUS= line, the
MQTT birth message's fields, and what Home Assistant's entities describe. Read from the
daemon through `host.StatusHost`, never its private attributes."""

from __future__ import annotations

from typing import Any

from runtime import __version__
from runtime.device.health import versions
from runtime.device.host import StatusHost
from runtime.device.rung_switch import rung_label
from runtime.telemetry.homeassistant import DeviceInfo


def status_line(d: StatusHost) -> str:
    """One line for systemd STATUS= and the log."""
    a = d.pipeline.active
    out = d.control_out
    temp = d.reading.temp_c if d.reading else None
    return (f"{a.variant_id if a else '-'} rung {rung_label(d.current, len(d.rungs))}"
            + (f", box rung {rung_label(d.joint_current, len(d.joint))} over "
               f"{len(d.joint and d.joint[0].picks)} models" if d.joint else "")
            + (f", {temp:.1f} °C" if temp is not None else "")
            + (f", {out.reason}" if out and out.reason else "")
            + (", GOVERNOR OFF: no thermal sensor" if d.thermal_disabled else ""))


def birth(d: StatusHost) -> dict[str, Any]:
    """The birth message's fields: versions, the [model]'s model and variant, its version."""
    a = d.pipeline.active
    return {"versions": versions(), "model": d.manifest.name,
            "choice": a.variant_id if a else "",
            "model_version": (d.ota.version or "") if d.ota else ""}


def ha_info(d: StatusHost) -> DeviceInfo:
    """What Home Assistant's entities describe (called on the MQTT thread)."""
    return DeviceInfo(labels=d.manifest.labels if d.manifest else (),
                      model=d.device.name, sw_version=__version__,
                      battery=bool(d.device.sensors.battery or d.device.battery))
