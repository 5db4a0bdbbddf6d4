"""The health message: everything an operator needs to judge a device at a glance.

Derived from one `DeviceState` (runtime/device/state.py), the snapshot the main loop takes
each control tick; its JSON Schema is in runtime/wire/payloads.py. Rungs count from 1 (the
cheapest) to `rungs` (the selector's choice), the same way in logs, status, results and the
demo.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
from typing import Any

from runtime import __version__
from runtime.device.state import DeviceState, thaw


def _num(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def health(s: DeviceState) -> dict[str, Any]:
    """The health message derived from one snapshot `s` (a fresh dict: the caller may change
    it); it reads nothing but `s`, so any thread may call it."""
    r, out = s.reading, s.out
    hot = s.trips.get("hot")
    pipeline = thaw(s.pipeline)
    h: dict[str, Any] = {
        "v": 1, "t": s.t, "boot": s.boot, "uptime_s": s.uptime_s,
        "temp_c": r.temp_c if r else None,
        "passive_trip_c": s.trips.get("passive"),
        "throttled": bool(r and r.temp_c is not None and hot is not None and r.temp_c >= hot),
        "battery_frac": r.battery_frac if r else None,
        "harvest_w": r.harvest_w if r else None,  # solar input (dashboard timeline)
        "sensor_problems": list(r.problems) if r else [],
        "model": s.model, "choice": s.choice,
        "choice_reason": s.choice_reason,
        "rung": s.rung + 1, "rungs": s.rungs,
        "accuracy": s.accuracy,
        "energy_mj": s.energy_mj, "energy_source": s.energy_source,
        "rung_energy_mj": round(s.rung_energy_j * 1e3, 4),
        "power_w": round(s.power_w, 3),  # idle + inference
        "governor": {
            "policy": s.policy, "enabled": s.thermal_disabled == "",
            "disabled_reason": s.thermal_disabled or None,
            "level": out.level if out else 0,
            "budget_w": _num(out.budget_w, 4) if out else None,
            "reason": out.reason if out else "start",
            "temp_filtered_c": _num(out.temp_c, 2) if out else None,
            "slope_c_per_min": _num(out.slope_c_per_min, 2) if out else None,
            "physics_bounded": s.bounded,
            # why a richer rung or rate the budget allows is not taken now (None: nothing is
            # held back): the guard's predicted settle temperature, the rung hold, an excursion
            "refused": (out.refused or None) if out else None,
        },
        "rate_cap_hz": _num(s.rate_cap_hz),
        "operator_rate_hz": _num(s.operator_rate_hz),
        "pipeline": pipeline, "backlog": thaw(s.backlog),
        "devices": thaw(s.devices),
        "preprocess": thaw(s.preprocess),
        "power_rails": thaw(s.power_rails),
        "integrations": thaw(s.integrations),
        "storage": thaw(s.storage),
    }
    h["slo"] = pipeline.pop("slo")
    h.update(thaw(s.models))  # each model's rung and target (runtime/choice/joint.py)
    if s.box_energy is not None:  # energy per frame: the box's and the model's
        h["box_energy"] = thaw(s.box_energy)
    h.update(thaw(s.ota))
    if s.mqtt is not None:
        h["mqtt"] = thaw(s.mqtt)
    if s.simulated is not None:
        h["simulated"] = thaw(s.simulated)
    if s.sleep is not None:
        h["sleep"] = thaw(s.sleep)
    if s.clk is not None:  # when `t` was read: synced or not, boot id, boottime
        h["clk"] = thaw(s.clk)
    if s.clock is not None:
        h["clock"] = thaw(s.clock)
    return h


def versions() -> dict[str, str]:
    """Versions of edgerun and the engines, for birth and health."""
    out = {"edgerun": __version__}
    for mod, name, dist in (("onnxruntime", "onnxruntime", "onnxruntime"),
                            ("openvino", "openvino", "openvino"),
                            ("cv2", "opencv", "opencv-python-headless")):
        try:  # an engine not in use is not imported for this (openvino: ~10 MB resident)
            out[name] = (str(sys.modules[mod].__version__) if mod in sys.modules
                         else importlib.metadata.version(dist))
        except Exception:  # an engine that is not installed has no version to report
            continue
    return out
