"""Fleet state: pure functions from (device view, message or clock) to a new view.

Status per device:
- `online`  its retained state says online and something arrived within `stale_after_s`;
- `stale`   online by its state, but silent for longer than `stale_after_s`;
- `offline` its state says offline (will message or clean stop), or silent past `offline_after_s`
  (a broker partition can hide the will).
- `asleep`  its last state announced a sleep until `wake_at` (docs/sleep.md): unreachable on
  purpose, no alert; past `wake_at + wake_margin_s` without a word it is `offline` with a
  `missed_wake` alert.
Alerts are derived from the latest health and the fleet's versions; each is a short code plus
a sentence for the operator (critical ones say so first: `governor_disabled`).

State timestamps are the device's clock, so the coordinator refuses states stamped further
ahead than its own clock plus a skew (service.py) before they reach `on_state`: a forged
`{online: true, t: 9e15}` would otherwise outrank every later will.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# every code `alerts` can raise: with the [coordinator] section, which checks webhook_alerts
from runtime.config.coordinator import ALERT_CODES as ALERT_CODES
from runtime.wire import clock as wire_clock
from runtime.wire import payloads


@dataclass(frozen=True)
class FleetConfig:
    """Thresholds of the state machine and the alerts."""

    stale_after_s: float = 30.0
    offline_after_s: float = 120.0
    backlog_alert: int = 1000  # held results on the device
    slo_alert: float = 0.95  # SLO compliance below this
    temp_margin_c: float = 5.0  # within this of the first passive trip
    wake_margin_s: float = 300.0  # a sleeper this late past its announced wake is offline


@dataclass(frozen=True)
class DeviceView:
    """What the coordinator knows of one device."""

    device: str
    online: bool = False  # per its last state message
    status: str = "offline"
    boot: str = ""
    last_seen: float = 0.0  # coordinator clock, last message of any kind
    state_t: float = 0.0
    reason: str = ""
    versions: Mapping[str, Any] = field(default_factory=dict)
    model: str = ""
    choice: str = ""
    health: Mapping[str, Any] = field(default_factory=dict)
    alerts: tuple[tuple[str, str], ...] = ()
    asleep: bool = False  # its last state announced a sleep
    wake_at: float = 0.0  # ... until then (this clock: fleet.announced_wake)
    # the last state's clock stamp (runtime/wire/clock.py): states of two boots are ordered
    # by it, not by a wall clock that may read a week behind or 2100
    state_clk: Mapping[str, Any] | None = None


def _with(view: DeviceView, changes: dict[str, Any]) -> DeviceView:
    """`dataclasses.replace(view, **changes)` without its per-field machinery (it was the
    largest single cost of ingest: 3-4 replaces a message, ~14 µs each). DeviceView has no
    __post_init__, slots or init-only fields, so copying its attributes is the same thing."""
    new = object.__new__(DeviceView)
    d = new.__dict__
    d.update(view.__dict__)
    d.update(changes)
    return new


def with_alerts(view: DeviceView, alerts: tuple[tuple[str, str], ...]) -> DeviceView:
    """The view carrying `alerts` (a merged view from the store keeps the alerts of the
    last refresh until the next one recomputes them)."""
    return _with(view, {"alerts": alerts})


# The furthest wake believed, from the coordinator's clock when the announcement arrived (the
# device's [sleep] max_sleep_s may not exceed it): a wake announced further ahead — a device
# clock gone wrong, a hostile state — is believed this far, so a device that never returns
# still turns offline with `missed_wake` instead of showing asleep until the year 2286.
LONGEST_SLEEP_S = payloads.LONGEST_SLEEP_S


def announced_wake(msg: Mapping[str, Any], now: float) -> float:
    """The coordinator-clock time a sleep announced in state `msg`, arriving at `now`, ends.

    A synced clock's `wake_at` is believed as it is. An unsynced one's (`clk.sync` false: a
    box that booted at 1970, or a week behind) is not comparable with this clock, but the
    sleep's length is: `wake_at - t` are two readings of one clock taken moments apart. So
    that length is counted from the arrival (a little late by the transit, which errs
    towards no alert). A state the coordinator placed (`clk.claimed`: its boot's offset is
    known) has its wake moved by the same offset. Without this a node booted at 1970 turned
    `offline` with `missed_wake` the moment each sleep began. At most LONGEST_SLEEP_S on."""
    wake = float(msg["wake_at"])
    clk = msg.get("clk")
    if isinstance(clk, Mapping) and clk.get("sync") is False:
        if isinstance(clk.get("claimed"), int | float):
            # placed at ingest (clock_place: its kernel boot's offset is known): `t` is the
            # placed time, the device's own in `claimed`; the wake moves with it
            wake += float(msg["t"]) - float(clk["claimed"])
        else:
            wake = now + max(0.0, wake - float(msg["t"]))
    return min(wake, now + LONGEST_SLEEP_S)


def on_state(view: DeviceView, msg: Mapping[str, Any], now: float) -> DeviceView:
    """A birth (online) or death (will / clean stop) message arrived."""
    if msg["boot"] != view.boot and wire_clock.made_after(
            view.state_t, view.state_clk, msg["t"], msg.get("clk")) is True:
        return view  # a previous boot's state arriving after the current one's
    if (not msg["online"] and not view.online and msg["boot"] == view.boot
            and msg["t"] < view.state_t):
        # A will (stamped at its connection's start) after this boot's farewell (clean stop
        # or sleep, stamped when said): the connection that said goodbye closed without its
        # DISCONNECT reaching the broker (lost on the wire, or the process ended first), so the
        # broker published the will. The goodbye is the truth; the will adds nothing.
        return view
    # Within one boot, arrival order is the truth: the will carries the connect time,
    # so it is older than the birth it follows.
    asleep = not msg["online"] and msg.get("asleep") is True and "wake_at" in msg
    changes = dict(online=msg["online"], boot=msg["boot"], state_t=msg["t"],
                   state_clk=msg.get("clk"),
                   reason=msg.get("reason", ""),
                   last_seen=now if msg["online"] else view.last_seen,
                   asleep=asleep,
                   wake_at=announced_wake(msg, now) if asleep else 0.0,
                   status="online" if msg["online"] else "asleep" if asleep else "offline")
    if msg["online"]:
        changes.update(versions=msg.get("versions", view.versions),
                       model=msg.get("model", view.model), choice=msg.get("choice", view.choice))
    return _with(view, changes)


def on_activity(view: DeviceView, now: float, health: Mapping[str, Any] | None = None
                ) -> DeviceView:
    """A result, event or health message arrived: the device is alive."""
    changes: dict[str, Any] = {"last_seen": max(view.last_seen, now), "status": "online"}
    if health is not None:
        choice = health.get("choice")
        changes["health"] = health
        changes["choice"] = choice if isinstance(choice, str) else view.choice
    if not view.online:
        # Traffic after a death message: the birth was lost or is still in flight (or, for a
        # sleeper, it woke and the traffic overtook its birth).
        changes["online"], changes["asleep"] = True, False
    return _with(view, changes)


def heard(view: DeviceView, received: float) -> DeviceView:
    """Messages of the device received at `received` wait to be stored (the coordinator's
    store is slow or stuck): it is not silent, so a device online by its state is seen then.
    Nothing else changes until they are stored (one of them may be its will)."""
    if not view.online or view.asleep or received <= view.last_seen:
        return view
    return _with(view, {"last_seen": received})


def not_ahead(view: DeviceView, wall: float, slack_s: float) -> DeviceView:
    """A view learned at `wall` whose `last_seen` is ahead of it by more than `slack_s`: this
    clock stepped back since it was stamped, or another coordinator's clock runs ahead.
    Either way the device was heard no later than now by this clock: seen at `wall` (else a
    step back of an hour kept a silent device online for that hour, and one still talking
    too: `on_activity` keeps the later time)."""
    if view.last_seen <= wall + slack_s:
        return view
    return _with(view, {"last_seen": wall})


def tick(view: DeviceView, now: float, cfg: FleetConfig) -> DeviceView:
    """Age the view: online -> stale -> offline as silence grows; asleep -> offline once
    the announced wake is `wake_margin_s` past."""
    if view.asleep:
        status = "offline" if now > view.wake_at + cfg.wake_margin_s else "asleep"
        return view if status == view.status else _with(view, {"status": status})
    if not view.online:
        return view if view.status == "offline" else _with(view, {"status": "offline"})
    silent = now - view.last_seen
    status = ("offline" if silent > cfg.offline_after_s
              else "stale" if silent > cfg.stale_after_s else "online")
    return view if status == view.status else _with(view, {"status": status})


def next_change(view: DeviceView, cfg: FleetConfig) -> float:
    """The time after which `tick` would give this view another status with no message
    arriving: for `t <= next_change`, tick(view, t) keeps view.status (for t not before the
    moment the view was made or ticked), and it changes just after. math.inf when only a
    message can change it (offline), -math.inf when the status is already not tick's
    (a view nobody ticked). A refresh ages only the devices whose time has come, so its cost
    follows the devices changing, not the fleet (service.py, ageing.py)."""
    if view.asleep:
        return (view.wake_at + cfg.wake_margin_s if view.status == "asleep"
                else math.inf if view.status == "offline" else -math.inf)
    if not view.online:
        return math.inf if view.status == "offline" else -math.inf
    if view.status == "online":
        return view.last_seen + min(cfg.stale_after_s, cfg.offline_after_s)
    if view.status == "stale":
        return view.last_seen + cfg.offline_after_s
    return math.inf if view.status == "offline" else -math.inf


def clock(t: float) -> str:
    """HH:MM of a wall-clock time, in the coordinator's local time."""
    return time.strftime("%H:%M", time.localtime(t))


