"""The shared MQTT connection thread (runtime/wire/mqtt.py) when the link drops under it."""

from __future__ import annotations

import logging
import time

from runtime.wire.mqtt import Connection


def test_a_publish_that_finds_the_link_gone_reconnects_without_a_traceback(broker, caplog):
    """A publish racing a dropped link (a broker restart, a session taken over) raises
    ConnectionError out of on_tick; the catch-all logged it with log.exception, so every
    such blip put an ERROR and a traceback in the journal. It is the network, not a bug: a
    warning line, and the connection comes back."""
    ticks = {"n": 0}

    def tick(client):
        ticks["n"] += 1
        if ticks["n"] == 5:
            raise ConnectionError("The connection was lost.")

    conn = Connection(broker.client("probe"), "probe", name="probe", on_tick=tick)
    with caplog.at_level(logging.WARNING, logger="edgerun.mqtt"):
        conn.start()
        try:
            deadline = time.monotonic() + 20
            while conn.stats.connects < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            conn.stop()
    assert conn.stats.connects >= 2  # reconnected
    mine = [r for r in caplog.records if "connection was lost" in r.getMessage()]
    assert mine and all(r.exc_info is None and r.levelno == logging.WARNING for r in mine)


def test_a_queued_message_goes_out_at_once_not_at_the_idle_tick(broker, monkeypatch):
    """The thread sleeps between network events (a 10 ms poll took the GIL 100 times a
    second, and a frame in flight waited for it): `publish` and `stop` must wake it. With an
    idle tick of a minute, a message still arrives and stop returns within seconds."""
    monkeypatch.setattr(Connection, "IDLE_TICK_S", 60.0)
    got: list[bytes] = []
    rx = Connection(broker.client("rx", read=("t/#",)), "rx", name="rx",
                    subscriptions=[("t/#", 1)],
                    on_message=lambda client, msg: got.append(msg.payload))
    tx = Connection(broker.client("tx", write=("t/#",)), "tx", name="tx")
    rx.start()
    tx.start()
    try:
        assert rx.subscribed.wait(20) and tx.connected.wait(20)
        for k in range(3):  # each one wakes the sleeping thread, not only the first
            tx.publish(f"t/{k}", f"m{k}".encode())
            deadline = time.monotonic() + 10
            while len(got) <= k and time.monotonic() < deadline:
                time.sleep(0.01)
            assert got == [f"m{i}".encode() for i in range(k + 1)]
    finally:
        t0 = time.monotonic()
        tx.stop()
        rx.stop()
        stopped_s = time.monotonic() - t0
    assert stopped_s < 10  # not the 60 s tick
    assert not tx.alive() and not rx.alive()
    tx.wake()  # after the thread ended: nothing to wake, no error


def test_on_tick_runs_when_woken(broker, monkeypatch):
    """What on_tick polls for (the publisher's outbox rows) arrives from other threads:
    `wake` runs it now rather than at the next idle tick."""
    monkeypatch.setattr(Connection, "IDLE_TICK_S", 60.0)
    ticks = {"n": 0}
    conn = Connection(broker.client("probe"), "probe", name="probe",
                      on_tick=lambda client: ticks.__setitem__("n", ticks["n"] + 1))
    conn.wake()  # before start: nothing to wake, no error
    conn.start()
    try:
        assert conn.connected.wait(20)
        time.sleep(0.3)  # the CONNACK's own wake-ups pass
        before = ticks["n"]
        for _ in range(3):
            conn.wake()
            deadline = time.monotonic() + 10
            while ticks["n"] == before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ticks["n"] > before
            before = ticks["n"]
    finally:
        conn.stop()


def test_a_full_send_buffer_sleeps_instead_of_spinning(monkeypatch):
    """While paho has bytes to write (want_write) and the socket's send buffer is full (a slow
    uplink after an outage), one pass must wait for the socket to take more, not return at
    once: it skipped the select then, and the thread went round again and again (327,188
    passes in 0.2 s, a review found), holding the GIL the frames need."""
    import socket

    from runtime.config.telemetry import BrokerConfig

    monkeypatch.setattr(Connection, "IDLE_TICK_S", 0.2)
    full, peer = socket.socketpair()
    full.setblocking(False)
    try:
        while True:
            full.send(b"x" * 65536)
    except BlockingIOError:
        pass
    passes = []

    class Client:  # paho's surface that a pass uses
        def socket(self):
            return full

        def want_write(self):
            return True

        def loop(self, timeout):
            passes.append(timeout)
            return 0

    conn = Connection(BrokerConfig(host="127.0.0.1", port=1), "c", name="c")
    conn._wake_r, conn._wake_w = socket.socketpair()
    try:
        t0 = time.monotonic()
        conn._loop(Client())
        assert time.monotonic() - t0 >= 0.15  # slept on the socket (up to the idle tick)
        assert passes == [0]
        peer.recv(1 << 20)  # the uplink drains: the next pass writes
        conn._loop(Client())
        assert passes == [0, 0]
    finally:
        for s in (full, peer, conn._wake_r, conn._wake_w):
            s.close()


def test_a_broker_that_stops_is_said_as_a_lost_connection(broker, caplog):
    """A broker restarted under a daemon (found in a field run, 2026-12-07) was logged as
    `disconnected from the broker (Unspecified error)`: paho's reason for a socket that
    closed without a DISCONNECT packet. The operator reads what happened instead: the
    connection was lost, no word from the broker; a DISCONNECT the broker sends keeps its
    reason (a session taken over)."""
    conn = Connection(broker.client("probe"), "probe", name="probe")
    with caplog.at_level(logging.WARNING, logger="edgerun.mqtt"):
        conn.start()
        try:
            deadline = time.monotonic() + 20
            while not conn.connected.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert conn.connected.is_set()
            broker.stop()  # SIGTERM: Mosquitto 2.0 closes the socket, no DISCONNECT
            while conn.connected.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
            broker.start()
        finally:
            conn.stop()
    said = [r.getMessage() for r in caplog.records if "probe: " in r.getMessage()]
    lost = [m for m in said if "connection to the broker was lost" in m]
    assert lost and "Unspecified error" not in lost[0], said
