"""What `edgerun fleet ls` and `fleet show` print: a fleet table and a device summary that fit
the terminal (`--json` prints the API's JSON instead).

Every value comes from devices through the coordinator, so nothing is trusted to be of the
expected type or printable: a missing or wrong-typed field prints as "-", and control
characters (a terminal escape in a device's `choice`) are replaced before they reach the
operator's terminal.
"""

from __future__ import annotations

import re
import shutil
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Columns of `fleet ls`, left to right; the first ones stay when the terminal is narrow.
# (name, header, right-aligned)
_COLUMNS = (("device", "DEVICE", False), ("status", "STATUS", False), ("rung", "RUNG", True),
            ("acc", "ACC", True), ("rate", "RATE/s", True), ("temp", "TEMP/TRIP", True),
            ("alerts", "ALERTS", False), ("p95", "P95ms", True), ("batt", "BATT", True),
            ("backlog", "BACKLOG", True), ("results", "RESULTS", True), ("seen", "SEEN", True),
            ("choice", "CHOICE", False))
# Dropped first when the table is too wide (the rest shrink DEVICE and ALERTS, then clip).
_DROP_ORDER = ("choice", "seen", "results", "backlog", "batt", "p95")
_MIN_DEVICE, _MIN_ALERTS = 12, 10


def width_now() -> int:
    """The terminal's width ($COLUMNS when set, 80 when not a terminal)."""
    return shutil.get_terminal_size((80, 24)).columns


def clean(value: Any) -> str:
    """`value` as one printable line: control characters (escapes, newlines) become '?'."""
    return _CONTROL.sub("?", str(value))


