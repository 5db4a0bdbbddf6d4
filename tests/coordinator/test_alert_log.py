"""The dashboard's recent alert transitions and alert counts come from the store: every
coordinator sharing it shows the same, including one started after the alert was raised."""

from __future__ import annotations

import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.wire import payloads


def _coord(store_url: str, k: int):
    from runtime.coordinator.service import Coordinator

    return Coordinator(CoordinatorConfig(fleet="test", store=store_url, share_group="g",
                                         client_id=f"c{k}", alert_clear_s=0,
                                         stale_after_s=1000, offline_after_s=1000))


def _health(coord, temp: float, at: float) -> None:
    coord._ingest([(payloads.topic("test", "d", "health"), payloads.encode("health", {
        "v": 1, "t": at, "boot": "b", "temp_c": temp, "passive_trip_c": 85.0}), at)])
    coord._refresh(at)


def test_a_coordinator_started_later_lists_the_same_alerts(store_url):
    """Old code: the list and the counters were in each coordinator's memory; one started
    after the alert was raised listed nothing and showed the alert as active 'before
    start'; two that both computed a transition each listed their own."""
    a = _coord(store_url, 1)
    b = None
    try:
        t = time.time()
        _health(a, 84.0, t)
        raised = a.alerts_view()
        assert [(x["alert"], x["state"]) for x in raised["recent"]] == [("hot", "raised")]
        b = _coord(store_url, 2)  # started after the raise (a restart, a new replica)
        shown = b.alerts_view()
        assert shown["recent"] == raised["recent"]
        assert [x["since"] for x in shown["active"]] == [raised["recent"][0]["t"]]
        assert shown["counts"] == raised["counts"] == {"raised": 1}
        _health(a, 60.0, t + 1)  # cools: a clears it; b computes the same from the store
        b._refresh(time.time())
        a._refresh(time.time())
        va, vb = a.alerts_view(), b.alerts_view()
        assert [(x["alert"], x["state"]) for x in va["recent"]] == [("hot", "cleared"),
                                                                   ("hot", "raised")]
        assert vb["recent"] == va["recent"] and va["active"] == vb["active"] == []
        assert va["counts"] == vb["counts"] == {"raised": 1, "cleared": 1}
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_the_log_is_bounded_and_a_bad_row_is_skipped(store_url):
    from runtime.coordinator.alert_log import AlertLog
    from runtime.coordinator.store import Store

    s = Store(store_url)
    try:
        log = AlertLog(s, keep=5)
        for i in range(8):
            log.add({"t": 1000.0 + i, "device": "d", "alert": "hot", "state": "raised"})
        assert log.flush() == 8 and log.flush() == 0
        assert [x["t"] for x in log.recent()] == [1007.0, 1006.0, 1005.0, 1004.0, 1003.0]
        assert log.counts() == {"raised": 8}  # counted for ever, listed the newest 5
        s.write("INSERT INTO alert_log (t, device, code, state, body) VALUES (?,?,?,?,?)",
                [(2000.0, "d", "hot", "raised", "{not json")])
        assert [x["t"] for x in log.recent(2)] == [1007.0]
        assert log.raised_times() == {("d", "hot"): 2000.0}
    finally:
        s.close()


def test_an_alert_due_while_the_store_hangs_holds_no_api_request(tmp_path):
    """With the store's disk not answering writes (the attack run: fsfreeze on the loop ext4
    holding a real coordinator's SQLite store), a device went stale, and the refresh that
    raised its alert wrote the transition into the store's log under the views lock: every
    API request and /metrics then waited behind it for as long as the disk did. The
    transition is now written outside the views lock; a refresh that finds another thread
    writing leaves it its transitions and answers."""
    import threading

    from runtime.coordinator.service import Coordinator

    coord = Coordinator(CoordinatorConfig(fleet="test", store=str(tmp_path / "c.db"),
                                          alert_clear_s=0, stale_after_s=5,
                                          offline_after_s=10, offline_alert_s=0))
    now = time.time()
    coord._ingest([(payloads.topic("test", "d", "health"), payloads.encode("health", {
        "v": 1, "t": now, "boot": "b"}), now)])
    coord._refresh(now)
    holding, release = threading.Event(), threading.Event()

    def stalled_commit():  # what the ingest thread's commit on a frozen disk amounts to
        with coord.store.transaction():
            holding.set()
            release.wait(30)

    writer = threading.Thread(target=stalled_commit)
    writer.start()
    try:
        assert holding.wait(10)
        ager = threading.Thread(target=coord._refresh, args=(now + 60,))  # d goes offline
        ager.start()
        deadline = time.monotonic() + 10
        while coord.counters["alerts_raised"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert coord.counters["alerts_raised"] >= 1
        answered: list = []
        api = threading.Thread(target=lambda: answered.append(coord.fleet_view()))
        api.start()
        api.join(10)
        assert answered and answered[0][0]["status"] == "offline", \
            "the API waited for the store behind the views lock"
    finally:
        release.set()
        writer.join(10)
        ager.join(10)
    # once the store answers, the transition is in its log, once
    coord._refresh(now + 61)
    assert [(r["device"], r["alert"], r["state"]) for r in coord.alerts_view()["recent"]
            ] == [("d", "offline", "raised")]
    coord.store.close()
