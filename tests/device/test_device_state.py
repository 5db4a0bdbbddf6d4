"""One frozen DeviceState per control tick (issue 37, item 1; runtime/device/state.py): the
readers take only the snapshot, the snapshot cannot change, and readers on other threads see
whole snapshots while the main loop changes the daemon."""

from __future__ import annotations

import dataclasses
import threading
import time
import typing

import pytest
from support.daemon_harness import write_config

from models import bundled
from runtime.config import load
from runtime.device.health import health
from runtime.device.state import DeviceState, freeze, thaw
from runtime.device.status import birth, ha_info, status_line
from runtime.wire import payloads


@pytest.mark.parametrize("reader", [health, status_line, birth, ha_info])
def test_every_reader_takes_one_snapshot_and_nothing_else(reader):
    """Health, the STATUS= line, birth and Home Assistant are functions of a DeviceState
    alone (the local API, /metrics, Sparkplug and OPC UA read health's message)."""
    hints = typing.get_type_hints(reader)
    params = [p for p in hints if p != "return"]
    assert [hints[p] for p in params] == [DeviceState]


def test_a_snapshot_and_its_reports_cannot_be_changed():
    frozen = freeze({"a": [1, {"b": [2, 3]}], "c": None})
    with pytest.raises(TypeError):
        frozen["a"] = 0
    with pytest.raises(TypeError):
        frozen["a"][1]["b"] = ()
    assert isinstance(frozen["a"][1]["b"], tuple)
    assert thaw(frozen) == {"a": [1, {"b": [2, 3]}], "c": None}
    thawed = thaw(frozen)
    thawed["a"][1]["b"].append(4)  # a reader's copy is its own
    assert frozen["a"][1]["b"] == (2, 3)
    assert DeviceState.__dataclass_params__.frozen
    s = DeviceState(*[None] * len(dataclasses.fields(DeviceState)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rung = 2  # type: ignore[misc]


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_readers_on_other_threads_see_whole_snapshots_while_the_daemon_changes(tmp_path):
    """A reader thread (as the HTTP, MQTT and OPC UA threads do) reads the latest snapshot
    over and over while the main thread changes the daemon's live fields (the operator's rate
    cap and the pipeline's together, the rung) and swaps snapshots in: every message is one
    snapshot's (the two caps agree, the accuracy is the rung's), and deriving it again later,
    after the daemon moved on, gives the same message."""
    from runtime.device.daemon import Daemon

    d = Daemon(load(write_config(tmp_path, tmp_path / "cache")))
    d.start()
    try:
        rungs = list(d.serving.box.model.rungs)
        # a change of the live fields without a new snapshot is not seen
        before = d.latest_health()
        d.operator.rate_hz = d.pipeline.rate_cap_hz = 99.0
        assert d.latest_health() == before
        assert d.refresh_state().operator_rate_hz == 99.0
        # a tick's snapshot keeps the costly reports (backlog, pipeline) of the last health's;
        # a health message takes them afresh
        kept = d.state
        assert d.refresh_state().backlog is kept.backlog
        fresh = d.refresh_state(reports=True)
        assert fresh.backlog is not kept.backlog and fresh.pipeline is not kept.pipeline

        stop = threading.Event()
        seen: list = [None, 0]  # the last snapshot read (held, so `is` is exact), changes
        problems: list[str] = []

        def read() -> None:
            while not stop.is_set():
                s = d.state
                h = health(s)
                line, b = status_line(s), birth(s)
                if h["operator_rate_hz"] != h["rate_cap_hz"]:
                    problems.append(f"caps {h['operator_rate_hz']} vs {h['rate_cap_hz']}")
                if h["accuracy"] != rungs[h["rung"] - 1].accuracy:
                    problems.append(f"accuracy {h['accuracy']} not rung {h['rung']}'s")
                if f"rung {h['rung']}/{h['rungs']}" not in line or b["choice"] != h["choice"]:
                    problems.append(f"status {line!r} / birth {b} vs health {h['rung']}")
                if health(s) != h:
                    problems.append("the same snapshot gave another message")
                if s is not seen[0]:
                    seen[:] = [s, seen[1] + 1]

        reader = threading.Thread(target=read)
        reader.start()
        try:
            k = 0
            while seen[1] < 50 and k < 20_000:  # the main loop: change the live fields, swap
                k += 1
                d.operator.rate_hz = d.pipeline.rate_cap_hz = float(k % 7 + 1)
                d.serving.box.model.current = k % len(rungs)
                if k % 50 == 0:
                    d.control_tick()  # real ticks too (they set the cap again)
                    d.pipeline.rate_cap_hz = d.operator.rate_hz
                d.refresh_state()
                time.sleep(0)  # the reader's turn (the GIL), as a busy main loop gives it
        finally:
            stop.set()
            reader.join()
        assert not problems, problems[:5]
        assert seen[1] >= 50  # the reader saw the snapshots change under it
    finally:
        d.stop()


def test_an_integration_is_said_stopped_once_when_its_thread_dies():
    """`stopped` compares two snapshots' integrations: alive then dead, once; never on the
    first snapshot, nor for one that was never alive (not started yet)."""
    from runtime.device.state import stopped

    blank = DeviceState(*[None] * len(dataclasses.fields(DeviceState)))

    def at(**alive: bool) -> DeviceState:
        return dataclasses.replace(blank, integrations=alive)

    assert stopped(None, at(opcua=False)) == []
    assert stopped(at(opcua=True, modbus=True), at(opcua=False, modbus=True)) == ["opcua"]
    assert stopped(at(opcua=False), at(opcua=False)) == []  # said at the first change only
    assert stopped(at(sparkplug=False), at(sparkplug=False, modbus=False)) == []
    assert stopped(at(sparkplug=True), at(sparkplug=True)) == []


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_dead_plc_server_shows_in_health_and_says_so_once(tmp_path):
    """A real daemon with [modbus] on loopback: health's `integrations` says the server runs;
    once its thread is gone (stopped under the daemon, as a crash would leave it) the next
    snapshot shows it false, one `integration_stopped` event says so, and the daemon runs on."""
    pytest.importorskip("pymodbus", reason="the modbus extra is not installed")
    from runtime.device.daemon import Daemon

    cfg = write_config(tmp_path, tmp_path / "cache",
                       source='kind = "synthetic"\ntrigger = "modbus"',
                       extra='[modbus]\nenabled = true\nport = 0\n')
    d = Daemon(load(cfg))
    d.start()
    said: list = []
    event = d.event
    d.event = lambda kind, *a, **kw: (said.append((kind, kw)), event(kind, *a, **kw))[1]
    try:
        assert d.health()["integrations"] == {"modbus": True}
        d.links.plc.servers[0].stop()
        h = d.health()
        assert h["integrations"] == {"modbus": False}
        payloads.check("health", h)  # what a coordinator validates with admits it
        d.refresh_state()
        assert [s for s in said if s[0] == "integration_stopped"] == [
            ("integration_stopped", {"integration": "modbus"})]
        d.control_tick()  # runs on
    finally:
        d.stop()
