"""Bounded work per message (issue 25, item 2): no thread, timer or command per inbound
message. Table tests of the coalescer, and 300 forged births through a real Mosquitto into a
real coordinator costing a bounded number of threads and commands."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.waiting import until

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.coalesce import Coalescer
from runtime.coordinator.service import Coordinator
from runtime.wire import commands


# (key, value, t, same) offers in order -> what acted at once, then what `due` gives at t_due
@pytest.mark.parametrize("offers, t_due, now_want, due_want", [
    ([("a", 1, 0.0, None)], 10, [1], []),
    # a burst: the first at once, the latest at the window's end, the rest folded
    ([("a", k, k * 0.1, None) for k in range(1, 6)], 1.2, [1], [("a", 5)]),
    ([("a", 1, 0.0, None), ("a", 2, 0.5, None)], 0.9, [1], []),  # window not over yet
    ([("a", 1, 0.0, None), ("b", 2, 0.1, None)], 5, [1, 2], []),  # per key
    ([("a", 1, 0.0, None), ("a", 2, 2.0, None)], 5, [1, 2], []),  # after the window: at once
    # `same` as what acted last: dropped, even after the window (one per boot)
    ([("a", 1, 0.0, "boot1"), ("a", 2, 0.5, "boot1"), ("a", 3, 9.0, "boot1")], 20, [1], []),
    ([("a", 1, 0.0, "boot1"), ("a", 2, 0.5, "boot2")], 1.0, [1], [("a", 2)]),
    # held, its window over, and a newer offer before `due` ran: the newer acts at once and
    # the held one never does (it stayed "waiting" with nothing held, and every later `due`
    # raised: the coordinator's ingest stopped storing, seen under load in the fuzz test)
    ([("a", 1, 0.0, None), ("a", 2, 0.5, None), ("a", 3, 1.5, None)], 5, [1, 3], []),
])
def test_coalescer_table(offers, t_due, now_want, due_want):
    c = Coalescer(window_s=1.0)
    acted = [v for k, v, t, same in offers if c.offer(k, v, t, same)]
    assert acted == now_want
    assert c.due(t_due) == due_want
    c.due(t_due + 100)  # what was still held acts now
    assert c.due(t_due + 200) == [] and c.held() == 0  # each held offer acts once
    assert c.acted + c.coalesced == len(offers)  # every offer acted or was folded


def test_coalescer_forgets_the_oldest_keys_at_its_bound():
    c = Coalescer(window_s=1.0, max_keys=3)
    for k in range(10):
        assert c.offer(f"d{k}", k, 0.0)
    assert c.stats()["keys"] == 3 and c.forgotten == 7
    assert list(c.keys) == ["d7", "d8", "d9"]


def _birth(boot: str) -> dict:
    return {"v": 1, "online": True, "boot": boot, "t": time.time(),
            "versions": {"edgerun": "1.0"}, "reason": ""}


@pytest.mark.timeout(240)  # 32 s on a loaded 2-core box (docs/testing-timing.md)
def test_300_forged_births_cost_a_bounded_number_of_threads_and_commands(broker, tmp_path):
    key = tmp_path / "command.pem"
    commands.generate_keypair(key, tmp_path / "command.pub")
    coord = Coordinator(CoordinatorConfig(
        fleet="f", broker=broker.coordinator("f"), store=str(tmp_path / "c.db"),
        signing_key=str(key), resend_window_s=1.0))
    # the coordinator's monotonic clock, stepped forward to expire the awaited replies
    # (30 s each) instead of waiting them out
    shift = [0.0]
    coord.mono = lambda: time.monotonic() + shift[0]
    cfg = broker.device("f", "A")
    got: list[dict] = []
    dev = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id="edgerun-f-A-test", protocol=mqtt.MQTTv311)
    dev.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    dev.on_message = lambda c, u, m: got.append(json.loads(m.payload))
    subscribed = threading.Event()
    dev.on_subscribe = lambda *a: subscribed.set()
    dev.on_connect = lambda c, *a: c.subscribe("edgerun/v1/f/A/cmd", 1)
    coord.start()
    try:
        assert coord.connected.wait(30)
        dev.connect("127.0.0.1", broker.port, 30)
        dev.loop_start()
        assert subscribed.wait(30)
        coord.rollouts.record_setting("A", "set_rate", {"fps": 5})  # its desired setting
        dev.publish("edgerun/v1/f/A/state", json.dumps(_birth("boot0")), qos=1
                    ).wait_for_publish(30)
        assert until(lambda: coord.counters["commands_sent_async"] == 1, 30)  # re-sent
        threads_before = threading.active_count()
        t0 = time.monotonic()
        for k in range(300):  # forged births, each a new boot, as fast as paho sends them
            dev.publish("edgerun/v1/f/A/state", json.dumps(_birth(f"forged{k}")), qos=1)
        assert until(lambda: coord.counters["state"] == 301, 60)
        burst_s = time.monotonic() - t0
        peak_threads = threading.active_count()
        # the burst's latest birth is answered once its window is over, then nothing more
        assert until(lambda: coord.queues()["births"]["held"] == 0, 30)
        # the latest birth's re-send follows its window's end (the queue empties first)
        assert until(lambda: coord.counters["commands_sent_async"] >= 2, 30)
        time.sleep(1.5)  # a window more: any further re-send would have been made by now
        sent = coord.counters["commands_sent_async"]
        # one re-send a window at most: boot0's, then at most one per window the burst
        # spanned, the last being the latest birth's (was: 300 commands)
        assert 2 <= sent <= 2 + int(burst_s / 1.0), (sent, burst_s)
        assert until(lambda: len(got) == sent, 30)
        assert all(c["cmd"] == "set_rate" and c["args"] == {"fps": 5} for c in got)
        assert peak_threads <= threads_before + 1  # was +300 (a thread a birth, 30 s each)
        assert threading.active_count() <= threads_before + 1
        q = coord.queues()
        assert q["births"]["coalesced"] >= 300 - (sent - 1)
        assert q["pending_replies"]["size"] <= sent  # nobody answers: awaited, bounded
        shift[0] += 31.0  # past the replies' 30 s: expired at the next housekeeping
        assert until(lambda: coord.queues()["pending_replies"]["size"] == 0, 10)
        # the latest boot again, its window over: answered already, so nothing is sent
        before = q["births"]["coalesced"]
        dev.publish("edgerun/v1/f/A/state", json.dumps(_birth("forged299")), qos=1
                    ).wait_for_publish(30)
        assert until(lambda: coord.queues()["births"]["coalesced"] == before + 1, 30)
        assert coord.counters["commands_sent_async"] == sent
        assert coord.stats()["queues"]["inbox"]["max"] == 50_000
    finally:
        dev.loop_stop()
        dev.disconnect()
        coord.stop()


def test_flush_takes_the_held_offers_of_the_keys_it_selects_now():
    """A device's state flushes what it said before (a held health must not act after the
    device went to sleep and make it look awake)."""
    c = Coalescer(window_s=1.0)
    assert c.offer(("d", 1), "h1", 0.0) and c.offer(("e", 1), "x1", 0.0)
    assert not c.offer(("d", 1), "h2", 0.2) and not c.offer(("e", 1), "x2", 0.2)
    assert c.flush(lambda k: k[0] == "d") == [(("d", 1), "h2")]
    assert c.held() == 1 and c.due(5.0) == [(("e", 1), "x2")]
    assert c.flush(lambda k: True) == [] and c.acted + c.coalesced == 4


def test_pending_replies_are_bounded_and_expire():
    from runtime.coordinator.replies import Awaited, PendingReplies

    p = PendingReplies(max_size=3)
    for k in range(5):
        p.add(f"c{k}", Awaited("d", "set_rate", {"fps": k}, until=10.0 + k))
    assert len(p) == 3 and p.dropped == 2 and p.get("c0") is None  # the oldest forgotten
    assert p.pop("c3").args == {"fps": 3} and p.pop("c3") is None  # its reply came
    assert p.expire(12.0) == 1 and p.expired == 1 and p.get("c2") is None
    assert p.get("c4").until == 14.0 and p.expire(14.0) == 1 and len(p) == 0


def test_a_device_message_over_every_payload_limit_never_reaches_the_coordinator(broker,
                                                                                 tmp_path):
    """The broker config sets no packet limit (Mosquitto's default is 256 MB), so device A,
    on its own result topic, made the coordinator receive and hold 60 MB messages (its RSS
    96 -> 302 MB for three of them) only to quarantine each one unparsed. The coordinator
    now declares an MQTT 5 Maximum Packet Size just over the largest payload it admits
    (payloads.MAX_PACKET): the broker drops larger ones for it. A small refused message
    after it still arrives, so the big one, sent first on the same topic, was dropped."""
    from runtime.wire import payloads

    coord = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                          store=str(tmp_path / "c.db")))
    cfg = broker.device("f", "A")
    dev = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id="edgerun-f-A-test", protocol=mqtt.MQTTv5)
    dev.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    coord.start()
    try:
        assert coord.connected.wait(30)
        dev.connect("127.0.0.1", broker.port, 30)
        dev.loop_start()
        big = b'{"v": 1, "x": "' + b"a" * (2 * payloads.MAX_PACKET) + b'"}'
        dev.publish("edgerun/v1/f/A/result", big, qos=1).wait_for_publish(30)
        dev.publish("edgerun/v1/f/A/result", b"{}", qos=1).wait_for_publish(30)
        assert until(lambda: coord.store.quarantine_counts().get("A", 0) >= 1, 30)
        time.sleep(0.5)  # anything else on its way lands too
        reasons = [q["reason"] for q in coord.store.quarantined("A")]
        assert len(reasons) == 1 and "exceeds" not in reasons[0], reasons
    finally:
        dev.loop_stop()
        dev.disconnect()
        coord.stop()
