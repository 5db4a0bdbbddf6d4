"""What the edge node reports, read from the daemon's health snapshot and its results: the
node's metrics, each source's (Device) metrics, and report by exception. Pure.

Names and datatypes are the tags an Ignition/SCADA tag browser shows (docs/sparkplug.md);
a birth carries every one, with its datatype, and data messages only those that changed
beyond their deadband.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config.sparkplug import SparkplugConfig
from runtime.telemetry.sparkplug.payload import (
    BOOLEAN,
    DATETIME,
    DOUBLE,
    INT32,
    STRING,
    UINT32,
    UINT64,
    Value,
)

# deadband kinds: "exact" (any change), "score", "temp" (absolute), "rel" (a fraction)
Getter = Callable[[dict[str, Any]], Any]


def _get(*path: str) -> Getter:
    def read(h: dict[str, Any]) -> Any:
        x: Any = h
        for key in path:
            x = x.get(key) if isinstance(x, dict) else None
        return x
    return read


def _meets(h: dict[str, Any]) -> bool | None:
    p95, target = _get("pipeline", "latency_ms", "p95")(h), _get("slo", "target_ms")(h)
    return None if p95 is None or target is None else p95 <= target


def _box_mj(h: dict[str, Any]) -> Any:
    box = _get("box_energy", "box_mj")(h)
    return box if box is not None else h.get("energy_mj")


# name -> (datatype, how it is read from health, deadband kind)
NODE_METRICS: dict[str, tuple[int, Getter, str]] = {
    "Inference/Model": (STRING, _get("model"), "exact"),
    "Inference/Variant": (STRING, _get("choice"), "exact"),
    "Inference/Rung": (INT32, _get("rung"), "exact"),
    "Inference/Rungs": (INT32, _get("rungs"), "exact"),
    "Thermal/Die Temperature C": (DOUBLE, _get("temp_c"), "temp"),
    "Thermal/Throttled": (BOOLEAN, _get("throttled"), "exact"),
    "Energy/Per Frame mJ": (DOUBLE, _box_mj, "rel"),
    "Energy/Power W": (DOUBLE, _get("power_w"), "rel"),
    "Latency/P95 ms": (DOUBLE, _get("pipeline", "latency_ms", "p95"), "rel"),
    "Latency/Target ms": (DOUBLE, _get("slo", "target_ms"), "exact"),
    "Latency/Meets Target": (BOOLEAN, _meets, "exact"),
    "Latency/Compliance": (DOUBLE, _get("slo", "compliance"), "rel"),
    "Results/Total": (UINT64, _get("pipeline", "results"), "exact"),
    "Results/Rate Hz": (DOUBLE, _get("pipeline", "rate_hz"), "rel"),
    "Backlog/Results Held": (UINT64, _get("backlog", "results_held"), "exact"),
    "Backlog/Evicted Total": (UINT64, _get("backlog", "evicted_total"), "exact"),
}

# a source's figures from health's pipeline.sources[name]
SOURCE_METRICS: dict[str, tuple[int, str, str]] = {
    "Source/State": (STRING, "state", "exact"),
    "Source/Rate Hz": (DOUBLE, "rate_hz", "rel"),
    "Source/E2E P95 ms": (DOUBLE, "e2e_p95_ms", "rel"),
}

# a source's last result and its counts (from the results themselves)
RESULT_METRICS: dict[str, tuple[int, str]] = {
    "Last Result/Verdict": (STRING, "exact"),
    "Last Result/Class": (STRING, "exact"),
    "Last Result/Score": (DOUBLE, "score"),
    "Last Result/Objects": (UINT32, "exact"),
    "Last Result/Seq": (UINT64, "exact"),
    "Last Result/Time": (DATETIME, "exact"),
    "Counts/Results": (UINT64, "exact"),
    "Counts/OK": (UINT64, "exact"),
    "Counts/Reject": (UINT64, "exact"),
}


def ms(t: float) -> int:
    """Seconds since the epoch -> Sparkplug's milliseconds."""
    return round(t * 1000)


def node_metrics(h: dict[str, Any], t_ms: int) -> dict[str, Value]:
    """The node's metrics from one health snapshot (a missing figure is null)."""
    return {name: Value(dt, _typed(dt, get(h)), t_ms) for name, (dt, get, _) in
            NODE_METRICS.items()}


def source_names(h: dict[str, Any]) -> list[str]:
    """The sources (Devices) a health snapshot names, in its order."""
    sources = _get("pipeline", "sources")(h)
    return list(sources) if isinstance(sources, dict) else []


def source_metrics(h: dict[str, Any], name: str, t_ms: int) -> dict[str, Value]:
    """One source's figures from a health snapshot."""
    s = _get("pipeline", "sources", name)(h) or {}
    return {m: Value(dt, _typed(dt, s.get(key)), t_ms) for m, (dt, key, _) in
            SOURCE_METRICS.items()}


