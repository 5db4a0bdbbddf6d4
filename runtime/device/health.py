"""The health message: everything an operator needs to judge a device at a glance.

Assembled from the parts the daemon wires together; its JSON Schema is in
runtime/wire/payloads.py. Rungs count from 1 (the cheapest) to `rungs` (the selector's
choice), the same way in logs, status, results and the demo.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
import time
from pathlib import Path
from typing import Any

from power import ina3221
from runtime import __version__
from runtime.device.host import HealthHost


def _num(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def health(d: HealthHost) -> dict[str, Any]:
    """One health message from the daemon `d`."""
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
            # why a richer rung or rate the budget allows is not taken now (None: nothing is
            # held back): the guard's predicted settle temperature, the rung hold, an excursion
            "refused": (out.refused or None) if out else None,
        },
        "rate_cap_hz": _num(d.pipeline.rate_cap_hz),
        "operator_rate_hz": _num(d.operator_rate_hz),
        "pipeline": d.pipeline.stats(), "backlog": d.outbox.stats(),
        "devices": d.devices,
        "preprocess": d.preprocess.report,
        # a simulated device's rails are not this host's
        "power_rails": None if d.sim else ina3221.report(Path(d.cfg.device.sysfs_root),
                                                         d.device.sensors.ina3221_rails),
    }
    h["slo"] = h["pipeline"].pop("slo")
    h.update(d.models_health())  # each model's rung and target (runtime/choice/joint.py)
    if d.box_energy is not None:  # energy per frame: the box's and the model's
        h["box_energy"] = d.box_energy.report()
    if d.ota is not None:
        h.update(d.ota.health())
    if d.publisher:
        h["mqtt"] = d.publisher.health()
    if d.sim:
        h["simulated"] = d.sim.report()
    if d.sleeper:
        h["sleep"] = d.sleeper.health()
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


MODELS_REASON_CHARS = 8_000  # health's models[].reason, all models together


def share_reasons(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """health's `models` with each reason cut to its share of MODELS_REASON_CHARS (at most
    the schema's 4096): 65 models' reasons of ~1000 characters, with their keys and sources,
    pushed health over the 64 KiB a coordinator admits (64 sources on 64 models with short
    paths measured 54 KB even so: the rest is per-source and per-model figures). Cut at the
    end: the choice and its target come first; the sources' share of the box, the same for
    every model, is also in the top-level choice_reason."""
    per = min(4000, MODELS_REASON_CHARS // max(len(models), 1))
    for m in models:
        if len(m["reason"]) > per:
            m["reason"] = m["reason"][:per - 3] + "..."
    return models