def status_text(status: str, wake_at: float) -> str:
    """The status an operator reads: `asleep (next wake HH:MM)` for a sleeper."""
    return f"asleep (next wake {clock(wake_at)})" if status == "asleep" else status


def version_of(view: DeviceView) -> str | None:
    """The edgerun version a device reported (None when it did not)."""
    v = view.versions.get("edgerun") if isinstance(view.versions, Mapping) else None
    return str(v) if v else None


def majority_of(counts: Mapping[str, int]) -> str | None:
    """The version with the most devices in `counts` (version -> devices); a tie goes to the
    highest version string, so the answer never depends on the order devices were seen."""
    best = max(((n, ver) for ver, n in counts.items() if n > 0), default=None)
    return best[1] if best else None


def majority_version(views: Iterable[DeviceView]) -> str | None:
    """The edgerun version most devices run (None when no device reported one)."""
    return majority_of(Counter(ver for v in views if (ver := version_of(v)) is not None))


def _num(h: Mapping[str, Any], *path: str) -> float | None:
    """A number at `path` in a health message, or None when absent or not a number (a bool or
    a string where a number belongs never reaches arithmetic or formatting)."""
    node: Any = h
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node) if math.isfinite(node) else None


def _get(h: Mapping[str, Any], *path: str) -> Any:
    node: Any = h
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def alerts(view: DeviceView, cfg: FleetConfig, fleet_version: str | None
           ) -> tuple[tuple[str, str], ...]:
    """Alerts for one device from its latest health and the fleet's majority version.

    Reads typed fields only (the health schema is enforced on arrival, and these reads check
    types again, so a stored or restored message of any shape cannot raise here)."""
    out: list[tuple[str, str]] = []
    h = view.health if isinstance(view.health, Mapping) else {}
    if _get(h, "governor", "enabled") is False:
        why = _get(h, "governor", "disabled_reason")
        out.append(("governor_disabled", "critical: thermal governor disabled"
                    + (f": {why[:200]}" if isinstance(why, str) and why else "")
                    + " (nothing steps the model down before the device overheats)"))
    if view.asleep and view.status == "offline":
        out.append(("missed_wake", f"announced a wake at {clock(view.wake_at)} and has not "
                                   f"been heard from since (margin {cfg.wake_margin_s:.0f} s)"))
    elif view.status not in ("online", "asleep"):
        seen = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.last_seen))
                if view.last_seen > 0 else "never")
        out.append((view.status, f"device is {view.status} (last seen {seen})"))
    temp, trip = _num(h, "temp_c"), _num(h, "passive_trip_c")
    if h.get("throttled") is True:
        out.append(("throttled", "the device reports thermal throttling"))
    elif temp is not None and trip is not None and temp >= trip - cfg.temp_margin_c:
        out.append(("hot", f"{temp:.1f} °C is within {cfg.temp_margin_c:.0f} °C of the "
                           f"{trip:.0f} °C trip"))
    problems = h.get("sensor_problems")
    if isinstance(problems, list | tuple) and problems:
        out.append(("sensor", "sensor problem: " + "; ".join(str(p)[:200] for p in problems[:3])))
    reason = _get(h, "governor", "reason")
    if isinstance(reason, str) and reason.startswith("fail-safe"):
        out.append(("failsafe", f"control is failing safe (lowest rung): {reason[:200]}"))
    for m in h.get("models") or ():  # a model whose first frames looked degenerate
        if isinstance(m, Mapping) and isinstance(m.get("blind"), str) and m["blind"]:
            out.append(("model_blind", f"model {str(m.get('model'))[:64]} looks blind: "
                        f"{m['blind'][:200]} (check its preprocessing)"))
    compliance = _num(h, "slo", "compliance")
    if compliance is not None and compliance < cfg.slo_alert:
        slo = h.get("slo")
        what = ("frames end to end" if isinstance(slo, Mapping) and slo.get("of") == "end_to_end"
                else "inferences")  # a device before the field judged inferences
        out.append(("slo", f"latency SLO met by {compliance:.1%} of {what}"))
    held, evicted = _num(h, "backlog", "results_held"), _num(h, "backlog", "evicted_total")
    if held is not None and held > cfg.backlog_alert:
        out.append(("backlog", f"{held:.0f} results waiting on the device"))
    if evicted is not None and evicted > 0:
        out.append(("evicted", f"the device evicted {evicted:.0f} unacked results "
                               "(outbox full)"))
    version = view.versions.get("edgerun") if isinstance(view.versions, Mapping) else None
    if fleet_version and version and str(version) != fleet_version:
        out.append(("version", f"runs edgerun {version}, most of the fleet runs {fleet_version}"))
    return tuple(out)