def _num(value: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and missing fields are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    n = _num(value)
    return "-" if n is None else format(n, spec) + suffix


def _get(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]... or None where a level is missing or not an object."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def age(t: Any, now: float) -> str:
    """'4s', '3m', '2h', '5d' since `t` (epoch seconds); '-' when never."""
    n = _num(t)
    if not n:
        return "-"
    s = max(0.0, now - n)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def _alert_codes(alerts: Any) -> list[str]:
    if not isinstance(alerts, Sequence) or isinstance(alerts, str):
        return []
    return [clean(a[0]) for a in alerts
            if isinstance(a, Sequence) and not isinstance(a, str) and a]


def _status(view: Mapping[str, Any]) -> str:
    """`asleep (next wake HH:MM)` for a device that announced a sleep (docs/sleep.md)."""
    status, wake = view.get("status", "?"), view.get("wake_at")
    if status == "asleep" and isinstance(wake, int | float) and not isinstance(wake, bool) \
            and 0 < wake < 1e10:
        from runtime.coordinator.fleet import status_text

        return status_text(status, float(wake))
    return str(status)


def fleet_row(view: Mapping[str, Any], now: float) -> dict[str, str]:
    """One device's cells of the fleet table."""
    h = view.get("health")
    h = h if isinstance(h, Mapping) else {}
    rung, rungs = _num(h.get("rung")), _num(h.get("rungs"))
    temp, trip = _num(h.get("temp_c")), _num(h.get("passive_trip_c"))
    batt = _num(h.get("battery_frac"))
    return {
        "device": clean(view.get("device", "?")),
        "status": clean(_status(view)),
        "rung": f"{rung:.0f}/{rungs:.0f}" if rung is not None and rungs else "-",
        "acc": _fmt(h.get("accuracy"), ".3f"),
        "rate": _fmt(_get(h, "pipeline", "rate_hz"), ".1f"),
        "temp": ("-" if temp is None else f"{temp:.1f}") + ("/" + f"{trip:.0f}" if trip else ""),
        "alerts": ",".join(_alert_codes(view.get("alerts"))) or "-",
        "p95": _fmt(_get(h, "pipeline", "latency_ms", "p95"), ".1f"),
        "batt": "-" if batt is None else f"{batt * 100:.0f}%",
        "backlog": _fmt(_get(h, "backlog", "results_held"), ".0f"),
        "results": _fmt(view.get("results_stored"), ".0f"),
        "seen": age(view.get("last_seen"), now),
        "choice": clean(view.get("choice") or "-"),
    }


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "~"


def fleet_table(views: Sequence[Mapping[str, Any]], width: int | None = None,
                now: float | None = None) -> str:
    """The fleet as a table no wider than `width` (default: the terminal's): the least
    needed columns are dropped first, then DEVICE and ALERTS are shortened (marked '~')."""
    width = width or width_now()
    now = time.time() if now is None else now
    rows = [fleet_row(v, now) for v in views if isinstance(v, Mapping)]
    head = {name: title for name, title, _ in _COLUMNS}
    right = {name for name, _, r in _COLUMNS if r}
    cols = [name for name, _, _ in _COLUMNS]

    def widths() -> dict[str, int]:
        return {c: max(len(r[c]) for r in [head, *rows]) for c in cols}

    def total(w: Mapping[str, int]) -> int:
        return sum(w.values()) + 2 * (len(w) - 1)

    for c in _DROP_ORDER:
        if total(widths()) <= width:
            break
        cols.remove(c)
    w = widths()
    for c, floor in (("alerts", _MIN_ALERTS), ("device", _MIN_DEVICE)):
        over = total(w) - width
        if over > 0:
            w[c] = max(min(floor, w[c]), w[c] - over)
    lines = []
    for r in [head, *rows]:
        cells = [_clip(r[c], w[c]) for c in cols]
        cells = [v.rjust(w[c]) if c in right else v.ljust(w[c]) for c, v in zip(cols, cells,
                                                                                strict=True)]
        lines.append(_clip("  ".join(cells).rstrip(), width))
    if not rows:
        lines.append("(no devices yet: they appear with their first message)")
    return "\n".join(lines)


def _event_line(ev: Mapping[str, Any]) -> str:
    t = _num(ev.get("t"))
    when = time.strftime("%m-%d %H:%M:%S", time.gmtime(t)) if t else "--"
    rest = " ".join(f"{clean(k)}={clean(v)}" for k, v in ev.items()
                    if k not in ("v", "t", "type", "severity", "boot"))
    return f"{when} {clean(ev.get('severity', '')):<8} {clean(ev.get('type', '?'))} {rest}"


def device_summary(view: Mapping[str, Any], width: int | None = None, now: float | None = None,
                   events: int = 8) -> str:
    """One device for a person: status, model and rung, pipeline, thermal, power, backlog,
    alerts in full, the newest `events`; long lines wrapped to `width` (terminal's)."""
    width = max(40, width or width_now())
    now = time.time() if now is None else now
    h = view.get("health")
    h = h if isinstance(h, Mapping) else {}
    p = h.get("pipeline") if isinstance(h.get("pipeline"), Mapping) else {}
    gov = h.get("governor") if isinstance(h.get("governor"), Mapping) else {}
    out: list[str] = []

    def field(label: str, text: str) -> None:
        out.extend(textwrap.wrap(clean(text), width, initial_indent=f"{label:<9} ",
                                 subsequent_indent=" " * 10, break_on_hyphens=False) or
                   [label])

    row = fleet_row(view, now)
    up = _num(h.get("uptime_s"))
    out.extend(textwrap.wrap(
        f"{row['device']}: {row['status']}"
        + (f" ({clean(view['reason'])})" if view.get("reason") else "")
        + f"; last seen {row['seen']} ago; boot {clean(view.get('boot') or '-')}"
        + (f", up {age(now - up, now)}" if up is not None else ""),
        width, subsequent_indent=" " * 10, break_on_hyphens=False))
    field("model", f"{clean(view.get('model') or h.get('model') or '-')}; choice "
          f"{row['choice']}; rung {row['rung']}; accuracy {row['acc']}"
          + (f" ({clean(h['choice_reason'])})" if h.get("choice_reason") else ""))
    slo = h.get("slo") if isinstance(h.get("slo"), Mapping) else {}
    field("pipeline", f"{row['rate']} results/s (cap {_fmt(h.get('rate_cap_hz'), '.1f')}, "
          f"operator {_fmt(h.get('operator_rate_hz'), '.1f')}); latency p50 "
          f"{_fmt(_get(p, 'latency_ms', 'p50'), '.2f')} ms, p95 {row['p95']} ms (target "
          f"{_fmt(slo.get('target_ms'), '.0f')} ms, compliance "
          f"{_fmt(slo.get('compliance'), '.3f')})")
    field("thermal", f"{_fmt(h.get('temp_c'), '.1f', ' °C')} (trip "
          f"{_fmt(h.get('passive_trip_c'), '.0f', ' °C')}; throttled "
          f"{'yes' if h.get('throttled') is True else 'no'}); governor "
          f"{clean(gov.get('policy', '-'))} level {clean(gov.get('level', '-'))}"
          + (f": {clean(gov['reason'])}" if gov.get("reason") else ""))
    field("power", f"{_fmt(h.get('power_w'), '.2f', ' W')} (source "
          f"{clean(h.get('energy_source') or '-')}); energy a result "
          f"{_fmt(h.get('energy_mj'), '.2f', ' mJ')}; battery {row['batt']}")
    clk = h.get("clock") if isinstance(h.get("clock"), Mapping) else {}
    if clk and clk.get("state") != "synced":  # its times are claims (docs/clocks.md)
        field("clock", f"{clean(clk.get('state'))}: {clean(clk.get('reason') or '-')}; "
              f"steps {_fmt(clk.get('jumps_total'), '.0f')}, implausible readings "
              f"{_fmt(clk.get('implausible_total'), '.0f')} (its times are placed once it "
              "is synced)")
    box = h.get("box_energy") if isinstance(h.get("box_energy"), Mapping) else {}
    if box:  # the box's energy a frame beside the model's share (power/box_energy.py)
        field("energy", f"a frame: box {_fmt(box.get('box_mj'), '.2f', ' mJ')}, model "
              f"{_fmt(box.get('model_mj'), '.3f', ' mJ')}, idle share "
              f"{_fmt(box.get('idle_mj'), '.2f', ' mJ')} (source "
              f"{clean(box.get('source') or '-')})"
              + (f": {clean(box['reason'])}" if box.get("reason") else ""))
    backlog = h.get("backlog") if isinstance(h.get("backlog"), Mapping) else {}
    mqtt = h.get("mqtt") if isinstance(h.get("mqtt"), Mapping) else {}
    field("backlog", f"{row['backlog']} results held "
          f"({_fmt(backlog.get('bytes'), '.0f')} bytes), "
          f"{_fmt(backlog.get('evicted_total'), '.0f')} evicted; MQTT "
          f"{'connected' if mqtt.get('connected') is True else 'not connected'}, resends "
          f"{_fmt(mqtt.get('resends'), '.0f')}")
    field("stored", f"{row['results']} results at the coordinator, "
          f"{_fmt(view.get('quarantined'), '.0f')} quarantined")
    alerts = view.get("alerts") if isinstance(view.get("alerts"), Sequence) else []
    shown = [a for a in alerts if isinstance(a, Sequence) and not isinstance(a, str)
             and len(a) >= 2]
    if not shown:
        field("alerts", "none")
    for i, (code, message, *_) in enumerate(shown):
        field("alerts" if i == 0 else "", f"{clean(code)}: {clean(message)}")
    evs = [e for e in view.get("events") or () if isinstance(e, Mapping)]
    if evs:
        out.append(f"events    newest first, {min(events, len(evs))} of {len(evs)} "
                   "(--json for all):")
        out.extend(_clip("  " + _event_line(e), width) for e in evs[:events])
    versions = view.get("versions")
    if isinstance(versions, Mapping) and versions:
        field("versions", ", ".join(f"{clean(k)} {clean(v)}" for k, v in versions.items()))
    return "\n".join(out)

