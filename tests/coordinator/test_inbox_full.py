"""A full inbox never blocks the coordinator's MQTT thread (runtime/coordinator/inbox.py).

The inbox's share per device keeps one identity from filling it alone, but 50,000 places are
filled by 25 flooding identities, or by a fleet's ordinary traffic while the store hangs. Then
`_on_message` blocked up to 1 s on each message (`put(timeout=1.0)`): every device's traffic
waited behind the flood in the broker's socket, and the coordinator's keepalive went
unanswered. Here one identity fills a small inbox with no share (what 25 do to the real one),
a real Mosquitto carries the flood, and the ingest thread is held by another connection's
write lock on the SQLite store, as a hung disk would hold it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.waiting import until

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.inbox import KEPT_EACH, Inbox
from runtime.coordinator.service import Coordinator

SIZE = 400  # the inbox here: one identity fills it in well under a second
RATE = 2000  # the flood's messages a second


def _client(broker, device: str) -> mqtt.Client:
    cfg = broker.device("f", device)
    c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                    client_id=f"edgerun-f-{device}-test", protocol=mqtt.MQTTv311)
    c.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    c.connect("127.0.0.1", broker.port, 30)
    c.loop_start()
    return c


def _birth(t: float) -> bytes:
    return json.dumps({"v": 1, "online": True, "boot": "b1", "t": t}).encode()


@pytest.mark.timeout(120)
def test_a_flood_into_a_full_inbox_does_not_stall_another_device(tmp_path, broker):
    path = tmp_path / "c.db"
    c = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                      store=str(path), ingest_window_s=0.0))
    c._inbox = Inbox(maxsize=SIZE, per_device=10 * SIZE)  # one identity can fill it
    stop = threading.Event()
    holder = sqlite3.connect(path, isolation_level=None)
    evil = good = None
    try:
        c.start()
        assert c.connected.wait(30)
        holder.execute("BEGIN IMMEDIATE")  # the ingest thread's next commit waits on it
        evil, good = _client(broker, "evil"), _client(broker, "good")

        def flood() -> None:
            # 2,000 messages a second, far past what ingest takes while held (none), within
            # what the MQTT thread reads: a flood faster than that piles up in the broker's
            # socket whatever the coordinator does (test_inbox_share.py)
            n, t0 = 0, time.monotonic()
            while not stop.is_set():
                for _ in range(100):
                    evil.publish("edgerun/v1/f/evil/result", b"{not json %d" % n)
                    n += 1
                stop.wait(max(0.0, t0 + n / RATE - time.monotonic()))
        threading.Thread(target=flood, name="flood", daemon=True).start()
        # full: the flood is refused (before: after holding the MQTT thread 1 s)
        assert until(lambda: c.counters["inbox_full_dropped"] > 0, 30), c._inbox.qsize()
        # the well-behaved device: its birth (kept in the reserve however full the inbox),
        # then a health every 0.5 s (periodic: refused while the inbox is full); latency is
        # from its publish to the MQTT thread taking it off the wire
        t = time.time()
        good.publish("edgerun/v1/f/good/state", _birth(t), qos=1)
        assert until(lambda: c._inbox.waiting().get("good", 0.0) >= t, 5)  # was: refused
        lat = [time.time() - t]
        for i in range(12):
            t = time.time()
            good.publish("edgerun/v1/f/good/health",
                         json.dumps({"v": 1, "t": t, "boot": "b1"}).encode(), qos=1)
            # was: none in 5 s (each flood message held the MQTT thread up to 1 s)
            assert until(lambda i=i: c._inbox.dropped_full["good"] > i, 5), (
                f"health {i} not taken off the wire in 5 s: {c.stats()['queues']['inbox']}")
            lat.append(time.time() - t)
            stop.wait(max(0.0, t + 0.5 - time.time()))
        full = c.stats()["queues"]["inbox"]
        print("latency s:", [round(x, 3) for x in lat])
        assert max(lat) < 2.0, [round(x, 2) for x in lat]
        # the refusals are charged to the identity that filled the inbox, and counted
        assert max(full["filled_by"], key=full["filled_by"].get) == "evil", full
        assert full["dropped_full"] > 0 and c.counters["inbox_full_dropped"] > 0, full
        assert c._conn.stats.connects == 1  # the keepalive was answered throughout
    finally:
        stop.set()
        holder.execute("ROLLBACK")
        holder.close()
        for d in (evil, good):
            if d is not None:
                d.loop_stop()
                d.disconnect()
    try:
        # the stall over, the good device's birth is stored: it is online
        assert until(lambda: any(v["device"] == "good" and v["status"] == "online"
                                 for v in c.fleet_view()), 60)
    finally:
        c.stop()


def _offer(box: Inbox, device: str, kind: str = "result", t: float = 0.0) -> str | None:
    return box.offer((f"edgerun/v1/f/{device}/{kind}", b"{}", t))


def test_a_full_inbox_charges_who_holds_most_now_not_who_did():
    """`filled_by` names the device holding most of the inbox when a message finds no room.
    The top holder is looked up again once the one found last holds nothing: a flooder
    whose messages were all taken must not be charged with the next device's flood."""
    box = Inbox(maxsize=10, per_device=100, reserve=0)
    assert all(_offer(box, "A") is None for _ in range(10))
    assert _offer(box, "C") == "full"
    while box.qsize():
        box.get_nowait()
    assert all(_offer(box, "B") is None for _ in range(10))
    assert _offer(box, "C") == "full"
    assert box.full_stats()["filled_by"] == {"A": 1, "B": 1}
    assert box.dropped_full == {"C": 2}


