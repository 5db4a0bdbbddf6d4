"""The Sparkplug edge node (runtime/telemetry/sparkplug/node.py) against a real Mosquitto
(auth and the fleet ACL on: it logs in as the device's `+sparkplug` identity), decoded by an
independent host (tests/support/sparkplug_host.py) that checks seq continuity, NDEATH's
bdSeq, and births before data on every message."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.sparkplug_host import Host, state, value
from support.waiting import wait

from runtime.config.sparkplug import SparkplugConfig
from runtime.config.telemetry import OutboxConfig, TelemetryConfig
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.sparkplug import sparkplug_b_pb2 as pb
from runtime.telemetry.sparkplug.node import SparkplugNode

HEALTH = {"model": "inspection", "choice": "inspection/fp32@onnxruntime:CPU/t1", "rung": 1,
          "rungs": 2, "temp_c": 50.0, "pipeline": {"results": 0, "latency_ms": {"p95": 3.0},
                                                    "sources": {"cam1": {"state": "running"}}},
          "slo": {"target_ms": 20.0}, "backlog": {"results_held": 0, "evicted_total": 0}}


class Scada:
    """A host application's connection: sees spBv1.0/#, publishes STATE and commands;
    subscribes again after every reconnect (the broker is restarted under it)."""

    def __init__(self, broker, host_id: str = "scada"):
        cfg = broker.client(host_id, read=("spBv1.0/#",),
                            write=(f"spBv1.0/STATE/{host_id}", "spBv1.0/f1/NCMD/d1",
                                   "spBv1.0/f1/DCMD/d1/cam1"))
        self.host, self.host_id = Host(), host_id
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             protocol=mqtt.MQTTv311)
        self.c.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
        self.c.reconnect_delay_set(0.1, 0.5)
        self.subscribed = 0
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe("spBv1.0/#", 1)
        self.c.on_subscribe = lambda *a: setattr(self, "subscribed", self.subscribed + 1)
        self.c.on_message = lambda c, u, m: self.host.on_message(m.topic, m.payload)
        self.c.connect("127.0.0.1", broker.port, 30)
        self.c.loop_start()
        wait(lambda: self.subscribed, 30, "the host's SUBACK")

    def state(self, online: bool, ts_ms: int) -> None:
        self.c.publish(f"spBv1.0/STATE/{self.host_id}", state(online, ts_ms), qos=1,
                       retain=True).wait_for_publish(10)

    def command(self, topic: str, raw: bytes) -> None:
        self.c.publish(topic, raw, qos=1).wait_for_publish(10)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def _node(broker, tmp_path, events: list, **cfg) -> tuple[SparkplugNode, Outbox]:
    tel = TelemetryConfig(fleet="f1", device="d1", broker=broker.device("f1", "d1"))
    outbox = Outbox(OutboxConfig(path=str(tmp_path / "outbox.db")))
    node = SparkplugNode(replace(SparkplugConfig(enabled=True), **cfg), tel, "d1", outbox,
                         tmp_path, lambda t, sev, **f: events.append((t, f)))
    node.feed(HEALTH)
    return node, outbox


def _result(i: int, t: float, label: str = "ok") -> dict:
    return {"t": t, "source": "cam1", "label": label, "score": 0.5 + i / 1000,
            "model": "inspection"}


def _rebirth(flag: bool = True, datatype: int = 11) -> bytes:
    p = pb.Payload(timestamp=1, seq=0)
    m = p.metrics.add(name="Node Control/Rebirth", datatype=datatype)
    m.boolean_value = flag
    return p.SerializeToString()


def test_births_data_rebirth_outage_history_and_death(broker, tmp_path):
    scada = Scada(broker)
    events: list = []
    node, outbox = _node(broker, tmp_path, events)
    h = scada.host
    node.start()
    try:
        wait(lambda: h.of("DBIRTH", "cam1"), 30, "NBIRTH and DBIRTH")
        nbirth = h.of("NBIRTH")[0].metrics()
        assert value(nbirth["Inference/Model"]) == "inspection"
        assert nbirth["Thermal/Die Temperature C"].datatype == pb.DataType.Value("Double")
        bd0 = value(nbirth["bdSeq"])
        # live results: one DDATA each, by exception
        outbox.append_many([_result(i, time.time(), "ok" if i % 2 else "scratch")
                            for i in range(5)])
        wait(lambda: len(h.of("DDATA", "cam1")) >= 5, 30, "5 DDATA")
        last = h.of("DDATA", "cam1")[-1].metrics()
        assert value(last["Counts/Results"]) == 5 and not last["Counts/Results"].is_historical
        # bad commands: refused with an event, no birth
        births = len(h.of("NBIRTH"))
        scada.command("spBv1.0/f1/NCMD/d1", _rebirth(datatype=12))
        scada.command("spBv1.0/f1/NCMD/d1", b"\x00" * 5000)
        scada.command("spBv1.0/f1/DCMD/d1/cam1", _rebirth())
        wait(lambda: node.stats.commands_refused == 3, 30, "3 refusals")
        assert [f["message"] for t, f in events if t == "sparkplug_refused"] == ["NCMD", "DCMD"]
        assert len(h.of("NBIRTH")) == births
        # a good rebirth: NBIRTH again, same bdSeq (same connection)
        scada.command("spBv1.0/f1/NCMD/d1", _rebirth())
        wait(lambda: len(h.of("NBIRTH")) == births + 1, 30, "the rebirth")
        assert value(h.of("NBIRTH")[-1].metrics()["bdSeq"]) == bd0
        # the broker goes away; results stored meanwhile come back as history
        broker.stop()
        t_gone = time.time()
        outbox.append_many([_result(100 + i, t_gone + i / 100) for i in range(3)])
        broker.start()
        wait(lambda: sum(1 for m in h.of("DDATA", "cam1")
                         if m.metrics().get("Counts/Results")
                         and m.metrics()["Counts/Results"].is_historical) == 3, 60,
             "3 historical DDATA after the outage")
        bd1 = value(h.of("NBIRTH")[-1].metrics()["bdSeq"])
        assert bd1 != bd0  # a new connection, a new bdSeq (one per connect attempt)
        hist = [m.metrics() for m in h.of("DDATA", "cam1")
                if m.metrics().get("Last Result/Time") is not None
                and m.metrics()["Last Result/Time"].is_historical]
        assert [value(m["Last Result/Time"]) for m in hist] == [
            round((t_gone + i / 100) * 1000) for i in range(3)]  # their own timestamps
        assert all(m["Last Result/Score"].timestamp == value(m["Last Result/Time"])
                   for m in hist)
        deaths = len(h.of("NDEATH"))  # the broker's stop published the will of bd0 already
    finally:
        node.stop()
    # the stop's own NDEATH, not the will the broker's restart sent (under load it may come
    # after that one is already here: waiting for "any NDEATH" read the old one)
    wait(lambda: len(h.of("NDEATH")) > deaths, 30, "NDEATH at stop")
    assert value(h.of("NDEATH")[-1].metrics()["bdSeq"]) == bd1
    scada.close()
    outbox.close()
    assert h.violations == []
    # the bdSeq is kept: the next process's first connection is another one
    assert (tmp_path / "sparkplug-bdseq").read_text().strip() == str(bd1)


def test_the_will_is_the_ndeath_of_the_births_bdseq(broker, tmp_path):
    scada = Scada(broker)
    node, outbox = _node(broker, tmp_path, [])
    h = scada.host
    node.start()
    try:
        wait(lambda: h.of("NBIRTH"), 30, "NBIRTH")
        bd = value(h.of("NBIRTH")[-1].metrics()["bdSeq"])
        broker.stop()  # the broker goes (Mosquitto sends the wills as it stops) ...
        broker.start()
        wait(lambda: len(h.of("NBIRTH")) == 2, 60, "births after the restart")
        bd1 = value(h.of("NBIRTH")[-1].metrics()["bdSeq"])
        assert bd1 != bd
        # ... and when another client takes the node's session, the broker sends its will
        deaths = len(h.of("NDEATH"))
        other = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                            client_id="f1/d1+sparkplug", protocol=mqtt.MQTTv311)
        cfg = broker.device("f1", "d1")
        other.username_pw_set("f1/d1+sparkplug", Path(cfg.password_file).read_text().strip())
        other.connect("127.0.0.1", broker.port, 30)
        other.loop_start()
        wait(lambda: len(h.of("NDEATH")) > deaths, 30, "the will (NDEATH) on takeover")
        other.loop_stop()
        other.disconnect()
        assert value(h.of("NDEATH")[-1].metrics()["bdSeq"]) == bd1
        wait(lambda: len(h.of("NBIRTH")) == 3, 60, "the node born again")
    finally:
        node.stop()
        scada.close()
        outbox.close()
    assert h.violations == []


def test_primary_host_state_holds_data_and_flapping_is_bounded(broker, tmp_path):
    scada = Scada(broker)
    events: list = []
    node, outbox = _node(broker, tmp_path, events, primary_host_id="scada",
                         max_births_per_minute=3)
    h = scada.host
    scada.state(False, 1000)
    node.start()
    try:
        outbox.append_many([_result(i, time.time()) for i in range(2)])
        wait(lambda: node.stats.phase == "waiting_host", 30, "waiting for the host")
        time.sleep(0.5)
        assert h.messages == []  # held: nothing while the host is offline
        scada.state(True, 2000)
        wait(lambda: sum(1 for m in h.of("DDATA", "cam1") if m.metrics().get(
            "Counts/Results") and m.metrics()["Counts/Results"].is_historical) == 2, 30,
             "NBIRTH then the held results as history")
        scada.state(True, 1500)  # stale: ignored
        wait(lambda: node.stats.states_refused == 1, 30, "the stale STATE refused")
        scada.c.publish("spBv1.0/STATE/scada", b"not json", qos=1).wait_for_publish(10)
        wait(lambda: node.stats.states_refused == 2, 30, "the malformed STATE refused")
        births = len(h.of("NBIRTH"))
        for i in range(40):  # the host flaps 40 times
            scada.state(i % 2 == 1, 3000 + i)
        wait(lambda: node.stats.phase in ("born", "birth_due"), 30, "the flapping seen")
        time.sleep(1.0)
        assert len(h.of("NBIRTH")) - births <= 3 - 1  # 3 a minute, one already spent
    finally:
        node.stop()
        scada.close()
        outbox.close()
    assert h.violations == []


def test_results_a_dropped_link_did_not_carry_stay_held_and_go_out_as_history(tmp_path):
    """A publish that finds the link gone (paho: not connected) keeps the results it did not
    send in the hold, their tallies untouched (the next connection sends them as history)."""
    from runtime.config.telemetry import BrokerConfig
    from runtime.telemetry.sparkplug.metrics import Tally

    tel = TelemetryConfig(fleet="f1", device="d1", broker=BrokerConfig(host="127.0.0.1",
                                                                       port=1))
    outbox = Outbox(OutboxConfig(path=str(tmp_path / "outbox.db")))
    node = SparkplugNode(SparkplugConfig(enabled=True), tel, "d1", outbox, tmp_path)
    node._born, node._tallies = {"cam1"}, {"cam1": Tally()}
    node._held.extend((_result(i, 1000.0 + i, "ok" if i % 2 else "scratch"), False)
                      for i in range(4))
    gone = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
    with pytest.raises(ConnectionError):
        node._publish_held(gone)
    assert [r["t"] for r, _ in node._held] == [1000.0, 1001.0, 1002.0, 1003.0]
    assert node._tallies["cam1"].results == 0 and node.stats.results == 0
    outbox.close()
