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
