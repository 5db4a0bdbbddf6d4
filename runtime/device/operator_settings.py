"""Operator settings sent as commands, kept in the state directory across restarts and reloads.

`set_latency_target` and `set_accuracy_floor` override the config file's `[constraints]` until
the operator sends another value: one small JSON file (`settings.json`), written atomically;
an unreadable file is moved aside with a warning and the config's values apply. (`set_rate` is
kept by runtime/device/control_store.py with the harvest forecast.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from runtime.durable import write_atomic

log = logging.getLogger("edgerun.settings")

FILE = "settings.json"
# command -> (constraints field, command argument)
COMMANDS = {"set_latency_target": ("latency_ms", "ms"),
            "set_accuracy_floor": ("accuracy_floor", "value")}
_RANGES = {"latency_ms": (0.1, 60_000.0), "accuracy_floor": (0.0, 1.0)}


def load(state_dir: Path) -> dict[str, float]:
    """The saved overrides ({} when none); a broken file is moved aside (`.bad`)."""
    path = Path(state_dir) / FILE
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or set(doc) - set(_RANGES):
            raise ValueError(f"unknown keys {sorted(set(doc) - set(_RANGES))}"
                             if isinstance(doc, dict) else "not an object")
        for k, v in doc.items():
            lo, hi = _RANGES[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or not lo <= v <= hi:
                raise ValueError(f"{k} = {v!r} is outside {lo}..{hi}")
        return {k: float(v) for k, v in doc.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # deep nesting stopped every start
        log.warning("operator settings %s unreadable (%s); moved aside, the config's "
                    "constraints apply", path, e)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(FILE + ".bad"))
        return {}


def save(state_dir: Path, settings: dict[str, float]) -> None:
    """Write the overrides atomically (temp + fsync + rename); errors are logged."""
    path = Path(state_dir) / FILE
    try:
        write_atomic(path, json.dumps(settings))
    except OSError as e:
        log.warning("cannot save operator settings to %s (%s); they last until a restart",
                    path, e)


def apply(constraints: Any, settings: dict[str, float]) -> Any:
    """`constraints` (runtime.config.ConstraintsConfig) with the overrides applied."""
    return replace(constraints, **settings) if settings else constraints


def record(settings: dict[str, float], command: str, args: dict[str, Any]) -> dict[str, float]:
    """The overrides after `command` (one of COMMANDS) was applied."""
    key, arg = COMMANDS[command]
    return {**settings, key: float(args[arg])}
