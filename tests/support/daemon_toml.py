"""The daemon's TOML config, written once for the harness and the benches.

Every test or bench that starts `edgerun serve` shares a few sections (`base`: the engine
set, the state directory, the outbox) and layers its own over them (the harness: a short
profiler, a synthetic camera, a fast governor; a bench: what it measures). `daemon_toml`
merges the layers in turn and writes them: a section given as a dict updates the keys before
it (a key set to None is left out), one given as a str is that section's body as written, one
given as None is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Section = Mapping[str, Any] | str | None

# The order sections are written in (the configuration reference's); others follow, in the
# order the layers give them. A reader finds [device] first, as in every shipped example.
# [telemetry.outbox] stays last of these: a caller's `extra` that opens with bare keys
# (`retry_s = 0.2`, no header) continues it, so a section placed after it (as [storage]
# once was) took those keys and the daemon refused its config.
ORDER = ("device", "model", "models", "constraints", "profiler", "backends",
         "backends.onnxruntime", "source", "governor", "daemon", "storage", "telemetry",
         "telemetry.broker", "telemetry.outbox")


def base(state: Path) -> dict[str, Section]:
    """What every daemon the tests and benches start shares: ONNX Runtime alone, on one
    thread, without its spinning or default-session variants (a short, repeatable ladder),
    and its state (outbox included) under `state`."""
    return {
        "backends": {"enabled": ["onnxruntime"], "threads": [1]},
        "backends.onnxruntime": {"spinning": [False], "include_default": False},
        "daemon": {"state_dir": state},
        # health reaches the outbox's database (where tests read it) with the next one when
        # no broker takes it (the product waits a minute: docs/telemetry.md, "Disk writes")
        "telemetry.outbox": {"path": state / "outbox.db", "spill_after_s": 0.2},
    }


def value(v: Any) -> str:
    """One TOML value: a bool, a number, a string or path (quoted and escaped), or a list."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))  # a JSON string is a TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def coordinator_toml(creds: Any, **keys: Any) -> str:
    """A coordinator's config: `keys` in [coordinator] (one set to None is left out), logged
    in to the broker with `creds` (the broker fixture's `coordinator(fleet)`)."""
    return "\n".join(["[coordinator]",
                      *(f"{k} = {value(v)}" for k, v in keys.items() if v is not None),
                      "[coordinator.broker]", f"host = {value(creds.host)}",
                      f"port = {creds.port}", f"username = {value(creds.username)}",
                      f"password_file = {value(creds.password_file)}"]) + "\n"


def daemon_toml(state: Path, *layers: Mapping[str, Section], extra: str = "") -> str:
    """The config text: base(state) with each of `layers` merged over it in turn, sections in
    ORDER (then the others as they first appear); `extra` (raw TOML) appended last."""
    merged: dict[str, Section] = {}
    for name, sec in (item for layer in (base(state), *layers) for item in layer.items()):
        old = merged.get(name)
        merged[name] = ({**old, **sec} if isinstance(old, Mapping) and isinstance(sec, Mapping)
                        else sec)
    out = []
    rank = {name: i for i, name in enumerate(ORDER)}
    for name, sec in sorted(merged.items(), key=lambda kv: rank.get(kv[0], len(ORDER))):
        if sec is None:
            continue
        body = sec if isinstance(sec, str) else "\n".join(
            f"{k} = {value(v)}" for k, v in sec.items() if v is not None)
        out.append(f"[{name}]\n{body.strip()}\n")
    return "\n".join(out) + (f"\n{extra}\n" if extra else "")
