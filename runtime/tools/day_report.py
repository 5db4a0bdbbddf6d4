"""`edgerun report`: a picture of one device's day, as PNG and HTML.

The timeline comes from the coordinator (`GET /api/v1/devices/{id}/health`, the health it
stored) or, for a device that is offline or has no coordinator, from the device's own state
directory (`health-history.jsonl`, see runtime/wire/health_history.py, and `control.json`). Six
panels share a wall-clock time axis: die temperature with the trip points and the throttled
spans shaded, the rung, the inference rate, p95 latency against its target, power with the
energy used since the start of the window, and the battery. A gap of more than three typical
health intervals (the device was off or unreachable) breaks the lines instead of joining
across it. A sleeping node (`[sleep]`) is drawn asleep from each health that announced a
sleep (`sleep.next_wake`, kept as `asleep_s`) to its wake: shaded, no energy counted (the
suspended draw is not in the health), not a gap. The HTML page embeds the PNG (base64) and a
table per hour, with the results made (the pipeline's running count) and the minutes asleep.

matplotlib is an optional extra (`pip install 'edgerun[report]'`); without it the command
says so and exits 2. It is imported only here, never by the daemon.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.wire import health_history

PANELS = ("temperature", "rung", "rate", "latency", "power", "battery")
WIDTH_PX, HEIGHT_PX, DPI = 1400, 1600, 100


class MissingExtra(RuntimeError):
    """matplotlib is not installed."""


@dataclass
class Timeline:
    """What a report draws: health records (health_history.record), oldest first."""

    device: str
    source: str  # where the records came from, for the caption
    records: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)  # {"t", "type", "severity"}
    notes: dict[str, str] = field(default_factory=dict)  # extra facts for the HTML table
    simulated: bool = False  # `t` is a simulated device's clock (drawn as UTC, labelled so)


def _device_clock(tl: Timeline) -> Timeline:
    """A simulated device (every record has `sim_t`) is drawn on its own clock, a day that
    runs many times faster than the wall's: records are re-timed to the simulated time of
    day on the date of the first record, and the caption says so."""
    if not tl.records or any(r.get("sim_t") is None for r in tl.records):
        return tl
    sims = [r["sim_t"] for r in sorted(tl.records, key=lambda r: r["t"])]
    if any(b < a for a, b in itertools.pairwise(sims)):
        return tl  # the simulator restarted (a new run): only the wall clock is monotonic
    day = dt.datetime.fromtimestamp(tl.records[0]["t"], dt.UTC).replace(
        hour=0, minute=0, second=0, microsecond=0).timestamp()
    import numpy as np

    tl.records = sorted(({**r, "wall_t": r["t"], "t": day + r["sim_t"]} for r in tl.records),
                        key=lambda r: r["wall_t"])
    walls = [r["wall_t"] for r in tl.records]
    sims = [r["t"] for r in tl.records]
    tl.events = [{**e, "t": float(np.interp(e["t"], walls, sims))} for e in tl.events]
    # a sleep's length on the device's clock (the record keeps both: the wall's at the
    # simulator's speed); without it, at the run's own pace. Interpolating the wake between
    # the records around the sleep took the pace of the awake phase after it, slower on a
    # loaded host: ~5 % of the time asleep was counted awake.
    pace = (sims[-1] - sims[0]) / (walls[-1] - walls[0]) if walls[-1] > walls[0] else 1.0
    for r in tl.records:
        if r.get("asleep_s"):
            r["asleep_s"] = r.get("asleep_sim_s") or r["asleep_s"] * pace
    tl.notes["clock"] = "simulated device clock (the simulator runs faster than the wall)"
    tl.simulated = True
    return tl


def from_state_dir(state_dir: Path, device: str, since: float, until: float) -> Timeline:
    """The device's own history (health-history.jsonl) and control state."""
    state_dir = Path(state_dir).expanduser()
    records = health_history.read(state_dir, since, until)
    notes = {}
    control = state_dir / "control.json"
    try:
        doc = json.loads(control.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("operator_rate_hz"), int | float):
            notes["operator rate cap"] = f"{doc['operator_rate_hz']:g} Hz"
    except (OSError, ValueError):
        pass
    return _device_clock(Timeline(device, f"state directory {state_dir}", records,
                                  notes=notes))


