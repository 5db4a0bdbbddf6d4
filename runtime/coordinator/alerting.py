"""The coordinator's alert transitions: the fleet view's alert changes turned into raises
and clears (alerts.py), logged, kept for the dashboard (in memory and in the store's alert
log, alert_log.py), and handed to the webhook (webhooks.py); with several coordinators on one
store, only the one that claims a transition first records and sends it.

Its `now` is the coordinator's steady time (runtime/wire/clock.py StepClock): the delays
(offline_alert_s, alert_clear_s) are elapsed time whatever the wall clock steps; `wall_of`
turns a steady time into the wall time told (payloads, the store's log, the dashboard).

Everything here runs under the coordinator's views lock (its refresh holds it while the
transitions are recorded and sent, so each is recorded and sent exactly once, in order);
Webhook.submit never blocks.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet, webhooks
from runtime.coordinator.alert_log import AlertLog
from runtime.coordinator.alerts import AlertStates, Told
from runtime.coordinator.store import Store
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.coordinator")

ALERT_LOG = 1000  # alert transitions kept in memory for the dashboard (GET /api/v1/alerts)


class Alerting:
    """One coordinator's alert transitions (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig, store: Store, counters: collections.Counter,
                 rlog: RateLimitedLog, views: dict[str, fleet.DeviceView] | None = None,
                 wall_of: Callable[[float], float] = lambda t: t):
        """`views`: the fleet restored at start (see `restored`); `wall_of`: the wall time
        of a steady time (the coordinator's clock: the steady time plus the steps since)."""
        self.cfg, self._store, self.counters, self._rlog = cfg, store, counters, rlog
        self.wall_of = wall_of
        # Alert transitions, newest last, and when each active alert was raised; filled by
        # the refresh. Alerts active at start were raised before: they are not sent again.
        self.log: collections.deque = collections.deque(maxlen=ALERT_LOG)
        self.store_log = AlertLog(store)  # what every coordinator's dashboard lists
        # each (device, code)'s state: raised at once (`offline` once it lasts
        # offline_alert_s, unless it follows a `stale` told), cleared once away alert_clear_s
        self._alerts = AlertStates({"offline": cfg.offline_alert_s}, after={"offline": ("stale",)})
        # the coordinator's own alerts (code -> message: `store`, store_watch.py), told as a
        # device's under this name (each coordinator sharing a store has its own)
        self.own_name = f"coordinator {cfg.client_id}"
        self._own: dict[str, str] = {}
        # for the webhook and the store's log: queued under the views lock, sent outside it
        # (the last item: whether the webhook has it already, as an own alert's)
        self._to_send: collections.deque[tuple[str, str, str, float, dict, bool]] = \
            collections.deque()
        self._sending = threading.Lock()  # one thread sends; the others leave theirs to it
        self.webhook = (webhooks.Webhook(
            cfg.webhook_url,
            webhooks.load_secret(cfg.webhook_secret_file) if cfg.webhook_secret_file else None,
            cfg.webhook_queue, cfg.webhook_timeout_s, cfg.webhook_attempts,
            cfg.webhook_backoff_s) if cfg.webhook_url else None)
        if views:
            self.restored(views, time.time())
        self._opened = False  # the raises a run before left without their clear, looked at

    def restored(self, views: dict[str, fleet.DeviceView], now: float) -> int:
        """At start: the alerts of codes with a raise delay (`offline`) active in the restored
        `views` that no run told (the store's log has no raise of them since the device was
        last heard, and still holds every transition since then) are held as raising from
        `now`: the run before was holding them back when it ended (a restart within
        offline_alert_s of a device going offline). Every other alert active at start was
        told before. Returns how many; a store that cannot be read: none (as before)."""
        held = [(v, code, msg) for v in views.values() for code, msg in v.alerts
                if self._alerts.delayed(code)]
        if not held:
            return 0
        try:
            raised, since = self.store_log.raised_times(), self.store_log.complete_since()
            told = {(v.device, code) for v, code, _ in held
                    if raised.get((v.device, code), -1.0) >= v.last_seen
                    or since > v.last_seen}
        except Exception as e:
            log.debug("alerts held back before this start not looked up: %s", e)
            return 0
        n = sum(self._alerts.hold(v.device, code, now, msg) for v, code, msg in held
                if (v.device, code) not in told)
        if n:
            log.info("%d offline alert(s) active at start were not told yet: told once they "
                     "last offline_alert_s from now", n)
        return n

    def refreshed(self, changes: list[tuple[str, str, str, str]], now: float,
                  views: dict[str, fleet.DeviceView]) -> None:
        """A refresh's alert changes (fleet.alert_changes) recorded and the clears that
        settled added, queued for `send`. Under the views lock (`views` read for each
        status)."""
        if not self._opened:  # the first refresh: every device's alerts known now
            self._opened = True
            changes = changes + self._left_open(views, changes)
        self._record_alerts(changes, now, views)
        self._settle_clears(now, views)

    def _left_open(self, views: dict[str, fleet.DeviceView],
                   changes: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
        """The alerts the store's log says were raised and never told cleared that a device
        no longer has: the run before ended while their clear waited out alert_clear_s (or
        they went while no coordinator ran). Fed as cleared, so their clear is told once they
        have stayed away alert_clear_s from here; otherwise the webhook's incident stays
        open for good. A store that cannot be read: none (as before)."""
        try:
            open_ = self.store_log.open_raises()
        except Exception as e:
            log.debug("alerts left open by the run before not looked up: %s", e)
            return []
        raised_now = {(d, c) for d, c, state, _ in changes if state == "raised"}
        return [(d, code, "cleared", msg) for (d, code), msg in sorted(open_.items())
                if d in views and code not in dict(views[d].alerts)
                and (d, code) not in raised_now and self._alerts.state(d, code) is None]

    def own(self, alerts: dict[str, str], now: float,
            views: dict[str, fleet.DeviceView]) -> bool:
        """The coordinator's own alerts now (code -> message), under the views lock: a code
        that appeared is raised, one that went is cleared (after alert_clear_s, as a
        device's), under `own_name`. True when any changed (handed to the webhook at once,
        queued for `send` into the store's log)."""
        before, self._own = self._own, dict(alerts)
        changes = [(self.own_name, c, "raised", m) for c, m in alerts.items() if c not in before]
        changes += [(self.own_name, c, "cleared", m) for c, m in before.items()
                    if c not in alerts]
        if changes:
            self._record_alerts(changes, now, views)
        return bool(changes)

    def send(self, background: bool = False) -> None:
        """Send what `refreshed` queued: into the store's log and to the webhook. Not under
        the views lock: its store writes wait as long as the store does (a disk that stopped
        answering writes held every API request and /metrics behind the views lock). One
        thread sends at a time; another finding it busy returns at once, its transitions
        sent by that one (it looks again before it leaves) or by the next refresh.
        `background` (the store may hang: store_watch.busy): on a thread of its own, when
        anything is queued (an API request waited for a frozen disk behind a transition)."""
        if background:
            if self._to_send:
                threading.Thread(target=self.send, name="alert-send", daemon=True).start()
            return
        while self._sending.acquire(blocking=False):
            try:
                self._send_alerts()
            finally:
                self._sending.release()
            if not self._to_send:
                return

    def _record_alerts(self, changes: list[tuple[str, str, str, str]], now: float,
                       views: dict[str, fleet.DeviceView]) -> None:
        """Turn alert changes into transitions (alerts.py: a raise at once unless it is only
        back from a clear still settling; a clear after alert_clear_s). Under the views
        lock; Webhook.submit never blocks."""
        flaps, wall = self._alerts.flaps, self.wall_of(now)
        # stamped as the raise's payload is (webhooks.alert_payload: ms), so a clear's
        # raised_t and the dashboard's `since` equal the raise's `t`
        self._tell(self._alerts.apply(changes, now, stamp=round(wall, 3)), wall, views,
                   many=len(changes) > 20)
        self.counters["alert_flaps"] += self._alerts.flaps - flaps

    def _settle_clears(self, now: float, views: dict[str, fleet.DeviceView]) -> None:
        """Send the clears of alerts that have stayed away for alert_clear_s, and the raises
        of those that have lasted their delay."""
        held, wall = self._alerts.held_back, self.wall_of(now)
        told = self._alerts.settle(now, self.cfg.alert_clear_s, stamp=wall)
        self._tell(told, wall, views, many=len(told) > 20)
        self.counters["alerts_held_back"] += self._alerts.held_back - held

    def _tell(self, told: list[Told], now: float, views: dict[str, fleet.DeviceView],
              many: bool) -> None:
        """Emit each transition (told at wall time `now`); many at once (a fleet going
        stale): one line a kind."""
        quiet: collections.Counter = collections.Counter()
        for t in told:
            self._emit_alert(t, now, views, quiet if many else None)
        _log_quiet(quiet)

    def _emit_alert(self, t: Told, now: float, views: dict[str, fleet.DeviceView],
                    quiet: collections.Counter | None = None) -> None:
        """One alert transition: logged (or counted into `quiet` for one summary line),
        kept for the dashboard, queued for the webhook."""
        device, code, state, message = t.device, t.code, t.state, t.message
        status = views[device].status if device in views else "unknown"
        body = webhooks.alert_payload(self.cfg.fleet, device, code, state, message,
                                      status, now)
        if state == "cleared":
            body["raised_t"] = t.raised_t
        self.log.append(body)
        self.counters[f"alerts_{state}"] += 1
        if quiet is None and state == "cleared":
            # the message is the raise's ("device is offline"): said as what it was, or the
            # line reads "offline cleared: device is offline"
            log.info("device %s: alert %s cleared (raised for: %s)", device, code, message)
        elif quiet is None:
            log.info("device %s: alert %s %s: %s", device, code, state, message)
        else:
            quiet[(code, state)] += 1
        # The coordinator's own (its store hanging: store_watch.py) go to the webhook now:
        # the one thread that sends may be stuck in the store's log write of the alert
        # before, and no other coordinator tells them (no claim to make on the store).
        own = device == self.own_name
        if own:
            self._hand(code, body)
        self._to_send.append((device, code, state, now, body, own))  # by _send_alerts

    def _send_alerts(self) -> None:
        """Record a refresh's alert transitions in the store's log (the dashboard's list on
        every coordinator) and hand them to the webhook. With several coordinators on one
        store (share_group) each computes every transition from the shared view: only those
        this one claims first are recorded and sent, all claimed in one store transaction (a
        fleet going stale at once was one transaction an alert). A store error sends them
        all (a duplicate is better than a lost alert). Under `_sending`; submit never
        blocks."""
        pending = []
        while self._to_send:  # popleft is atomic: a transition queued meanwhile waits
            pending.append(self._to_send.popleft())
        won = [True] * len(pending)
        claims = [i for i, p in enumerate(pending) if not p[5]]  # own ones: this one's only
        if self.cfg.share_group and claims:
            try:
                # the window: each coordinator holds a delayed raise from when it saw the
                # alert (or started: restored), so two tell the same raise up to
                # offline_alert_s apart
                got = self._store.claim_many([(d, f"alert:{code}", state, t) for d, code,
                                              state, t, _, _ in (pending[i] for i in claims)],
                                             window_s=60.0 + self.cfg.offline_alert_s)
                for i, first in zip(claims, got, strict=True):
                    won[i] = first
            except Exception as e:
                self._rlog.log("alert-claim", "could not check the store for alert duplicates "
                               "(sending anyway): %s", e, level=logging.ERROR)
        for (_, code, _, _, body, handed), first in zip(pending, won, strict=True):
            if not first:
                continue
            self.store_log.add(body)  # one row per transition however many computed it
            if not handed:
                self._hand(code, body)
        try:
            self.store_log.flush()
        except Exception as e:  # the dashboard's list must not cost the refresh
            self._rlog.log("alert-log", "could not record alert transitions in the store "
                           "(retrying at the next refresh): %s", e, level=logging.ERROR)

    def _hand(self, code: str, body: dict) -> None:
        """Give the webhook one transition when it takes `code` (Webhook.submit never
        blocks)."""
        if self.webhook is not None and (not self.cfg.webhook_alerts
                                         or code in self.cfg.webhook_alerts):
            self.webhook.submit(body)

    def stored(self, limit: int) -> tuple[list[dict] | None, dict[tuple[str, str], float],
                                          dict | None]:
        """(the newest `limit` transitions, when each active alert was raised, the counts)
        from the store's log, the same on every coordinator sharing it; (None, {}, None)
        when the store cannot be read (listing then shows this coordinator's own)."""
        try:
            return (self.store_log.recent(limit), self.store_log.raised_times(),
                    self.store_log.counts())
        except Exception as e:
            self._rlog.log("alert-log", "could not read the alert log from the store "
                           "(showing this coordinator's own): %s", e, level=logging.ERROR)
            return None, {}, None

    def listing(self, views: dict[str, fleet.DeviceView], limit: int,
                stored: tuple[list[dict] | None, dict[tuple[str, str], float], dict | None]
                ) -> dict[str, Any]:
        """The alerts view (Coordinator.alerts_view) from `views` (read under the views
        lock) and what `stored` read of the store's log."""
        recent, raised, counts = stored
        shift = self.wall_of(0.0)  # a steady time held here, as the wall clock reads now
        active = [{"device": v.device, "alert": code, "message": msg, "status": v.status,
                   "since": self._alerts.raised_at(v.device, code)
                   or _plus(self._alerts.raising_since(v.device, code), shift)
                   or raised.get((v.device, code))}
                  for v in sorted(views.values(), key=lambda v: v.device)
                  for code, msg in v.alerts]
        active += [{"device": self.own_name, "alert": code, "message": msg,
                    "status": "coordinator",
                    "since": self._alerts.raised_at(self.own_name, code)}
                   for code, msg in sorted(self._own.items())]
        clearing = [{"device": d, "alert": code, "message": msg,
                     "status": views[d].status if d in views else "unknown",
                     "since": self._alerts.raised_at(d, code) or raised.get((d, code)),
                     "gone_at": went + shift,
                     "settles_at": went + shift + self.cfg.alert_clear_s}
                    for d, code, went, msg in self._alerts.clearing()]
        if recent is None:
            recent = list(self.log)[-limit:][::-1]
        return {"active": active, "clearing": clearing, "recent": recent, "counts": counts,
                "webhook": self.webhook.stats() if self.webhook is not None else None}


def _plus(t: float | None, shift: float) -> float | None:
    return None if t is None else t + shift


def _log_quiet(counts: collections.Counter) -> None:
    """One log line per (alert, raised|cleared) counted instead of logged per device."""
    for (code, state), n in sorted(counts.items()):
        log.info("%d devices: alert %s %s", n, code, state)