@dataclass
class Tally:
    """A source's last result and its counts since this process started."""

    last: dict[str, Any] = field(default_factory=dict)  # the last result (label, score, ...)
    results: int = 0
    ok: int = 0

    def add(self, r: dict[str, Any], ok_labels: Sequence[str]) -> None:
        """Count one result (in seq order)."""
        self.last = r
        self.results += 1
        self.ok += r.get("label") in ok_labels

    def metrics(self, ok_labels: Sequence[str], historical: bool = False) -> dict[str, Value]:
        """The result metrics at the last result's own time (null before any result)."""
        r = self.last
        t_ms = ms(r["t"]) if isinstance(r.get("t"), int | float) else 0
        label = r.get("label")
        counts = r.get("counts")
        values = {
            "Last Result/Verdict": verdict_of(r, ok_labels),
            "Last Result/Class": label,
            "Last Result/Score": r.get("score"),
            "Last Result/Objects": sum(v for v in counts.values() if isinstance(v, int))
            if isinstance(counts, dict) else (0 if r else None),
            "Last Result/Seq": r.get("seq"),
            "Last Result/Time": t_ms if r else None,
            "Counts/Results": self.results,
            "Counts/OK": self.ok,
            "Counts/Reject": self.results - self.ok,
        }
        return {m: Value(dt, _typed(dt, values[m]), t_ms, historical) for m, (dt, _) in
                RESULT_METRICS.items()}


def verdict_of(r: dict[str, Any], ok_labels: Sequence[str]) -> str | None:
    """A result's verdict as Last Result/Verdict shows it: "ok", "reject", or None (no label)."""
    label = r.get("label")
    return None if label is None else ("ok" if label in ok_labels else "reject")


def publish_points(items: Sequence[tuple[str, str | None, bool]],
                   last_sent: dict[str, str | None],
                   every: Collection[str] = ()) -> list[int]:
    """Report by exception at a bounded rate: which of the results read in one pass
    (`items`: (source, verdict, historical), in seq order) a DDATA is made at; the ones
    between are coalesced into the next one's counters and last result.

    - every historical result (sent first-hand, with its own time: a replay loses nothing);
    - a live result whose verdict differs from its source's previous live one (the one
      before it in `items`, else `last_sent[source]`, the verdict the host last saw): every
      verdict change reaches the host, with the time of the result that made it;
    - each source's last live result: the host ends the pass with the latest counts;
    - every result of a source in `every` (PLC-triggered: each part's verdict is SCADA's to
      see, as it is the PLC's; at a line's rate nothing piles up).
    """
    prev = dict(last_sent)
    last_live: dict[str, int] = {}
    points = set()
    for i, (source, verdict, historical) in enumerate(items):
        if historical:
            points.add(i)
            continue
        if source in every or source not in prev or verdict != prev[source]:
            points.add(i)
        prev[source] = verdict
        last_live[source] = i
    points.update(last_live.values())
    return sorted(points)


def parse_result(text: str) -> dict[str, Any] | None:
    """A result row of the outbox (our own JSON), or None when it is not an object."""
    try:
        r = json.loads(text)
    except ValueError:
        return None
    return r if isinstance(r, dict) else None


def _typed(datatype: int, x: Any) -> Any:
    """`x` as the datatype wants it, or None when it is not one (a figure not measured)."""
    if x is None or isinstance(x, dict | list):
        return None
    if datatype == STRING:
        return str(x)[:4096]
    if datatype == BOOLEAN:
        return x if isinstance(x, bool) else None
    if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x):
        return None
    if datatype == DOUBLE:
        return float(x)
    if datatype in (UINT32, UINT64, DATETIME) and x < 0:
        return None
    return int(x)


def deadband_of(name: str) -> str:
    """The deadband kind of a metric (any of the tables; "exact" for others)."""
    if name in NODE_METRICS:
        return NODE_METRICS[name][2]
    if name in SOURCE_METRICS:
        return SOURCE_METRICS[name][2]
    return RESULT_METRICS.get(name, (0, "exact"))[1]


def changed(sent: dict[str, Value], new: dict[str, Value],
            cfg: SparkplugConfig) -> dict[str, Value]:
    """Report by exception: the metrics of `new` whose value moved past its deadband from
    the value last sent (a null that becomes a number, or back, is a change)."""
    out = {}
    for name, v in new.items():
        old = sent.get(name)
        if old is None or _moved(old.value, v.value, deadband_of(name), cfg):
            out[name] = v
    return out


def _moved(old: Any, new: Any, kind: str, cfg: SparkplugConfig) -> bool:
    if old is None or new is None or isinstance(new, str | bool) or kind == "exact":
        return old != new
    if kind == "score":
        return abs(new - old) > cfg.score_deadband
    if kind == "temp":
        return abs(new - old) > cfg.temp_deadband_c
    return abs(new - old) > cfg.relative_deadband * abs(old) or (old == 0) != (new == 0)