def from_api(api: str, token: str, device: str, since: float, until: float,
             limit: int = 5000) -> Timeline:
    """The health the coordinator stored for `device`, and its recent warning/critical
    events (runtime.coordinator.api_client.ApiError when the coordinator refuses or is
    unreachable)."""
    from urllib.parse import quote

    from runtime.coordinator.api_client import call

    path = f"/api/v1/devices/{quote(device, safe='')}"
    view = call(api, path, token=token)
    got = call(api, f"{path}/health?since={int(since)}&until={math.ceil(until)}"
                f"&limit={limit}", token=token)
    records = health_history._records(json.dumps(r) for r in got.get("health", []))
    events = [e for e in view.get("events", []) if isinstance(e, dict)
              and isinstance(e.get("t"), int | float) and since <= e["t"] <= until
              and e.get("severity") in ("warning", "critical")]
    return _device_clock(Timeline(device, f"coordinator {api}", records, events))


def _series(records: Sequence[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    return [r[key] * scale if r.get(key) is not None else math.nan for r in records]


def _announced(r: dict[str, Any]) -> bool:
    """`r` is the last health before a sleep (it says when the node wakes)."""
    return bool(r.get("asleep_s"))


def typical_step(records: Sequence[dict[str, Any]]) -> float:
    """The time between consecutive records (s) that three quarters of the steps do not
    exceed (the upper quartile, a step that was taken; 0 for fewer than two records). The
    steps across an announced sleep are left out: a sleeping node's rhythm (a few records a
    wake, then minutes asleep) must not make its sleeps the typical step, which joined its
    wakes with a line and hid its outages (all steps when every one spans a sleep). Not the
    median: records that arrive unevenly (two close together, then a pause: a coordinator
    that stored every other health of a fast simulated node) made each pause a gap. The
    steps into an announcing record say only that the interval is at least that long: it
    comes when the wake's work is done, not at the health's interval. So where there are
    steps between two records that announce nothing, the typical step is at least theirs:
    a node awake for less than an interval each wake had its short wakes as the typical
    step and the steps of its one long wake as gaps, that wake's energy left out (a
    simulated node on a loaded host: 76 s steps, its health interval there, beside wakes
    of 20 s). Steps of 0 s (two records at the same time) say nothing of the interval."""
    pairs = [(a, b) for a, b in itertools.pairwise(records) if b["t"] > a["t"]]

    def upper_quartile(steps: list[float]) -> float:
        steps = sorted(steps)
        return steps[int(0.75 * (len(steps) - 1))] if steps else 0.0

    steps = ([b["t"] - a["t"] for a, b in pairs if not _announced(a)]
             or [b["t"] - a["t"] for a, b in pairs])
    between = [b["t"] - a["t"] for a, b in pairs if not _announced(a) and not _announced(b)]
    return max(upper_quartile(steps), upper_quartile(between))


def pieces(prev: dict[str, Any], r: dict[str, Any], typical: float
           ) -> list[tuple[float, float, str, float]]:
    """How the time between two consecutive records reads, as (start, end, kind, Wh):
    "asleep" from a record that announced a sleep (`asleep_s`) to the wake it announced
    (or the next record, if that came first): nothing is reported, by design, and the draw
    while suspended is not in the health, so no energy is counted; "awake" (power
    integrated, trapezoids; after a wake at the draw the next record reports); "gap": more
    than 3 `typical` steps with nothing said (off, cut off, or a wake that did not come),
    nothing known, nothing counted."""
    t0, t1 = prev["t"], r["t"]
    out: list[tuple[float, float, str, float]] = []
    p0, p1 = prev.get("power_w"), r.get("power_w")
    if _announced(prev):
        wake = min(t0 + prev["asleep_s"], t1)
        out.append((t0, wake, "asleep", 0.0))
        t0, p0 = wake, p1
    if t1 > t0 or not out:
        if t1 - t0 > 3 * typical:
            out.append((t0, t1, "gap", 0.0))
        else:
            wh = (p0 + p1) / 2 * (t1 - t0) / 3600 if p0 is not None and p1 is not None else 0.0
            out.append((t0, t1, "awake", wh))
    return out


def sleeps(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) of every announced sleep: to the next record or the wake announced, the
    earlier (the last record's: its announced wake, which may lie past the window)."""
    out = [(a, b) for prev, r in itertools.pairwise(records)
           for a, b, kind, _ in pieces(prev, r, math.inf) if kind == "asleep"]
    if records and _announced(records[-1]):
        out.append((records[-1]["t"], records[-1]["t"] + records[-1]["asleep_s"]))
    return out


def _break_gaps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert an empty record inside every gap longer than 3 typical intervals and at the
    start of every sleep, so lines stop where the device was silent instead of drawing a
    slope across hours (and a step, the rung's, ends where the sleep begins)."""
    if len(records) < 3 and not any(_announced(r) for r in records):
        return records
    typical = typical_step(records) or 1.0
    out = [records[0]]
    for prev, r in itertools.pairwise(records):
        silent = [(a if kind == "asleep" else (a + b) / 2)
                  for a, b, kind, _ in pieces(prev, r, typical) if kind != "awake"]
        if silent:
            out.append({"t": silent[0]})
        out.append(r)
    return out


def energy_wh(records: Sequence[dict[str, Any]]) -> list[float]:
    """Energy used since the first record (Wh), at each record: power integrated over the
    time the device was awake and reporting (`pieces`), not across gaps (nothing is known
    there) nor sleeps (the suspended draw is not in the health)."""
    out, total = [], 0.0
    typical = typical_step(records)
    for i, r in enumerate(records):
        if i:
            total += sum(wh for *_, wh in pieces(records[i - 1], r, typical))
        out.append(total)
    return out


def _times(records: Sequence[dict[str, Any]], utc: bool | None) -> list[dt.datetime]:
    tz = None if utc is False else dt.UTC
    return [dt.datetime.fromtimestamp(r["t"], tz).replace(tzinfo=None) for r in records]


def _tz_name(t: float, utc: bool | None) -> str:
    if utc is None:
        return "simulated device clock"
    return "UTC" if utc else (dt.datetime.fromtimestamp(t).astimezone().tzname() or "local")


def render_png(tl: Timeline, utc: bool = False, width_px: int = WIDTH_PX,
               height_px: int = HEIGHT_PX, dpi: int = DPI) -> bytes:
    """The six panels as PNG bytes (`width_px` x `height_px`). Raises MissingExtra without
    matplotlib and ValueError when there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a device or in CI
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingExtra("`edgerun report` draws with matplotlib, which is not installed: "
                           "pip install 'edgerun[report]' (or pip install matplotlib)") from e
    if not tl.records:
        raise ValueError(f"no health records for {tl.device} in that window ({tl.source})")
    recs = _break_gaps(tl.records)
    utc = None if tl.simulated else utc  # None: UTC times labelled as the simulated clock
    x = _times(recs, utc)
    fig, axes = plt.subplots(len(PANELS), 1, sharex=True, figsize=(width_px / dpi,
                                                                   height_px / dpi), dpi=dpi)
    ax = dict(zip(PANELS, axes, strict=True))
    t0, t1 = tl.records[0]["t"], tl.records[-1]["t"]
    fig.suptitle(f"edgerun {tl.device}: {_fmt_time(t0, utc)} to {_fmt_time(t1, utc)} "
                 f"({_tz_name(t0, utc)}){_asleep_at_end(tl, utc, '; ')}, from the {tl.source}",
                 fontsize=11)
    # a sleeping node's sleeps shaded in every panel (not a gap: it said it would sleep);
    # its awake stretches can be a record or two, drawn as dots
    slept = [(mdates.date2num(_times([{"t": a}], utc)[0]), (b - a) / 86400)
             for a, b in sleeps(tl.records)]
    for a in axes:
        if slept:
            a.broken_barh(slept, (0, 1), transform=a.get_xaxis_transform(), color="tab:blue",
                          alpha=0.08, lw=0, label="asleep" if a is axes[0] else None)
    dots: dict[str, Any] = {"marker": ".", "ms": 3} if slept else {}

    a = ax["temperature"]
    a.plot(x, _series(recs, "temp_c"), color="tab:red", lw=1.2, **dots, label="die temperature")
    trips: dict[str, float] = {}
    for r in tl.records:
        trips.update(r.get("trips") or {})
    for (name, temp), style in zip(sorted(trips.items(), key=lambda kv: kv[1]),
                                   ("--", "-.", ":", (0, (5, 1))), strict=False):
        a.axhline(temp, color="black", ls=style, lw=0.9, label=f"{name} trip {temp:g} °C")
    hot = [bool(r.get("throttled")) for r in recs]
    if any(hot):
        a.fill_between(x, 0, 1, where=hot, transform=a.get_xaxis_transform(), color="tab:red",
                       alpha=0.12, step="mid", label="throttled")
    for e in tl.events:
        a.axvline(_times([e], utc)[0], color="tab:purple" if e.get("severity") == "critical"
                  else "tab:orange", lw=0.8, alpha=0.7)
    a.set_ylabel("temperature (°C)")
    a.legend(loc="upper left", fontsize=8, ncol=4)

    a = ax["rung"]
    a.step(x, _series(recs, "rung"), where="post", color="tab:blue", lw=1.2, **dots)
    rungs = max((r["rungs"] for r in tl.records if r.get("rungs")), default=None)
    if rungs:
        a.set_ylim(0.5, rungs + 0.5)
        a.set_yticks(range(1, int(rungs) + 1))
    a.set_ylabel("rung (1 = cheapest)")

    a = ax["rate"]
    a.plot(x, _series(recs, "rate_hz"), color="tab:green", lw=1.0, **dots)
    a.set_ylabel("rate (inferences/s)")

    a = ax["latency"]
    a.plot(x, _series(recs, "p95_ms"), color="tab:brown", lw=1.0, **dots, label="p95")
    a.plot(x, _series(recs, "target_ms"), color="black", ls="--", lw=0.9, label="target")
    a.set_ylabel("latency (ms)")
    a.legend(loc="upper left", fontsize=8)

    a = ax["power"]
    a.plot(x, _series(recs, "power_w"), color="tab:olive", lw=1.0, **dots, label="power")
    a.set_ylabel("power (W)")
    e = a.twinx()
    e.plot(_times(tl.records, utc), energy_wh(tl.records), color="tab:gray", lw=1.2,
           label="energy since start" + (" (awake; not while asleep)" if slept else ""))
    e.set_ylabel("energy (Wh)")
    a.legend(loc="upper left", fontsize=8)
    e.legend(loc="upper right", fontsize=8)

    a = ax["battery"]
    battery = _series(recs, "battery_frac", 100.0)
    if any(not math.isnan(b) for b in battery):
        a.plot(x, battery, color="tab:cyan", lw=1.2, **dots)
        a.set_ylim(0, 100)
    else:
        a.text(0.5, 0.5, "no battery on this device", transform=a.transAxes, ha="center",
               va="center", color="gray")
    a.set_ylabel("battery (%)")
    a.set_xlabel(f"time ({_tz_name(t0, utc)})")
    a.xaxis.set_major_formatter(mdates.DateFormatter(axis_format(t1 - t0)))
    for a in axes:
        a.grid(True, alpha=0.3)
    fig.align_ylabels(axes)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def axis_format(span_s: float) -> str:
    """The time axis's labels for a window of `span_s` seconds: seconds under half an hour
    (a 2-minute window read "06:00 06:00 06:00"), the date past a day and a half."""
    if span_s <= 1800:
        return "%H:%M:%S"
    return "%H:%M" if span_s <= 36 * 3600 else "%m-%d %H:%M"


def _fmt_time(t: float, utc: bool | None) -> str:
    return _times([{"t": t}], utc)[0].strftime("%Y-%m-%d %H:%M")


def _asleep_at_end(tl: Timeline, utc: bool | None, before: str = "") -> str:
    """"asleep until HH:MM" when the last record announced a sleep (the node did not stop:
    it said when it wakes), else ""."""
    last = tl.records[-1] if tl.records else {}
    if not _announced(last):
        return ""
    wake = _times([{"t": last["t"] + last["asleep_s"]}], utc)[0]
    return f"{before}asleep until {wake.strftime('%H:%M')}"


def sleep_facts(tl: Timeline, utc: bool | None) -> dict[str, str]:
    """What the HTML page says of a sleeping node's window (nothing for one that never
    announced a sleep): time asleep, results made, how it ended."""
    spans = [(a, min(b, tl.records[-1]["t"])) for a, b in sleeps(tl.records)]
    if not spans:
        return {}
    made = [m for m in results_made(tl.records) if m is not None]
    out = {"asleep": f"{sum(b - a for a, b in spans) / 3600:.2f} h in {len(spans)} sleeps "
                     "(the draw while suspended is not in the health: not in the energy)"}
    if made:
        out["results"] = f"{sum(made):.0f}"
    if end := _asleep_at_end(tl, utc):
        out["at the end"] = end
    return out


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _hours(start: float, end: float, utc: bool | None) -> list[tuple[dt.datetime, float]]:
    """The clock hours [start, end) overlaps, each with the seconds of it inside."""
    out = []
    while end > start:
        when = _times([{"t": start}], utc)[0]
        hour = when.replace(minute=0, second=0, microsecond=0)
        step = min(end - start, 3600 - (when - hour).total_seconds())
        out.append((hour, step))
        start += step
    return out


def results_made(records: Sequence[dict[str, Any]]) -> list[float | None]:
    """At each record, the results the pipeline made since the one before, from its running
    count (`results`): all of it after a count that fell (a restart) or none (the pipeline
    had not started, or a history written before the count was kept: the daemon restarted
    since); None where the record has no count."""
    out: list[float | None] = [None] * min(1, len(records))
    for prev, r in itertools.pairwise(records):
        a, b = prev.get("results"), r.get("results")
        out.append(None if b is None else b - a if a is not None and b >= a else b)
    return out


def hourly(tl: Timeline, utc: bool = False) -> list[dict[str, Any]]:
    """One row per clock hour: temperature mean/max, minutes throttled, mean rung, rate and
    p95 (while awake), results made, minutes asleep, energy (Wh) and the battery at the end
    of the hour. An hour the node slept through has a row too."""
    utc = None if tl.simulated else utc
    wh = energy_wh(tl.records)
    made = results_made(tl.records)
    rows: dict[dt.datetime, dict[str, Any]] = {}

    def row_of(hour: dt.datetime) -> dict[str, Any]:
        return rows.setdefault(hour, {"hour": hour, "recs": [], "wh": 0.0, "results": None,
                                      "asleep_s": 0.0})

    times = _times(tl.records, utc)
    for i, (r, when) in enumerate(zip(tl.records, times, strict=True)):
        row = row_of(when.replace(minute=0, second=0, microsecond=0))
        row["recs"].append(r)
        row["wh"] += wh[i] - wh[i - 1] if i else 0.0  # the interval ending here
        if made[i] is not None:
            row["results"] = (row["results"] or 0) + made[i]
    counted = any(m is not None for m in made)
    for start, end in sleeps(tl.records):
        for hour, secs in _hours(start, min(end, tl.records[-1]["t"]), utc):
            row_of(hour)["asleep_s"] += secs
    out = []
    step = typical_step(tl.records)
    for hour, row in sorted(rows.items()):
        recs = row["recs"]
        temps = [r["temp_c"] for r in recs if r.get("temp_c") is not None]
        bat = [r["battery_frac"] for r in recs if r.get("battery_frac") is not None]
        out.append({"hour": hour.strftime("%Y-%m-%d %H:00"),
                    "temp_mean_c": _mean(temps), "temp_max_c": max(temps, default=None),
                    "throttled_min": sum(1 for r in recs if r.get("throttled")) * step / 60,
                    "rung_mean": _mean([r.get("rung") for r in recs]),
                    "rate_hz": _mean([r.get("rate_hz") for r in recs]),
                    "p95_ms": _mean([r.get("p95_ms") for r in recs]),
                    "results": (row["results"] or 0) if counted else None,
                    "asleep_min": row["asleep_s"] / 60,
                    "energy_wh": row["wh"],
                    "battery_pct": bat[-1] * 100 if bat else None})
    return out


_COLUMNS = (("hour", "hour", ""), ("temp_mean_c", "temp mean (°C)", ".1f"),
            ("temp_max_c", "temp max (°C)", ".1f"), ("throttled_min", "throttled (min)", ".1f"),
            ("rung_mean", "rung mean", ".2f"), ("rate_hz", "rate (/s)", ".2f"),
            ("p95_ms", "p95 (ms)", ".2f"), ("results", "results", ".0f"),
            ("asleep_min", "asleep (min)", ".1f"), ("energy_wh", "energy (Wh)", ".3f"),
            ("battery_pct", "battery end (%)", ".0f"))


def render_html(tl: Timeline, png: bytes, utc: bool = False) -> str:
    """A self-contained page: the PNG (base64) and the hourly table, every value escaped."""
    def cell(v: Any, fmt: str) -> str:
        if v is None:
            return "–"
        return html.escape(format(v, fmt) if fmt else str(v))

    utc = None if tl.simulated else utc
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in _COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{cell(row[k], f)}</td>" for k, _, f in _COLUMNS)
                   + "</tr>" for row in hourly(tl, utc))
    t0, t1 = tl.records[0]["t"], tl.records[-1]["t"]
    facts = {"device": tl.device, "source": tl.source,
             "window": f"{_fmt_time(t0, utc)} to {_fmt_time(t1, utc)} ({_tz_name(t0, utc)})",
             "health records": str(len(tl.records)),
             "energy": f"{energy_wh(tl.records)[-1]:.3f} Wh", **sleep_facts(tl, utc),
             **tl.notes}
    facts_html = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                         for k, v in facts.items())
    events = "".join(f"<li>{html.escape(_fmt_time(e['t'], utc))} "
                     f"{html.escape(str(e.get('severity', '')))}: "
                     f"{html.escape(str(e.get('type', '')))}</li>" for e in tl.events)
    title = html.escape(f"edgerun report: {tl.device}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1em 2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}img{{max-width:100%}}</style>
</head><body><h1>{title}</h1>
<table>{facts_html}</table>
<p><img alt="timeline of {html.escape(tl.device)}" src="data:image/png;base64,{
base64.b64encode(png).decode()}"></p>
{f"<h2>Warnings and critical events</h2><ul>{events}</ul>" if events else ""}
<h2>Per hour</h2>
<table><tr>{head}</tr>{body}</table>
</body></html>
"""


def parse_when(text: str, now: float) -> float:
    """`24h`, `90m`, `2d`, `600s` (that long before now), seconds since the epoch, or an
    ISO 8601 time (local time unless it names its zone)."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units and float(text[:-1]) >= 0:
            return now - float(text[:-1]) * units[text[-1]]
        if text.replace(".", "", 1).isdigit():
            return float(text)
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 24h, 90m, 2d, epoch seconds or "
                         "2026-05-01T08:00)") from None


def command(args: Any) -> int:
    """`edgerun report` (runtime/cli.py parses the arguments)."""
    import sys
    import time

    from runtime.coordinator import api_client as client

    now = time.time()
    try:
        since, until = parse_when(args.since, now), parse_when(args.until, now) if \
            args.until else now
    except ValueError as e:
        print(f"edgerun report: {e}", file=sys.stderr)
        return 2
    if args.local:
        from runtime import config as config_mod
        from runtime.telemetry.publisher import device_id

        cfg = config_mod.load(args.config) if args.config else config_mod.Config()
        state_dir = args.state_dir or Path(cfg.daemon.state_dir).expanduser()
        tl = from_state_dir(state_dir, args.device or device_id(cfg.telemetry), since, until)
    else:
        if not args.device:
            print("edgerun report: name the device (or --local for this box's own history)",
                  file=sys.stderr)
            return 2
        api, token_file = client.resolve(args)
        try:
            tl = from_api(api, client.read_token(token_file), args.device, since, until)
        except client.ApiError as e:
            print(f"edgerun report: {e}", file=sys.stderr)
            return 1
    try:
        png = render_png(tl, args.utc)
    except (MissingExtra, ValueError) as e:
        print(f"edgerun report: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or f"{tl.device}-report.png")
    out.write_bytes(png)
    print(f"wrote {out}: {tl.device}, {len(tl.records)} health records from the {tl.source}")
    if args.html:
        Path(args.html).write_text(render_html(tl, png, args.utc))
        print(f"wrote {args.html}")
    return 0
