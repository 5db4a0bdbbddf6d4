"""The daemon across a sleep: duty cycling on an inspection schedule (`[sleep]`, docs/sleep.md).

Called from one place, the end of every control tick (`after_control`). The plan comes from
power/duty_cycle.py (re-planned at every wake from the running rung, the battery and the
harvest forecast of the energy budget). Staying up: the schedule's rate caps the pipeline.
Sleeping, each cycle runs through phases:

    warmup   camera warm-up after the wake (capture paused)
    burst    `burst` inferences per source at the rate the control step allows (with several
             cameras each one is inspected `burst` times; a source that is not running, e.g.
             a dead camera being re-opened, does not hold the others' burst open)
    deliver  capture paused; the outbox is flushed (every result acked) and commands queued
             at the broker during the sleep are drained, bounded by `flush_timeout_s`
    (sleep)  announce `asleep until T` (retained state, health), disconnect cleanly (no will,
             the broker keeps the session: commands sent meanwhile wait there), stretch the
             systemd watchdog over the sleep, suspend (power/suspend.py), restore the watchdog,
             reconnect, re-plan

Its collaborators are named: what is served (runtime/device/serving.py: the reading, the
control state, the pipeline, the running rung, the sensors, events and systemd's notifier) and
the `Uplink` a sleep is announced through (the outbox, the publisher, health now).

Timestamps stay honest for free: results and health carry the wall clock of their making,
sequence numbers come from the outbox's AUTOINCREMENT (a sleep changes neither).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from power import duty_cycle
from power.suspend import SimulatedSuspend, Suspender, SuspendError, SysfsSuspend
from runtime.wire.events import EventType

if TYPE_CHECKING:
    from runtime.config import Config, SleepConfig
    from runtime.device.serving import Serving

log = logging.getLogger("edgerun.sleep")

WATCHDOG_MARGIN_S = 60.0  # on top of a sleep's wall-clock length, for the resume


@dataclass(frozen=True)
class Uplink:
    """What a sleep is announced through: the `outbox` (runtime.telemetry.outbox.Outbox:
    the results still held), the `publisher` (runtime.telemetry.publisher.Publisher; None:
    no broker) says asleep and disconnects, `health()` is the message now and
    `send_health(h)` sends the last one before the sleep the way every health goes
    (runtime.device.links.Links.send_health: the outbox and the device's own history, where
    `edgerun report --local` reads the sleep from)."""

    outbox: Any
    publisher: Any
    health: Callable[[], dict[str, Any]]
    send_health: Callable[[dict[str, Any]], None]


class Sleeper:
    """Duty cycling of what is served (module doc)."""

    def __init__(self, cfg: SleepConfig, d: Serving, up: Uplink, suspender: Suspender,
                 speed: float = 1.0):
        self.d, self.up, self.cfg = d, up, cfg
        self.suspender, self.speed = suspender, speed
        self.cost = duty_cycle.WakeCost.of(d.device)
        st = d.device.states
        self.warmup_s = st.camera_warmup_s if st else 0.0
        self.schedule = duty_cycle.Schedule(every_s=self.cfg.every_s or None,
                                            per_hour=self.cfg.per_hour or None,
                                            burst=self.cfg.burst)
        self.disabled = ""
        self.plan: duty_cycle.Plan | None = None
        self.phase = "burst"
        self.cycle_t: float | None = None  # device time the current cycle began
        self.n0: dict[str, int] = {}  # each source's results when the burst began
        self.deliver_wall = 0.0
        self.wakes = 0
        self.next_wake: float | None = None  # wall clock, while asleep or planned
        self.last_slept_s: float | None = None

    # -- each control tick --------------------------------------------------------------------

    def after_control(self) -> None:
        """Apply the plan to the pipeline; sleep when a cycle's work is done."""
        d = self.d
        if self.disabled or d.reading is None:
            return
        t = d.reading.t
        if self.plan is None:
            self._replan(t)
            if self.plan is None:
                return
        if self.cycle_t is None:
            self.cycle_t, self.n0 = t, self._results()
        n = inspected(d.pipeline.lanes)
        if self.plan.mode == "stay_up":
            if t >= self.cycle_t + self.plan.period_s:  # a new period: the budget may allow
                self.cycle_t = t  # a sleep now (plans are remade at every wake otherwise)
                self._replan(t)
            rate = n * self.plan.burst / self.plan.period_s  # the cap is the sources' total
            d.pipeline.rate_cap_hz = min(d.pipeline.rate_cap_hz, rate)
            return
        if self.phase == "warmup":
            if t - self.cycle_t >= self.warmup_s:
                self.phase, self.n0 = "burst", self._results()
            else:
                d.pipeline.rate_cap_hz = 0.0
        elif self.phase == "burst":
            if self._burst_done():
                self.phase, self.deliver_wall = "deliver", time.monotonic()
                d.pipeline.rate_cap_hz = 0.0
        elif self.phase == "wait":  # too little of the period left to be worth a sleep
            if t >= self.cycle_t + self.plan.period_s:
                self.cycle_t, self.phase, self.n0 = t, "burst", self._results()
                self._replan(t)
            else:
                d.pipeline.rate_cap_hz = 0.0
        if self.phase == "deliver":
            d.pipeline.rate_cap_hz = 0.0
            if self._delivered():
                self._sleep(t)

    def _results(self) -> dict[str, int]:
        return {lane.name: int(lane.counters["results"]) for lane in self.d.pipeline.lanes}

    def _burst_done(self) -> bool:
        """Every running source has `burst` results since the burst began."""
        assert self.plan is not None
        now = self._results()
        live = [lane.name for lane in self.d.pipeline.lanes if lane.state == "running"]
        return bool(live) and all(now[name] - self.n0.get(name, 0) >= self.plan.burst
                                  for name in live)

    def _delivered(self) -> bool:
        """Results acked and queued commands in, or the flush bound reached."""
        pub = self.up.publisher
        if pub is None:
            return True
        held = self.up.outbox.stats()["results_held"]
        ready = pub.session_ready and pub.commands.empty() and held == 0
        if ready:
            return True
        waited = time.monotonic() - self.deliver_wall
        if waited >= self.cfg.flush_timeout_s:
            log.warning("sleeping with %d results not yet acked (%s); the flush is bounded by "
                        "sleep.flush_timeout_s = %g s: they go out at the next wake", held,
                        "connected" if pub.session_ready else "not connected to the broker",
                        self.cfg.flush_timeout_s)
            return True
        return False

    # -- the plan -----------------------------------------------------------------------------

    def _replan(self, t: float) -> None:
        d = self.d
        rung = d.frame_rung()  # per frame: tiles and each source's own model counted
        if rung is None:  # no model serving yet: plan at the next tick
            return
        budget = math.inf
        e = d.ccfg.energy if d.ccfg is not None else None
        r = d.reading
        battery = None
        if r is not None and e is not None:
            battery = r.battery_wh if r.battery_wh is not None else (
                None if r.battery_frac is None else r.battery_frac * e.capacity_wh)
        if e is not None and battery is not None:
            forecast = duty_cycle.planning_forecast(d.cstate.energy, e)
            budget = duty_cycle.affordable_w(battery, t, forecast, e, self.cost)
        # a burst inspects every source: n inferences' energy and time per burst step
        n = inspected(d.pipeline.lanes)
        self.plan = duty_cycle.plan(self.schedule, self.cost, n * rung.energy_j,
                                    n * rung.latency_s, budget, self.cfg.deliver_s,
                                    self.cfg.max_sleep_s)
        log.info("duty cycle: %s", self.plan.reason)

    # -- the sleep ----------------------------------------------------------------------------

    def _sleep(self, t: float) -> None:
        d, up, plan = self.d, self.up, self.plan
        assert plan is not None and self.cycle_t is not None
        away = self.cycle_t + plan.period_s - t  # device seconds until the next cycle
        if away < max(plan.break_even_s, self.cost.transition_s + 1.0):
            self.phase = "wait"  # the cycle ran long: a sleep now would cost more than it saves
            return
        wall_away = away / self.speed
        self.next_wake = time.time() + wall_away
        # The health that says so is taken at once: a report reads the sleep's length as its
        # wake less its time (x speed, simulated), and the log and event between them took
        # 0.5 s on a loaded host, 160 simulated s at 300x of a 262 s sleep (2026-12-08).
        last_word = up.health()
        when = time.strftime("%H:%M:%S", time.gmtime(self.next_wake))
        why = f"sleeping until {when} UTC ({away:.0f} s): {plan.reason}"
        log.info("%s", why)
        d.event(EventType.SLEEPING, "info", until=round(self.next_wake, 3), seconds=round(away, 1),
                plan=plan.reason)
        wd = d.notify.watchdog_s
        if wd:  # stretch the watchdog over the disconnect and the sleep (docs/sleep.md)
            d.notify.send("WATCHDOG=1",
                          f"WATCHDOG_USEC={int((wall_away + WATCHDOG_MARGIN_S) * 1e6)}")
        up.send_health(last_word)  # the last word before the sleep says so
        if up.publisher:
            up.publisher.sleep(self.next_wake, why)
        d.notify.status(f"asleep until {when} UTC")
        try:
            woke = self.suspender.suspend_for(away)
            self.last_slept_s = woke.slept_s
            failed = ""
        except SuspendError as e:
            failed = str(e)
        if wd:
            # The normal timeout again, and no beat here: the main loop beats only once the
            # infer loop has proved itself alive after the wake, so a hang after a sleep is
            # caught within one timeout.
            d.notify.send(f"WATCHDOG_USEC={int(wd * 1e6)}")
        if up.publisher:
            up.publisher.wake()
        self.next_wake = None
        self.wakes += 1
        if failed:
            log.error("could not suspend: %s; staying awake and trying again next cycle",
                      failed)
            d.event(EventType.SLEEP_FAILED, "warning", error=failed[:500])
            self.phase = "wait"
            return
        now = d.sensors.read().t
        log.info("woke after %.0f s (asked %.0f s)%s", woke.slept_s, away,
                 ": early" if woke.early else "")
        d.event(EventType.WOKE, "info", slept_s=round(woke.slept_s, 1), asked_s=round(away, 1),
                wakes=self.wakes)
        self.cycle_t, self.phase = now, "warmup"
        self._replan(now)

    def health(self) -> dict[str, Any]:
        """The `sleep` section of health."""
        p = self.plan

        def num(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else round(x, 4)

        return {"mode": "disabled" if self.disabled else (p.mode if p else "stay_up"),
                "period_s": num(p.period_s) if p else None,
                "per_hour": num(p.per_hour) if p else None,
                "requested_per_hour": num(p.requested_per_hour) if p else None,
                "break_even_s": num(p.break_even_s) if p else None,
                "average_w": num(p.average_w) if p else None,
                "over_budget": bool(p and p.over_budget), "wakes": self.wakes,
                "phase": self.phase, "reason": self.disabled or (p.reason if p else ""),
                "next_wake": self.next_wake, "last_slept_s": num(self.last_slept_s)}


def inspected(lanes: list) -> int:
    """Sources a burst inspects (at least 1): a source whose own model failed at start is
    never opened, so it neither costs a burst's energy nor gets a share of the cap."""
    return max(1, sum(1 for lane in lanes if not getattr(lane, "refused", "")))


def create(cfg: Config, d: Serving, up: Uplink, sim: Any) -> Sleeper | None:
    """The sleeper when `[sleep] enabled` (`sim`: runtime.device.simdevice.SimulatedDevice or
    None); a board that cannot suspend (or whose sysfs files are missing or not writable)
    runs awake with a critical event saying why."""
    sc = cfg.sleep
    if not sc.enabled:
        return None
    st = d.device.states
    suspender: Suspender
    if sim is not None:
        suspender = SimulatedSuspend(sim.plant, cfg.simulator.speed,
                                     advance=sim.advance)  # the one simulated clock
        speed = cfg.simulator.speed
    else:
        suspender = SysfsSuspend(Path(cfg.device.sysfs_root), sc.rtc,
                                 resume_s=st.resume_s if st else 0.0)
        speed = 1.0
    s = Sleeper(sc, d, up, suspender, speed)
    problems = ([] if st is not None and st.can_suspend else
                [f"device profile {d.device.name} cannot suspend ([states] can_suspend)"])
    problems = problems or suspender.problems()
    if problems:
        s.disabled = ("sleep is configured but the board cannot sleep: " + "; ".join(problems)
                      + "; running awake")
        log.critical("%s", s.disabled)
        d.event(EventType.SLEEP_DISABLED, "critical", reason=s.disabled[:1000])
    return s
