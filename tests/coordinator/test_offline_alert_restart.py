"""An `offline` alert still within its raise delay (coordinator.offline_alert_s) when the
coordinator restarts: the raise is told by the next run, and the Active list's `since` is
not an earlier episode's raise (runtime/coordinator/alerting.py, alerts.py)."""

from __future__ import annotations

import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire import payloads


def _coord(path) -> Coordinator:
    return Coordinator(CoordinatorConfig(fleet="f", store=str(path), alert_clear_s=0,
                                         offline_alert_s=60, stale_after_s=1000,
                                         offline_after_s=1000))


def _state(c: Coordinator, online: bool) -> None:
    """A state message ingested now (ingest stamps what it hears with the wall clock; the
    refreshes below run at later times to pass the delays)."""
    at = time.time()
    c._ingest([(payloads.topic("f", "d", "state"), payloads.encode("state", {
        "v": 1, "online": online, "boot": "b", "t": at}), at)])


def _told(c: Coordinator) -> list[tuple[str, str]]:
    return [(b["alert"], b["state"]) for b in c.alert_log if b["device"] == "d"]


def _restarted(path, told_s: float | None = None) -> tuple[Coordinator, float]:
    """A coordinator that saw d go offline (its will) at t0 and ran until t0 + `told_s`
    (None: t0, within the delay), then the next run on its store, and t0."""
    a = _coord(path)
    try:
        _state(a, True)
        _state(a, False)  # its will: offline, not told before it lasts 60 s
        t0 = time.time()
        a._refresh(t0)
        if told_s is not None:
            a._refresh(t0 + told_s)
        assert _told(a) == ([] if told_s is None else [("offline", "raised")])
    finally:
        a.stop()
    return _coord(path), t0


def test_an_offline_alert_raising_at_a_restart_is_told_by_the_next_run(tmp_path):
    """Old code: the next run took every alert active at its start as raised by the run
    before, so the offline alert that run was holding back was never told (the device
    offline for good, no page), and its clear was told when the device came back."""
    b, t0 = _restarted(tmp_path / "c.db")  # restarted within the delay
    try:
        # the delay counts again from the start (when the device went is not kept: a
        # coordinator restarted beside its broker must not page for the wills it read)
        b._refresh(t0 + 1)
        b._refresh(t0 + 59)
        assert _told(b) == []
        b._refresh(t0 + 61)
        assert _told(b) == [("offline", "raised")]
        b._refresh(t0 + 70)
        assert _told(b) == [("offline", "raised")]  # once
    finally:
        b.stop()


def test_an_offline_alert_held_back_at_a_restart_goes_untold_when_it_ends(tmp_path):
    b, t0 = _restarted(tmp_path / "c.db")
    try:
        b._refresh(t0 + 1)
        _state(b, True)  # back within the delay: neither a raise nor a clear
        b._refresh(t0 + 2)
        b._refresh(t0 + 100)
        assert _told(b) == []
        assert b.counters["alerts_held_back"] == 1
    finally:
        b.stop()


def test_an_offline_alert_told_before_a_restart_is_not_told_again(tmp_path):
    b, t0 = _restarted(tmp_path / "c.db", told_s=61)
    try:
        b._refresh(t0 + 62)
        b._refresh(t0 + 200)
        assert _told(b) == []
        _state(b, True)  # back: its clear, as for any alert raised before
        b._refresh(t0 + 201)
        b._refresh(t0 + 202)
        assert _told(b) == [("offline", "cleared")]
    finally:
        b.stop()


def test_a_raising_offline_alert_is_not_shown_since_an_earlier_raise(tmp_path):
    """Old code: `since` fell back to the store log's last raise of (device, offline), an
    episode that had ended, while this one was still being held back."""
    c = _coord(tmp_path / "c.db")
    try:
        _state(c, True)
        _state(c, False)  # an earlier episode: raised, then cleared
        t0 = time.time()
        c._refresh(t0)
        c._refresh(t0 + 61)
        _state(c, True)
        c._refresh(t0 + 62)
        c._refresh(t0 + 63)
        assert _told(c) == [("offline", "raised"), ("offline", "cleared")]
        _state(c, False)  # offline again: held back
        c._refresh(t0 + 100)
        (active,) = c.alerting.listing(c.views, 50, c.alerting.stored(50))["active"]
        assert active["alert"] == "offline"
        assert active["since"] == t0 + 100, active
    finally:
        c.stop()


def test_an_offline_alert_is_taken_as_told_where_the_log_no_longer_reaches_back(tmp_path):
    """The store's log keeps the newest 1000 transitions: where it no longer holds the time
    the device was last heard, whether its offline was told cannot be read, and it is taken
    as told, as every alert active at start was before (a fleet's long-dead devices must
    not page again at each restart)."""
    from runtime.coordinator.alert_log import KEEP
    from runtime.coordinator.store import Store

    path = tmp_path / "c.db"
    b, t0 = _restarted(path)
    b.stop()
    s = Store(str(path))
    try:
        s.write("INSERT INTO alert_log (t, device, code, state, body) VALUES (?,?,?,?,?)",
                [(t0 + 1 + i / 1000, "x", "hot", "raised", "{}") for i in range(KEEP)])
    finally:
        s.close()
    c = _coord(path)
    try:
        c._refresh(t0 + 2)
        c._refresh(t0 + 100)
        assert _told(c) == []
    finally:
        c.stop()


def test_two_coordinators_sharing_a_store_tell_a_delayed_raise_once(tmp_path):
    """Coordinator b starts while a holds d's offline back: b holds it from its own start
    and tells it up to offline_alert_s after a did. Each claims the raise in the store
    (Store.claim: the same state within the window is another's duplicate); with a window
    of 60 s and offline_alert_s 120, b's claim came 100 s after a's and won: the webhook
    got the raise twice."""
    import collections
    import logging

    from runtime.coordinator import fleet
    from runtime.coordinator.alerting import Alerting
    from runtime.coordinator.store import Store
    from runtime.wire.quarantine import RateLimitedLog

    store = Store(str(tmp_path / "c.db"))
    try:
        def alerting(k: int) -> Alerting:
            cfg = CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"), share_group="g",
                                    client_id=f"c{k}", offline_alert_s=120)
            return Alerting(cfg, store, collections.Counter(),
                            RateLimitedLog(logging.getLogger("test")))

        t0 = 1_000_000.0
        msg = "device is offline"
        views = {"d": fleet.DeviceView("d", status="offline", last_seen=t0 - 1,
                                       alerts=(("offline", msg),))}
        a, b = alerting(1), alerting(2)
        a.refreshed([("d", "offline", "raised", msg)], t0, views)  # its will, seen by a
        assert b.restored(views, t0 + 100) == 1  # b starts: no raise in the log yet
        for t in (t0 + 120, t0 + 220):
            for c in (a, b):
                c.refreshed([], t, views)
                c.send()
        raised = [r for r in a.store_log.recent() if r["state"] == "raised"]
        assert [(r["device"], r["alert"], r["t"]) for r in raised] == [("d", "offline",
                                                                         t0 + 120)]
    finally:
        store.close()