def test_waiting_names_only_devices_with_messages_in_the_inbox():
    """`waiting` (a device with messages waiting is not silent: Coordinator._refresh) says
    when each sender's newest waiting message was received, and forgets a sender once its
    messages are taken: a device gone silent must not be counted heard from the inbox."""
    box = Inbox(maxsize=10, per_device=100, reserve=0)
    _offer(box, "A", t=5.0)
    _offer(box, "A", t=7.0)
    _offer(box, "B", t=6.0)
    assert box.waiting() == {"A": 7.0, "B": 6.0}
    box.get_nowait()
    box.get_nowait()
    assert box.waiting() == {"B": 6.0}
    box.get_nowait()
    assert box.waiting() == {} and box.held == {}


def test_a_busy_device_keeps_its_birth_event_and_reply_in_the_reserve():
    """The reserve is for births, replies and events while the inbox is full, the case of
    a store that hangs under a fleet's ordinary traffic. Then every device sending results
    holds many in the inbox, and the reserve was refused to any sender holding KEPT_EACH
    messages of any kind: a busy device's birth after a reboot, its command reply, its
    event of a full disk were dropped (acked by the broker: lost). What a sender may hold
    in the reserve is now counted in those kinds only: a busy device spends it, a device
    flooding births or events still cannot."""
    box = Inbox(maxsize=40, per_device=100, reserve=20)
    assert all(_offer(box, "busy") is None for _ in range(20))  # its results: 20 waiting
    assert _offer(box, "busy") == "full"  # a result: not in the reserve
    for kind_ in ("state", "event", "cmd/reply"):
        assert _offer(box, "busy", kind_) is None, kind_  # was: "full" (it held 20)
    for _ in range(KEPT_EACH):
        assert _offer(box, "flooder", "event") is None
    assert _offer(box, "flooder", "state") == "full"  # KEPT_EACH of its own waiting
    assert box.qsize() == 20 + 3 + KEPT_EACH
    while box.qsize():
        box.get_nowait()
    assert box.held == {} and box.waiting() == {}
    assert _offer(box, "flooder", "state") is None  # taken: it may again
