"""The health message: everything an operator needs to judge a device at a glance.

Assembled from the parts the daemon wires together; its JSON Schema is in
runtime/wire/payloads.py. Rungs count from 1 (the cheapest) to `rungs` (the selector's
choice), the same way in logs, status, results and the demo.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.device.daemon import Daemon


def _num(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def health(d: Daemon) -> dict[str, Any]:
    """One health message for daemon `d`."""
    r = d.reading
    out = d.control_out
    a = d.pipeline.active
    prof = d.by_id.get(a.variant_id) if a else None
    hot = d.trips.get("hot")
    h: dict[str, Any] = {
        "v": 1, "t": time.time(), "boot": d.outbox.boot,
        "uptime_s": round(time.monotonic() - d.started, 1),
        "temp_c": r.temp_c if r else None,
        "passive_trip_c": d.trips.get("passive"),
        "throttled": bool(r and r.temp_c is not None and hot is not None and r.temp_c >= hot),
        "battery_frac": r.battery_frac if r else None,
        "harvest_w": r.harvest_w if r else None,  # solar input (dashboard timeline)
        "sensor_problems": list(r.problems) if r else [],
        "model": d.manifest.name, "choice": a.variant_id if a else "",
        "choice_reason": d.choice_reason,
        "rung": d.current + 1, "rungs": len(d.rungs),
        "accuracy": d.rungs[d.current].accuracy,
        "energy_mj": prof.energy_mj if prof else None, "energy_source": d.meter.source,
        "rung_energy_mj": round(d.rungs[d.current].energy_j * 1e3, 4),
        "power_w": round(d.device.power.idle_w + d.load_w(), 3),  # idle + inference
        "governor": {
            "policy": d.cfg.governor.policy, "enabled": d.thermal_disabled == "",
            "disabled_reason": d.thermal_disabled or None,
            "level": out.level if out else 0,
            "budget_w": _num(out.budget_w, 4) if out else None,
            "reason": out.reason if out else "start",
            "temp_filtered_c": _num(out.temp_c, 2) if out else None,
            "slope_c_per_min": _num(out.slope_c_per_min, 2) if out else None,
            "physics_bounded": d.cstate.bounded,
        },
        "rate_cap_hz": _num(d.pipeline.rate_cap_hz),
        "operator_rate_hz": _num(d.operator_rate_hz),
        "pipeline": d.pipeline.stats(), "backlog": d.outbox.stats(),
        "devices": d.devices,
        "preprocess": d.preprocess.report,
    }
    h["slo"] = h["pipeline"].pop("slo")
    h.update(d.models_health())  # each model's rung and target (runtime/choice/joint.py)
    if getattr(d, "box", None) is not None:  # energy per frame: the box's and the model's
        h["box_energy"] = d.box.report()
    if d.ota is not None:
        h.update(d.ota.health())
    if d.publisher:
        h["mqtt"] = d.publisher.health()
    if d.sim:
        h["simulated"] = d.sim.report()
    if getattr(d, "sleeper", None):
        h["sleep"] = d.sleeper.health()
    return h
