"""A store that hangs or fails is seen (store_watch.py): logged, alerted, in the stats and
/metrics, and the fleet is not aged stale for the coordinator's own fault.

With the store's disk frozen the ingest thread sat in a commit without a word, and the fleet
view aged every device stale, then offline, although all of them were sending; a failing
store was an ERROR line and a counter. The hang here is a real one: another connection holds
the SQLite store's write lock, so the coordinator's BEGIN IMMEDIATE waits (as it would behind
a frozen disk or another writer); the watchdog's clock is simulated (`Coordinator.mono`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

import pytest
from support.waiting import until

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import metrics
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store_watch import StoreWatch

E, W = logging.ERROR, logging.WARNING


# probe_due (probe_s 5): failing, nothing in flight, 5 s without a batch that told
@pytest.mark.parametrize("steps, at, due", [
    ([], 100, False),  # never failed
    ([("begin", 0), ("end", 1, "x")], 5.9, False),  # failing for less than probe_s
    ([("begin", 0), ("end", 1, "x")], 6, True),
    ([("begin", 0), ("end", 1, "x"), ("begin", 2), ("end", 3, "y")], 7, False),  # told at 3
    ([("begin", 0), ("end", 1, "x"), ("begin", 2), ("end", 3, "y")], 8, True),
    # a batch with nothing to store tells nothing: the probe is due as if none came
    ([("begin", 0), ("end", 1, "x"), ("begin", 5), ("end", 5.5, None, False)], 6, True),
    ([("begin", 0), ("end", 1, "x"), ("begin", 5)], 9, False),  # something in flight
    ([("begin", 0), ("end", 1, "x"), ("begin", 5), ("end", 6)], 20, False),  # back
])
def test_when_a_failing_store_is_probed(steps, at, due):
    w = StoreWatch("s.db", stall_after_s=30.0, probe_s=5.0)
    for op, t, *err in steps:
        if op == "begin":
            w.begin(t)
        else:
            w.end(t, *err)
    assert w.probe_due(at) is due


@pytest.mark.parametrize("steps, said, state", [
    # a batch within the bound: nothing said, ok
    ([("begin", 0), ("check", 4.9), ("end", 5)], [], "ok"),
    # past it: one ERROR, then at most one a minute, and its end
    ([("begin", 0), ("check", 5.1), ("check", 30), ("check", 64), ("check", 65.2)],
     [E, E], "stalled"),
    ([("begin", 0), ("check", 6), ("end", 7)], [E, W], "ok"),
    # a failure: failing (the ingest logs the error itself), back once a batch stores
    ([("begin", 0), ("end", 1, "OperationalError: database is locked")], [], "failing"),
    ([("begin", 0), ("end", 1, "x"), ("begin", 2), ("end", 3)], [W], "ok"),
    # a batch with nothing to store (healths held) cannot say it is back
    ([("begin", 0), ("end", 1, "x"), ("begin", 2), ("end", 3, None, False)], [], "failing"),
    # a stall that ends in a failure: its end said, then failing
    ([("begin", 0), ("check", 9), ("end", 10, "x")], [E, W], "failing"),
    # a new batch stalling while failing: stalled wins (what it does now)
    ([("begin", 0), ("end", 1, "x"), ("begin", 2), ("check", 8)], [E], "stalled"),
])
def test_what_the_watch_says_and_its_state(steps, said, state):
    w = StoreWatch("s.db", stall_after_s=5.0, repeat_s=60.0)
    out = []
    for op, t, *err in steps:
        if op == "begin":
            w.begin(t)
        elif op == "end":
            out += w.end(t, *err)
        else:
            out += w.check(t)
    assert [s.level for s in out] == said, out
    assert all("store s.db" in s.text for s in out)
    t_last = steps[-1][1]
    assert w.status(t_last)["state"] == state
    assert bool(w.alert(t_last)) == (state != "ok")


def _birth(t: float) -> bytes:
    return json.dumps({"v": 1, "online": True, "boot": "b1", "t": t}).encode()


def _health(t: float) -> bytes:
    return json.dumps({"v": 1, "t": t, "boot": "b1"}).encode()


@pytest.fixture
def coord(tmp_path):
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                      stale_after_s=2.0, offline_after_s=4.0,
                                      store_stall_s=5.0, alert_clear_s=0.0,
                                      ingest_window_s=0.0))
    mono = [1000.0]
    c.mono = lambda: mono[0]
    yield c, mono, tmp_path / "c.db"
    c.store.close()
    c.shelf.close()


def test_a_hung_store_is_logged_alerted_and_does_not_age_the_fleet(coord, caplog):
    c, mono, path = coord
    t0 = time.time()
    c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0),
               ("edgerun/v1/f/B/state", _birth(t0), t0)])
    c._refresh(t0)
    assert c.views["A"].status == "online" and c.views["B"].status == "online"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the store: the commit waits
    stuck = threading.Thread(target=c._ingest,
                             args=([("edgerun/v1/f/A/health", _health(t0 + 1), t0 + 1)],))
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    try:
        stuck.start()
        assert until(lambda: c.store_watch.status(mono[0])["in_flight_s"] is not None, 10)
        # the device goes on sending; its messages wait in the inbox behind the stuck batch
        assert c._inbox.offer(("edgerun/v1/f/A/health", _health(t0 + 9), t0 + 9)) is None
        mono[0] += 4.0
        c.watch_tick()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        began = time.monotonic()
        c._refresh(t0 + 10)
        # B, silent, goes offline: its alert is not sent from here while the store hangs
        # (the refresh waited for the store's lock, up to its 30 s busy timeout)
        assert time.monotonic() - began < 5.0
        assert c.views["B"].status == "offline"
        mono[0] += 2.0  # 6 s in flight: past store_stall_s
        c.watch_tick()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and str(path) in errors[0] and "6 s" in errors[0], errors
        mono[0] += 30.0
        c.watch_tick()  # once a minute at most
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
        # the fleet at t0 + 10: A's last stored message is 10 s old (stale_after_s 2,
        # offline_after_s 4), but its messages wait in the inbox: it is not silent
        c._refresh(t0 + 10)
        assert c.views["A"].status == "online"  # was: offline, for the store's fault
        view = c.alerts_view()
        assert view["store"]["state"] == "stalled"
        own = [a for a in view["active"] if a["alert"] == "store"]
        assert len(own) == 1 and own[0]["device"] == "coordinator edgerun-coordinator"
        assert "stalled" in own[0]["message"]
        assert c.stats()["store"]["stalls"] == 1
        page = metrics.exposition(metrics.registry(c)).decode()
        assert 'edgerun_coordinator_store_state{state="stalled"} 1.0' in page
        assert "edgerun_coordinator_store_batch_in_flight_seconds 36.0" in page
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        stuck.join(40)
    assert not stuck.is_alive()
    done = [r.getMessage() for r in caplog.records if "completed" in r.getMessage()]
    assert len(done) == 1 and "stored" in done[0], done
    assert c.store_watch.status(mono[0])["state"] == "ok"
    c.watch_tick()  # the alert goes; cleared at the next refresh (alert_clear_s 0)
    c._refresh(time.time())
    assert not [a for a in c.alerts_view()["active"] if a["alert"] == "store"]
    told = [(a["alert"], a["state"]) for a in c.alerting.log if a["alert"] == "store"]
    assert told == [("store", "raised"), ("store", "cleared")], told


def test_a_failing_store_raises_the_store_alert_with_its_cause(coord, caplog):
    c, mono, path = coord
    t0 = time.time()
    c.store._db.execute("PRAGMA busy_timeout = 50")  # a locked store fails at once
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError):
            c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0)])
        c.watch_tick()
        store = c.stats()["store"]
        assert store["state"] == "failing" and "database is locked" in store["cause"]
        own = [a for a in c.alerts_view()["active"] if a["alert"] == "store"]
        assert len(own) == 1 and "failing" in own[0]["message"] \
            and "database is locked" in own[0]["message"], own
        page = metrics.exposition(metrics.registry(c)).decode()
        assert 'edgerun_coordinator_store_state{state="failing"} 1.0' in page
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    mono[0] += 12
    c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0)])
    assert c.stats()["store"]["state"] == "ok"
    assert any("stores again after failing for 12 s" in r.getMessage() for r in caplog.records)


def _status(c: Coordinator, device: str) -> str | None:
    return next((v["status"] for v in c.fleet_view() if v["device"] == device), None)


@pytest.mark.timeout(180)
def test_a_frozen_store_disk_is_seen_and_the_sending_device_stays_online(tmp_path, broker,
                                                                          caplog):
    """The field's case end to end: the coordinator's SQLite store on an ext4 frozen with
    fsfreeze while a device (a raw paho client on the wire format) keeps sending a health
    every 0.2 s. Before: no line at all, the device went stale then offline (an `offline`
    alert) although it was sending, and the first fleet view hung behind the alert's store
    write. Now: an ERROR names the store, the `store` alert is raised, the device stays
    online past offline_after_s, and the thaw is logged. Needs root (a loop mount)."""
    import os
    import subprocess
    from pathlib import Path

    import paho.mqtt.client as mqtt

    if os.geteuid() != 0:
        pytest.skip("mounting an ext4 image and fsfreeze need root")
    mnt, img = tmp_path / "ext4", tmp_path / "ext4.img"
    mnt.mkdir()
    with img.open("wb") as f:
        f.truncate(64 << 20)
    for cmd in (["mkfs.ext4", "-q", "-F", str(img)], ["mount", "-o", "loop", str(img), str(mnt)]):
        got = subprocess.run(cmd, capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"cannot make an ext4 here ({cmd[0]}): {got.stderr.strip()}")
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    c = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                      store=str(mnt / "c.db"), stale_after_s=2.0,
                                      offline_after_s=4.0, store_stall_s=1.0))
    cfg = broker.device("f", "A")
    dev = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id="edgerun-f-A-test", protocol=mqtt.MQTTv311)
    dev.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    stop = threading.Event()
    try:
        _freeze_and_thaw(c, dev, broker.port, mnt, stop, caplog)
    finally:
        stop.set()
        dev.loop_stop()
        dev.disconnect()
        c.stop()
        subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True, check=False)
        subprocess.run(["umount", str(mnt)], check=False)


def _freeze_and_thaw(c: Coordinator, dev, port: int, mnt, stop: threading.Event,
                     caplog) -> None:
    import subprocess

    c.start()
    assert c.connected.wait(30)
    dev.connect("127.0.0.1", port, 30)
    dev.loop_start()
    dev.publish("edgerun/v1/f/A/state", _birth(time.time()), qos=1).wait_for_publish(30)

    def send() -> None:
        while not stop.wait(0.2):
            dev.publish("edgerun/v1/f/A/health", _health(time.time()), qos=1)
    threading.Thread(target=send, daemon=True).start()
    assert until(lambda: _status(c, "A") == "online", 30)
    subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
    try:
        assert until(lambda: c.stats()["store"]["state"] == "stalled", 30)
        t_frozen = time.monotonic()
        assert until(lambda: any(r.levelno == logging.ERROR and str(mnt / "c.db") in
                                 r.getMessage() for r in caplog.records), 30)
        assert until(lambda: any(a["alert"] == "store" for a in c.alerts_view()["active"]),
                     30)
        while time.monotonic() - t_frozen < 6.0:  # past offline_after_s, still sending
            assert _status(c, "A") == "online"  # was: stale, then offline
            time.sleep(0.5)
        assert c._inbox.qsize() > 0  # its messages wait, not stored, not acked
    finally:
        subprocess.run(["fsfreeze", "-u", str(mnt)], check=False)
    assert until(lambda: c.stats()["store"]["state"] == "ok", 30)
    # what the freeze caught in flight completed: a batch ("stored") or, when the freeze
    # caught the fleet refresh first (a race of ~1 in 5 under load), housekeeping ("done");
    # then the messages that waited are stored
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "store" in r.getMessage()]
    # the state reads ok as the watch ends the stall; its line is logged just after
    assert until(lambda: any("completed (stored)" in m or "completed (done)" in m
                             for m in said()), 10), said()
    assert until(lambda: c._inbox.qsize() == 0, 30)
    assert _status(c, "A") == "online"
    assert not [r for r in caplog.records if "-> offline" in r.getMessage()
                or "-> stale" in r.getMessage()]


def test_a_batch_that_stores_nothing_does_not_say_the_failing_store_is_back(coord, caplog):
    """While the store fails, the ingest loop still runs batches that store nothing: every
    0.2 s while healths are held for coalescing (`_ingest([])`), and any batch whose
    messages admission refused. Each ended the watch without an error, so the state flipped
    failing -> ok -> failing, a "stores again" WARNING was logged every time, and the
    `store` alert was cleared while nothing had been stored."""
    c, mono, path = coord
    t0 = time.time()
    c.store._db.execute("PRAGMA busy_timeout = 50")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    try:
        with pytest.raises(sqlite3.OperationalError):
            c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0)])
        mono[0] += 1
        c._ingest([])  # the loop's batch while a health is held
        c._ingest([("edgerun/v1/f/A/state", b"not json", t0)])  # refused by admission
        c.watch_tick()
        assert c.stats()["store"]["state"] == "failing"
        assert not [r for r in caplog.records if "stores again" in r.getMessage()]
        assert [a["alert"] for a in c.alerts_view()["active"]] == ["store"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    mono[0] += 1
    c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0)])  # stored: back
    assert c.stats()["store"]["state"] == "ok"
    assert len([r for r in caplog.records if "stores again" in r.getMessage()]) == 1


def test_the_store_alert_reaches_the_webhook_while_the_store_hangs(tmp_path):
    """The `store` alert is there for when the store hangs, so it goes to the webhook first
    and to the store's alert log after. But the webhook was handed alerts only by the one
    thread that sends (Alerting.send), and that thread was stuck in the store's alert-log
    write of the transition before (a device that went offline meanwhile): the `store`
    alert waited behind it until the store came back, the webhook never heard it in time.
    With several coordinators (share_group) even the first one waited on a store claim."""
    from support.fleet import Receiver

    hook = Receiver([200])
    path = tmp_path / "c.db"
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(path), stale_after_s=2.0,
                                      offline_after_s=4.0, offline_alert_s=0,
                                      store_stall_s=5.0,
                                      alert_clear_s=0.0, ingest_window_s=0.0,
                                      webhook_url=hook.url))
    mono = [1000.0]
    c.mono = lambda: mono[0]
    c.alerting.webhook.start()
    t0 = time.time()
    c._ingest([("edgerun/v1/f/A/state", _birth(t0), t0),
               ("edgerun/v1/f/B/state", _birth(t0), t0)])
    c._refresh(t0)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the store: writes wait
    stuck = threading.Thread(target=c._ingest,
                             args=([("edgerun/v1/f/A/health", _health(t0 + 1), t0 + 1)],))
    try:
        stuck.start()
        assert until(lambda: c.store_watch.status(mono[0])["in_flight_s"] is not None, 10)
        mono[0] += 2.0
        c._refresh(t0 + 10)  # B offline: its alert sent from a thread stuck in the log write
        assert until(lambda: any(b["alert"] == "offline" for b in hook.bodies()), 10)
        mono[0] += 4.0  # 6 s in flight: past store_stall_s
        c.watch_tick()
        assert until(lambda: any(b["alert"] == "store" for b in hook.bodies()), 10), \
            hook.bodies()  # was: only once the store came back (its 30 s busy timeout)
        (sent,) = [b for b in hook.bodies() if b["alert"] == "store"]
        assert sent["state"] == "raised" and "stalled" in sent["message"]
        assert sent["device"] == "coordinator edgerun-coordinator"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        stuck.join(40)
        c.alerting.webhook.stop()
        hook.close()
        c.store.close()
        c.shelf.close()


@pytest.mark.timeout(120)
def test_a_prune_that_hangs_on_the_ingest_thread_is_seen(tmp_path, broker, caplog):
    """The ingest thread also does the housekeeping between batches: the fleet refresh and,
    hourly, the store's prune (a DELETE of a day's rows). A prune that hangs (a frozen disk,
    another writer's lock) held ingest as a hung batch does, yet only batches were watched:
    no ERROR, no `store` alert, the state `ok` while nothing was stored. The prune here waits
    on another connection's write lock; the hour and the stall are stepped on `mono`."""
    path = tmp_path / "c.db"
    c = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                      store=str(path), store_stall_s=5.0))
    mono = [1000.0]
    c.mono = lambda: mono[0]
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        c.start()
        assert c.connected.wait(30)
        time.sleep(1.5)  # the loop's first housekeeping (a prune at start) done
        holder.execute("BEGIN IMMEDIATE")  # the next prune's write waits on it
        mono[0] += 3600.0  # an hour on: the next loop turn prunes, and waits
        time.sleep(1.0)
        mono[0] += 6.0  # 6 s in: past store_stall_s
        assert until(lambda: c.stats()["store"]["state"] == "stalled", 10), c.stats()["store"]
        assert until(lambda: any(r.levelno == logging.ERROR and str(path) in r.getMessage()
                                 for r in caplog.records), 10)
        assert any(a["alert"] == "store" for a in c.alerts_view()["active"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        c.stop()


@pytest.mark.timeout(120)
def test_the_store_alert_clears_when_the_store_answers_in_an_idle_fleet(tmp_path, broker,
                                                                        caplog):
    """A store that failed a batch and then recovered while no device sent anything (a
    quiet fleet, a night): the `store` alert stayed raised, the state `failing`, until the
    next batch that stored something, however long that took. The ingest loop probes a
    failing store (one small write) once nothing told for probe_s, and clears it. The
    failure is a real one (another connection holds the store's write lock); the loop, the
    watchdog and the alerts run as they do in service; `mono` steps the probe's wait."""
    path = tmp_path / "c.db"
    c = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                      store=str(path), store_stall_s=60.0,
                                      alert_clear_s=0.0, ingest_window_s=0.0))
    mono = [1000.0]
    c.mono = lambda: mono[0]
    caplog.set_level(logging.INFO, logger="edgerun.coordinator")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        c.start()
        assert c.connected.wait(30)
        c.store._db.execute("PRAGMA busy_timeout = 50")  # a locked store fails at once
        holder.execute("BEGIN IMMEDIATE")
        t0 = time.time()
        assert c._inbox.offer(("edgerun/v1/f/A/state", _birth(t0), t0)) is None
        assert until(lambda: c.stats()["store"]["state"] == "failing", 10), c.stats()["store"]
        assert until(lambda: [a["alert"] for a in c.alerts_view()["active"]] == ["store"], 10)
        mono[0] += 6.0  # past probe_s, the lock still held: a probe fails, still failing
        time.sleep(1.0)
        assert c.stats()["store"]["state"] == "failing"
        assert not [r for r in caplog.records if "stores again" in r.getMessage()]
        holder.execute("ROLLBACK")  # the store is back; no device sends anything
        mono[0] += 6.0
        assert until(lambda: c.stats()["store"]["state"] == "ok", 10), c.stats()["store"]
        mono[0] += 1.0  # the next refresh clears it (alert_clear_s 0)
        assert until(lambda: not c.alerts_view()["active"], 10), c.alerts_view()["active"]
        def told() -> list[tuple[str, str]]:
            return [(a["alert"], a["state"]) for a in c.alerting.log if a["alert"] == "store"]
        # the transition is logged after the view drops it (CI once read only the raise)
        assert until(lambda: told() == [("store", "raised"), ("store", "cleared")], 10), told()
        assert len([r for r in caplog.records if "stores again" in r.getMessage()]) == 1
        assert c.store.counts() == {}  # cleared by the probe, not by a stored batch
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        c.stop()


def test_the_probe_writes_on_both_backends(store_url):
    """Store.probe commits one row (upserted: a probe every 5 s adds nothing)."""
    from runtime.coordinator.store import Store

    store = Store(store_url)
    try:
        store.probe(1.0)
        store.probe(2.0)
        assert store.read("SELECT device, what, state, t FROM claims") == [
            ("", "store-probe", "ok", 2.0)]
    finally:
        store.close()