def refresh(views: Mapping[str, DeviceView], now: float, cfg: FleetConfig
            ) -> dict[str, DeviceView]:
    """Tick every device and recompute its alerts against the fleet."""
    ticked = {k: tick(v, now, cfg) for k, v in views.items()}
    version = majority_version(ticked.values())
    return {k: replace(v, alerts=alerts(v, cfg, version)) for k, v in ticked.items()}


def refresh_some(views: Mapping[str, DeviceView], devices: Iterable[str],
                 now_of: Callable[[str], float], cfg: FleetConfig, fleet_version: str | None
                 ) -> dict[str, DeviceView]:
    """`refresh` of some devices only (those that changed, or whose `next_change` passed),
    each aged at `now_of(device)` (ageing.py: the wall clock as its view's times were
    stamped), against the fleet's majority version counted elsewhere; devices not in
    `views` are skipped."""
    out = {}
    for d in devices:
        v = views.get(d)
        if v is not None:
            t = tick(v, now_of(d), cfg)
            out[d] = _with(t, {"alerts": alerts(t, cfg, fleet_version)})
    return out


def transitions(before: Mapping[str, DeviceView], after: Mapping[str, DeviceView]
                ) -> list[tuple[str, str, str]]:
    """(device, old status, new status) for each device whose status changed."""
    return [(k, before[k].status if k in before else "unknown", v.status)
            for k, v in after.items() if k not in before or before[k].status != v.status]


def alert_changes(before: Mapping[str, DeviceView], after: Mapping[str, DeviceView]
                  ) -> list[tuple[str, str, str, str]]:
    """(device, alert code, "raised" | "cleared", message) for each alert that appeared on or
    left a device between two views (a device new in `after` raises all of its alerts)."""
    out = []
    for k, v in after.items():
        old = dict(before[k].alerts) if k in before else {}
        new = dict(v.alerts)
        out += [(k, code, "raised", msg) for code, msg in new.items() if code not in old]
        out += [(k, code, "cleared", old[code]) for code in old if code not in new]
    return out
