"""Fleet state: pure functions from (device view, message or clock) to a new view.

Status per device:
- `online`  its retained state says online and something arrived within `stale_after_s`;
- `stale`   online by its state, but silent for longer than `stale_after_s`;
- `offline` its state says offline (will message or clean stop), or silent past `offline_after_s`
  (a broker partition can hide the will).
Alerts are derived from the latest health and the fleet's versions; each is a short code plus
a sentence for the operator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class FleetConfig:
    """Thresholds of the state machine and the alerts."""

    stale_after_s: float = 30.0
    offline_after_s: float = 120.0
    backlog_alert: int = 1000  # held results on the device
    slo_alert: float = 0.95  # SLO compliance below this
    temp_margin_c: float = 5.0  # within this of the first passive trip


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


def on_state(view: DeviceView, msg: Mapping[str, Any], now: float) -> DeviceView:
    """A birth (online) or death (will / clean stop) message arrived."""
    if msg["t"] < view.state_t and msg["boot"] != view.boot:
        return view  # a previous boot's state arriving after the current one's
    # Within one boot, arrival order is the truth: the will carries the connect time,
    # so it is older than the birth it follows.
    new = replace(view, online=msg["online"], boot=msg["boot"], state_t=msg["t"],
                  reason=msg.get("reason", ""), last_seen=now if msg["online"] else view.last_seen)
    if msg["online"]:
        new = replace(new, versions=msg.get("versions", view.versions),
                      model=msg.get("model", view.model), choice=msg.get("choice", view.choice))
    return replace(new, status="online" if msg["online"] else "offline")


def on_activity(view: DeviceView, now: float, health: Mapping[str, Any] | None = None
                ) -> DeviceView:
    """A result, event or health message arrived: the device is alive."""
    new = replace(view, last_seen=max(view.last_seen, now))
    if health is not None:
        new = replace(new, health=health, choice=health.get("choice", view.choice))
    if not new.online:
        # Traffic after a death message: the birth was lost or is still in flight.
        new = replace(new, online=True)
    return replace(new, status="online")


def tick(view: DeviceView, now: float, cfg: FleetConfig) -> DeviceView:
    """Age the view: online -> stale -> offline as silence grows."""
    if not view.online:
        return view if view.status == "offline" else replace(view, status="offline")
    silent = now - view.last_seen
    status = ("offline" if silent > cfg.offline_after_s
              else "stale" if silent > cfg.stale_after_s else "online")
    return view if status == view.status else replace(view, status=status)


def majority_version(views: Iterable[DeviceView]) -> str | None:
    """The edgerun version most devices run (None when no device reported one)."""
    counts = Counter(str(v.versions.get("edgerun")) for v in views if v.versions.get("edgerun"))
    return counts.most_common(1)[0][0] if counts else None


def alerts(view: DeviceView, cfg: FleetConfig, fleet_version: str | None
           ) -> tuple[tuple[str, str], ...]:
    """Alerts for one device from its latest health and the fleet's majority version."""
    out: list[tuple[str, str]] = []
    h = view.health
    if view.status != "online":
        out.append((view.status, f"device is {view.status} (last seen {view.last_seen:.0f})"))
    temp, trip = h.get("temp_c"), h.get("passive_trip_c")
    if h.get("throttled"):
        out.append(("throttled", "the device reports thermal throttling"))
    elif isinstance(temp, int | float) and isinstance(trip, int | float) and (
            temp >= trip - cfg.temp_margin_c):
        out.append(("hot", f"{temp:.1f} °C is within {cfg.temp_margin_c:.0f} °C of the "
                           f"{trip:.0f} °C trip"))
    slo = h.get("slo", {})
    if isinstance(slo, Mapping) and isinstance(slo.get("compliance"), int | float) and (
            slo["compliance"] < cfg.slo_alert):
        out.append(("slo", f"latency SLO met by {slo['compliance']:.1%} of inferences"))
    backlog = h.get("backlog", {})
    if isinstance(backlog, Mapping):
        if backlog.get("results_held", 0) > cfg.backlog_alert:
            out.append(("backlog", f"{backlog['results_held']} results waiting on the device"))
        if backlog.get("evicted_total", 0) > 0:
            out.append(("evicted", f"the device evicted {backlog['evicted_total']} unacked "
                                   "results (outbox full)"))
    version = view.versions.get("edgerun")
    if fleet_version and version and str(version) != fleet_version:
        out.append(("version", f"runs edgerun {version}, most of the fleet runs {fleet_version}"))
    return tuple(out)


def refresh(views: Mapping[str, DeviceView], now: float, cfg: FleetConfig
            ) -> dict[str, DeviceView]:
    """Tick every device and recompute its alerts against the fleet."""
    ticked = {k: tick(v, now, cfg) for k, v in views.items()}
    version = majority_version(ticked.values())
    return {k: replace(v, alerts=alerts(v, cfg, version)) for k, v in ticked.items()}


def transitions(before: Mapping[str, DeviceView], after: Mapping[str, DeviceView]
                ) -> list[tuple[str, str, str]]:
    """(device, old status, new status) for each device whose status changed."""
    return [(k, before[k].status if k in before else "unknown", v.status)
            for k, v in after.items() if k not in before or before[k].status != v.status]
