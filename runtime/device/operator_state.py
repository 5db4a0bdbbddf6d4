"""What operators set and what the control loop learned, kept in the state directory across
restarts and reloads: one home, one writer (`OperatorState`).

Two small JSON files, formats unchanged from the two modules this one replaces
(`operator_settings.py`, `control_store.py`), so a device's existing files still load:

- `settings.json`: `set_latency_target` and `set_accuracy_floor` override the config file's
  `[constraints]` until the operator sends another value (`{"latency_ms": 25.0, ...}`; the
  saved `latency_ms` is the target in force: `end_to_end_ms` where the config sets one).
- `control.json`: the harvest forecast a solar node learns over days (a restart must not throw
  it away) and the operator's `set_rate` cap (it must not silently lapse):
  `{"v": 1, "operator_rate_hz": 2.0 | null, "energy": {...} | null}`.

Both are written atomically (runtime.durable: temp file, fsync, rename, fsync dir); an
unreadable file is moved aside (`.bad`) with a warning, and the config's values (or a fresh
start) apply.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from power.energy import EnergyState
from runtime.config.constraints import RULES
from runtime.durable import write_atomic

log = logging.getLogger("edgerun.operator_state")

SETTINGS_FILE = "settings.json"
CONTROL_FILE = "control.json"
CONTROL_VERSION = 1
# command -> (constraints field, command argument)
COMMANDS = {"set_latency_target": ("latency_ms", "ms"),
            "set_accuracy_floor": ("accuracy_floor", "value")}


class OperatorState:
    """The operator's overrides and the control loop's learnt state of one daemon; the only
    writer of `settings.json` and `control.json` (main thread)."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.settings: dict[str, float] = {}  # constraints field -> value
        self.rate_hz = math.inf  # `set_rate`; inf: no operator cap
        self._saved_slot: int | None = None  # the energy state's slot last saved

    @property
    def control_file(self) -> Path:
        """Where the harvest forecast and the rate cap are kept."""
        return self.dir / CONTROL_FILE

    @property
    def settings_file(self) -> Path:
        """Where the constraint overrides are kept."""
        return self.dir / SETTINGS_FILE

    def load(self) -> EnergyState | None:
        """Read both files (start-up), saying what they restore; the learnt energy state,
        None when there is none."""
        self.settings = load_settings(self.dir)
        if self.settings:
            log.info("operator settings from %s override [constraints]: %s",
                     self.settings_file, self.settings)
        energy, rate = load_control(self.control_file)
        self.rate_hz = rate
        if energy is not None or math.isfinite(rate):
            log.info("control state restored from %s (harvest forecast %s, operator rate cap "
                     "%s)", self.control_file, "kept" if energy else "none",
                     f"{rate:g} Hz" if math.isfinite(rate) else "none")
        return energy

    def restore(self, cfg: Any) -> tuple[Any, EnergyState | None]:
        """Read both files (start-up): `cfg` (runtime.config.Config) with the overrides on its
        [constraints], and the learnt energy state (None: none)."""
        energy = self.load()
        if self.settings:
            cfg = replace(cfg, constraints=self.constraints(cfg.constraints))
        return cfg, energy

    def constraints(self, constraints: Any) -> Any:
        """`constraints` (runtime.config.Constraints) with the overrides applied."""
        return apply(constraints, self.settings)

    def record(self, command: str, args: dict[str, Any]) -> None:
        """Keep an applied settings command (one of COMMANDS; others are ignored)."""
        if command in COMMANDS:
            self.settings = record(self.settings, command, args)
            save_settings(self.dir, self.settings)

    def set_rate(self, fps: float, energy: EnergyState | None) -> None:
        """`set_rate`: the operator's cap (0 = none), kept with the energy state."""
        self.rate_hz = fps or math.inf
        self.save_control(energy)

    def keep_energy(self, energy: EnergyState | None) -> None:
        """Save the harvest forecast when an hour slot closed (every control tick)."""
        slot = energy.slot_index if energy is not None else None
        if slot != self._saved_slot:
            self._saved_slot = slot
            self.save_control(energy)

    def save_control(self, energy: EnergyState | None) -> None:
        """Keep the energy state (an hour slot closed) with the operator's cap."""
        save_control(self.control_file, energy, self.rate_hz)


def _write(path: Path, text: str, failed: str) -> None:
    """Write atomically (runtime.durable); an error is logged with `failed` (what it means
    for the operator), never raised: the loop goes on."""
    try:
        write_atomic(path, text)
    except OSError as e:
        log.warning("cannot save %s (%s); %s", path, e, failed)


def _move_aside(path: Path) -> Path:
    bad = path.with_name(path.name + ".bad")
    with contextlib.suppress(OSError):
        os.replace(path, bad)
    return bad


# -- settings.json ----------------------------------------------------------------------------

def load_settings(state_dir: Path) -> dict[str, float]:
    """The saved overrides ({} when none); a broken file is moved aside (`.bad`)."""
    path = Path(state_dir) / SETTINGS_FILE
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or set(doc) - set(RULES):
            raise ValueError(f"unknown keys {sorted(set(doc) - set(RULES))}"
                             if isinstance(doc, dict) else "not an object")
        for k, v in doc.items():  # the config's rule for the field (one per field)
            if (problem := RULES[k](v)) is not None:
                raise ValueError(f"{k}: {problem}")
        return {k: float(v) for k, v in doc.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # deep nesting stopped every start
        log.warning("operator settings %s unreadable (%s); moved aside, the config's "
                    "constraints apply", path, e)
        _move_aside(path)
        return {}


def save_settings(state_dir: Path, settings: dict[str, float]) -> None:
    """Write the overrides atomically; errors are logged."""
    _write(Path(state_dir) / SETTINGS_FILE, json.dumps(settings),
           "the operator settings last until a restart")


def apply(constraints: Any, settings: dict[str, float]) -> Any:
    """`constraints` (runtime.config.Constraints) with the overrides applied. The saved
    `latency_ms` is the operator's latency target: it sets the target in force
    (`with_target`: `end_to_end_ms` when the config judges frames end to end), as the command
    did."""
    rest = {k: v for k, v in settings.items() if k != "latency_ms"}
    out = replace(constraints, **rest) if rest else constraints
    return out.with_target(settings["latency_ms"]) if "latency_ms" in settings else out


def record(settings: dict[str, float], command: str, args: dict[str, Any]) -> dict[str, float]:
    """The overrides after `command` (one of COMMANDS) was applied."""
    key, arg = COMMANDS[command]
    return {**settings, key: float(args[arg])}


# -- control.json -----------------------------------------------------------------------------

def save_control(path: Path, energy: EnergyState | None, operator_rate_hz: float) -> None:
    """Write the control state atomically; errors are logged, never raised."""
    doc: dict[str, Any] = {"v": CONTROL_VERSION, "operator_rate_hz": (
        None if math.isinf(operator_rate_hz) else operator_rate_hz),
        "energy": asdict(energy) if energy is not None else None}
    _write(path, json.dumps(doc), "the control state will be relearned after a restart")


def load_control(path: Path) -> tuple[EnergyState | None, float]:
    """(energy state or None, operator rate cap or inf). A missing file is a fresh start; a
    broken one is moved aside (`.bad`) and logged."""
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("v") != CONTROL_VERSION:
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
        bad = _move_aside(path)
        log.warning("control state %s is unreadable (%s); moved to %s, starting fresh", path,
                    e, bad)
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
