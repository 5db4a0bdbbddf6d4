"""What the control loop learned and what operators set, kept across restarts.

A solar node learns its harvest forecast over days; a restart (power cut, update, watchdog)
must not throw that away, and an operator's rate cap must not silently lapse. One small JSON
file in the state directory, written atomically (temp file + rename); an unreadable file is
moved aside with a warning and the daemon starts fresh.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from power.energy import EnergyState
from runtime.durable import write_atomic

log = logging.getLogger("edgerun.control_store")

VERSION = 1


def save(path: Path, energy: EnergyState | None, operator_rate_hz: float) -> None:
    """Write the state atomically; errors are logged, never raised (the loop goes on)."""
    doc: dict[str, Any] = {"v": VERSION, "operator_rate_hz": (
        None if math.isinf(operator_rate_hz) else operator_rate_hz),
        "energy": asdict(energy) if energy is not None else None}
    try:
        write_atomic(path, json.dumps(doc))
    except OSError as e:
        log.warning("cannot save the control state to %s (%s); it will be relearned after a "
                    "restart", path, e)


def load(path: Path) -> tuple[EnergyState | None, float]:
    """(energy state or None, operator rate cap or inf). A missing file is a fresh start; a
    broken one is moved aside (`.bad`) and logged."""
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            raise ValueError(f"unknown version {doc.get('v') if isinstance(doc, dict) else doc!r}")
        rate = doc.get("operator_rate_hz")
        rate = math.inf if rate is None else float(rate)
        if not rate > 0:
            raise ValueError(f"operator_rate_hz {rate} is not > 0")
        e = doc.get("energy")
        return (_energy(e) if e is not None else None), rate
    except FileNotFoundError:
        return None, math.inf
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
        # RecursionError: a deeply nested file stopped every start-up (a crash loop)
        bad = path.with_name(path.name + ".bad")
        log.warning("control state %s is unreadable (%s); moved to %s, starting fresh", path,
                    e, bad)
        with contextlib.suppress(OSError):
            os.replace(path, bad)
        return None, math.inf


def _energy(d: dict) -> EnergyState:
    names = {f.name for f in fields(EnergyState)}
    if not isinstance(d, dict) or not {"forecast_wh", "seen"} <= d.keys() or d.keys() - names:
        raise ValueError("energy: wrong keys")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    s = EnergyState(**kw)
    if len(s.forecast_wh) != len(s.seen) or not all(
            isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in s.forecast_wh):
        raise ValueError("energy: forecast is not a list of finite non-negative numbers")
    return s
