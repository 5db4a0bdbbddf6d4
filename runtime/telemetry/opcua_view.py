"""What the OPC UA address space shows, as pure functions (runtime/telemetry/opcua_server.py
does the I/O): the variables of each source and of the device with their types, the one
node a client may write and its check, the verdict of a result, and the values read from
the health message that runtime/device/health.py builds (never from the daemon's parts).

Types are named by their OPC UA built-in type ("Boolean", "String", ...); the server maps
them to asyncua's VariantType. docs/plc.md lists the same tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Objects/edgerun/<source>/...: path -> OPC UA type (read-only for clients)
SOURCE_VARIABLES: dict[str, str] = {
    "LastResult.Verdict": "String",  # "OK" or "NOK" ([opcua] ok_labels)
    "LastResult.Ok": "Boolean",  # the same for ladder logic: true = the part passed
    "LastResult.Class": "String",  # the model's label
    "LastResult.Score": "Double",
    "LastResult.Time": "DateTime",  # the frame's time (a PLC edge's: when it arrived)
    "LastResult.FrameId": "String",  # written last: a new FrameId means a whole new result
    "LastResult.E2eMs": "Double",  # frame (edge) to stored verdict
    "Counts.Results": "UInt64",  # since the daemon started
    "Counts.Ok": "UInt64",
    "Counts.Nok": "UInt64",
    "Model": "String",
    "Variant": "String",
    "Rung": "Int32",  # 1 = the cheapest, Rungs = the selector's choice
    "Rungs": "Int32",
    "Health.State": "String",  # opening | running | failed | ended
    "Health.RateHz": "Double",
    "Health.E2eP95Ms": "Double",
}
# ... and on a PLC-triggered source (`trigger = "opcua"`)
TRIGGER_VARIABLES: dict[str, str] = {
    "PartPresent": "Boolean",  # writable: false -> true is one edge
    "Counts.Triggers": "UInt64",  # edges accepted (Trigger() calls and PartPresent edges)
    "Counts.TriggersRefused": "UInt64",  # refused: max_pending edges were waiting
    "Counts.Pending": "UInt32",  # edges waiting for their capture
}
# Objects/edgerun/...: the device as a whole
DEVICE_VARIABLES: dict[str, str] = {
    "Device.TempC": "Double",
    "Device.Throttled": "Boolean",
    "Device.GovernorLevel": "Int32",
    "Device.UptimeS": "Double",
    "Device.Sessions": "UInt32",  # OPC UA sessions open now
}


@dataclass(frozen=True)
class Writable:
    """A node clients may write: its type and, for numbers, its range."""

    type: str
    low: float | None = None
    high: float | None = None


# The only writable nodes, by path under a PLC-triggered source; every other node refuses.
WRITABLE: dict[str, Writable] = {"PartPresent": Writable("Boolean")}

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "Boolean": (bool,), "String": (str,), "Double": (float, int), "Int32": (int,),
    "UInt32": (int,), "UInt64": (int,)}


def check_write(path: str, type_name: str, value: Any) -> str | None:
    """Why a client's write of `value` (of OPC UA type `type_name`) to `path` is refused, as
    the status code's name; None when it is accepted. `path` is a source-relative path
    of a PLC-triggered source, or None-like ("") for any other node."""
    w = WRITABLE.get(path)
    if w is None:
        return "BadNotWritable"
    if type_name != w.type or not isinstance(value, _PY_TYPES[w.type]) or (
            w.type != "Boolean" and isinstance(value, bool)):
        return "BadTypeMismatch"
    if w.low is not None and not (isinstance(value, int | float) and w.low <= value):
        return "BadOutOfRange"
    if w.high is not None and not (isinstance(value, int | float) and value <= w.high):
        return "BadOutOfRange"
    return None


def rising(old: bool, new: bool) -> bool:
    """Whether PartPresent going from `old` to `new` is an edge (false -> true only)."""
    return new and not old


def verdict(label: str, ok_labels: Iterable[str]) -> tuple[str, bool]:
    """("OK", True) when `label` is a good part's, else ("NOK", False)."""
    ok = label in tuple(ok_labels)
    return ("OK" if ok else "NOK"), ok


def to_show(sources: list[str], triggered: Iterable[str]) -> list[bool]:
    """Which results of a backlog (their sources, oldest first) LastResult shows: every one
    of a PLC-triggered source (each part's verdict is the PLC's to read), only the newest of
    any other (a free-running camera's LastResult is its latest; its Counts count every
    result). A server that showed each of 1,000 results a second cost the frame path a
    third of its throughput (docs/benchmarks.md); at a line's rate nothing piles up."""
    trig = set(triggered)
    newest = {s: i for i, s in enumerate(sources)}
    return [s in trig or newest[s] == i for i, s in enumerate(sources)]


def _num(x: Any) -> float:
    """A health number as a Double (NaN for null: OPC UA has no null Double)."""
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else math.nan


def source_values(h: dict[str, Any], name: str) -> dict[str, Any]:
    """The health-fed variables of source `name` from one health message: its model and
    variant, the rung of the model it runs (health `models`, else the [model]'s), its state,
    rate and e2e p95. Missing parts (no such source yet) give empty strings and NaN."""
    src = (h.get("pipeline") or {}).get("sources", {}).get(name) or {}
    model = next((m for m in h.get("models") or [] if name in m.get("sources", ())), None)
    rung, rungs = (model["rung"], model["rungs"]) if model else (h.get("rung"), h.get("rungs"))
    return {"Model": str(src.get("model") or (model or {}).get("model") or h.get("model") or ""),
            "Variant": str(src.get("variant") or h.get("choice") or ""),
            "Rung": int(rung or 0), "Rungs": int(rungs or 0),
            "Health.State": str(src.get("state") or ""),
            "Health.RateHz": _num(src.get("rate_hz")),
            "Health.E2eP95Ms": _num(src.get("e2e_p95_ms"))}


def device_values(h: dict[str, Any], sessions: int) -> dict[str, Any]:
    """The device's variables from one health message (and the sessions open now)."""
    return {"Device.TempC": _num(h.get("temp_c")),
            "Device.Throttled": bool(h.get("throttled")),
            "Device.GovernorLevel": int((h.get("governor") or {}).get("level") or 0),
            "Device.UptimeS": _num(h.get("uptime_s")),
            "Device.Sessions": sessions}
