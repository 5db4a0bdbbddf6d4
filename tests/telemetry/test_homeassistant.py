"""Home Assistant discovery and one-result-per-message, read back from a real Mosquitto.

The configs are checked against the configuration variables Home Assistant documents for
MQTT sensors and binary sensors (the keys encoded below), their templates are rendered with
Jinja (the engine HA renders them with) against the device's real payloads, and every topic
they name is one the device's ACL lets it publish.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from support.waiting import wait

from runtime.config import from_dict
from runtime.config.coordinator import CoordinatorConfig
from runtime.config.telemetry import OutboxConfig, TelemetryConfig
from runtime.coordinator.service import Coordinator
from runtime.telemetry.homeassistant import (
    DeviceInfo,
    Discovery,
    HomeAssistantConfig,
    _jinja_string,
    config_topics,
    entities,
    node_id,
)
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher
from runtime.wire import commands, payloads
from runtime.wire.brokerauth import DEVICE_PUBLISHES, PREFIX, Identity, device_username

# Configuration variables of https://www.home-assistant.io/integrations/sensor.mqtt/ and
# https://www.home-assistant.io/integrations/binary_sensor.mqtt/ (home-assistant.io,
# source/_integrations/{sensor,binary_sensor}.mqtt.markdown, "Configuration Variables").
_COMMON = {"availability", "availability_mode", "availability_template", "availability_topic",
           "device", "device_class", "enabled_by_default", "encoding", "entity_category",
           "entity_picture", "expire_after", "force_update", "icon", "json_attributes_template",
           "json_attributes_topic", "name", "object_id", "payload_available",
           "payload_not_available", "platform", "qos", "state_topic", "unique_id",
           "value_template"}
ALLOWED = {
    "sensor": _COMMON | {"last_reset_value_template", "options", "suggested_display_precision",
                         "state_class", "unit_of_measurement"},
    "binary_sensor": _COMMON | {"off_delay", "payload_off", "payload_on"},
}
REQUIRED = {"state_topic"}  # `platform` is required only in device-based discovery payloads
DEVICE_KEYS = {"configuration_url", "connections", "hw_version", "identifiers", "manufacturer",
               "model", "model_id", "name", "serial_number", "suggested_area", "sw_version",
               "via_device"}
AVAILABILITY_KEYS = {"payload_available", "payload_not_available", "topic", "value_template"}
# https://developers.home-assistant.io/docs/core/entity/sensor#available-state-classes
STATE_CLASSES = {"measurement", "measurement_angle", "total", "total_increasing"}
# https://www.home-assistant.io/integrations/mqtt/ "Discovery topic":
# <discovery_prefix>/<component>/[<node_id>/]<object_id>/config, ids of [a-zA-Z0-9_-]
TOPIC = re.compile(r"^homeassistant/(sensor|binary_sensor)/([a-zA-Z0-9_-]+)/([a-zA-Z0-9_-]+)"
                   r"/config$")

LABELS = ("ok", "scratch", 'dent "big" {{x}}', "café")
JINJA = ImmutableSandboxedEnvironment()


def _render(template: str, payload: dict) -> str:
    return JINJA.from_string(template).render(value_json=payload, value=json.dumps(payload))


class Listener:
    """A broker client that records every message on its filters (retained ones too)."""

    def __init__(self, broker, filters: tuple[str, ...], name: str = "ha"):
        # a topic of its own to send itself a last message on (`sync`)
        self._marker = f"edgerun-test/sync/{name}"
        filters = (*filters, self._marker)
        creds = broker.client(name, read=filters, write=(self._marker,))
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id=f"{name}-{time.monotonic_ns()}")
        self.c.username_pw_set(creds.username, Path(creds.password_file).read_text().strip())
        self.c.on_message = self._on_message
        subscribed = threading.Event()
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.connect("127.0.0.1", broker.port)
        self.c.subscribe([(f, 1) for f in filters])
        self.c.loop_start()
        assert subscribed.wait(10)

    def _on_message(self, client, userdata, msg) -> None:
        with self._lock:
            self.messages.append((msg.topic, msg.payload, bool(msg.retain)))

    def on(self, topic_re: str) -> list[tuple[str, bytes, bool]]:
        with self._lock:
            return [m for m in self.messages if re.match(topic_re, m[0])]

    def sync(self, timeout_s: float = 30) -> None:
        """Return once everything the broker queued for this client before now has arrived:
        it sends itself a QoS 1 message and waits for it. Mosquitto queues a subscription's
        retained messages while it handles the SUBSCRIBE (answered before __init__ returns)
        and passes a client's QoS 1 messages on in the order queued, so a retained message
        that should not exist has arrived by then (was: a 0.5 s sleep, which a loaded host
        could outlast and pass falsely)."""
        token = str(time.monotonic_ns()).encode()
        self.c.publish(self._marker, token, qos=1)
        wait(lambda: (self._marker, token, False) in self.messages, timeout_s,
             "the listener's own last message")

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def _device(tmp_path, broker, *, ha: bool, enabled: bool = True, each: bool = False,
            labels=LABELS, battery: bool = True, **tcfg):
    """An in-process device publisher (real outbox, real broker login with the fleet ACL)."""
    write = config_topics("homeassistant", "test", "dev1") if ha else ()
    creds = broker.credentials(Identity(device_username("test", "dev1"), "device", write=write))
    cfg = TelemetryConfig(fleet="test", device="dev1", broker=creds, result_per_message=each,
                          outbox=OutboxConfig(path=str(tmp_path / "dev.db")), **tcfg)
    outbox = Outbox(cfg.outbox)
    if not (tmp_path / "device.key").exists():
        (tmp_path / "keys").mkdir(exist_ok=True)
        commands.generate_keypair(tmp_path / "device.key", tmp_path / "keys" / "dev1.pub")
    disc = Discovery(HomeAssistantConfig(enabled=enabled), "test", "dev1", tmp_path,
                     lambda: DeviceInfo(labels, "raspberry-pi-5", "9.9", battery), each)
    pub = Publisher(cfg, outbox, lambda: {"model": "inspection"}, state_dir=tmp_path,
                    homeassistant=disc)
    pub.start()
    return pub, outbox


def _health(boot: str) -> dict:
    return {"v": 1, "t": time.time(), "boot": boot, "temp_c": 61.25, "passive_trip_c": 70.0,
            "throttled": True, "rung": 2, "rungs": 3, "choice": "m-int8", "power_w": 4.5,
            "battery_frac": 0.834, "governor": {"reason": "hot"},
            "pipeline": {"rate_hz": 7.5, "latency_ms": {"p50": 3.0, "p95": 4.25},
                         "labels": {"ok": 40, 'dent "big" {{x}}': 3, "café": 1}},
            "slo": {"target_ms": 20.0, "compliance": 1.0}}


def _configs(listener) -> dict[str, dict]:
    """Discovery topic -> config of the retained, non-empty messages received (latest wins)."""
    out: dict[str, dict] = {}
    for topic, body, _ in listener.on(r"^homeassistant/"):
        if body:
            out[topic] = json.loads(body)
        else:
            out.pop(topic, None)
    return out


def test_config_section_validates_prefix():
    assert from_dict({"homeassistant": {"enabled": True}}).homeassistant.enabled
    for bad in ("home/+/x", "a//b", "", "$SYS", "#"):
        with pytest.raises(Exception, match="discovery_prefix"):
            from_dict({"homeassistant": {"discovery_prefix": bad}})


def test_label_strings_cannot_break_out_of_the_template():
    payload = {"pipeline": {"labels": {label: i for i, label in enumerate(LABELS, 1)}}}
    for label in (*LABELS, "}} {% raise %}", "a\\'b", "\n", "😀"):
        payload["pipeline"]["labels"][label] = 7
        tpl = f"{{{{ value_json.pipeline.labels.get({_jinja_string(label)}, 0) }}}}"
        assert _render(tpl, payload) == "7", label
    # every config's text holds no raw quote or brace of a label
    cfgs = entities("f", "d", DeviceInfo(LABELS, "m", "1"), False)
    assert len({c["unique_id"] for c in cfgs.values()}) == len(cfgs)


def test_discovery_read_back_matches_documented_fields_and_acl(tmp_path, broker):
    pub, outbox = _device(tmp_path, broker, ha=True)
    ha = Listener(broker, ("homeassistant/#", f"{PREFIX}/test/+/#"))
    try:
        wait(lambda: len(_configs(ha)) >= 12, 15, "the discovery configs")
        h = _health(outbox.boot)
        outbox.put("health", h)
        wait(lambda: ha.on(r".*/health$"), 30, "a health message")
        state = json.loads(ha.on(r".*/dev1/state$")[-1][1])
        configs = _configs(ha)
        # retained: a Home Assistant subscribing now gets every config, flagged retained. (The
        # first listener's flags depend on who was first: configs published after its
        # SUBSCRIBE arrive live, retain 0, as MQTT says; that failed 1 in 10 runs here.)
        late = Listener(broker, ("homeassistant/#",), name="ha-late")
        try:
            wait(lambda: _configs(late) == configs, 30, "the retained configs, late")
            retained = [retain for _, body, retain in late.on(r"^homeassistant/") if body]
        finally:
            late.stop()
    finally:
        ha.stop()
        pub.stop()
        outbox.close()
    node = node_id("test", "dev1")
    allowed_topics = {payloads.topic("test", "dev1", k) for k in DEVICE_PUBLISHES}
    names = set()
    for topic, cfg in configs.items():
        m = TOPIC.match(topic)
        assert m and m.group(2) == node, topic
        component = m.group(1)
        assert set(cfg) <= ALLOWED[component], (topic, set(cfg) - ALLOWED[component])
        assert set(cfg) >= REQUIRED
        assert cfg["unique_id"].startswith(node) and cfg["device"]["identifiers"] == [node]
        assert set(cfg["device"]) <= DEVICE_KEYS
        assert {"name", "model", "sw_version"} <= set(cfg["device"])
        assert cfg.get("state_class", "measurement") in STATE_CLASSES
        for a in cfg["availability"]:
            assert set(a) <= AVAILABILITY_KEYS and "topic" in a
            assert a["topic"] == payloads.topic("test", "dev1", "state")
            # the retained birth renders as available; the will/farewell as unavailable
            assert _render(a["value_template"], state) == a["payload_available"]
            assert _render(a["value_template"], {**state, "online": False}) == \
                a["payload_not_available"]
        # state topics are ones the device may publish under its ACL pattern lines
        assert cfg["state_topic"] in allowed_topics
        assert cfg.get("json_attributes_topic", cfg["state_topic"]) in allowed_topics
        names.add(cfg["name"])
        if "json_attributes_template" in cfg:  # must render to a JSON object
            payload = h if cfg["json_attributes_topic"].endswith("/health") else {
                "results": [{"seq": 1, "t": 1.0, "label": "ok"}]}
            assert isinstance(json.loads(_render(cfg["json_attributes_template"], payload)),
                              dict)
        if cfg["state_topic"].endswith("/health"):
            rendered = _render(cfg["value_template"], h)
            if component == "sensor":
                float(rendered)  # numeric sensors get a number from a real health message
            else:
                assert rendered in (cfg["payload_on"], cfg["payload_off"])
    by_name = {c["name"]: c for c in configs.values()}
    assert {"Temperature", "Rung", "Inference rate", "Latency p95", "Power", "Battery",
            "Last result", "Throttled"} <= names
    assert {f"Results {label}" for label in LABELS} <= names
    assert _render(by_name["Temperature"]["value_template"], h) == "61.25"
    assert by_name["Temperature"]["unit_of_measurement"] == "°C"
    assert _render(by_name["Battery"]["value_template"], h) == "83.4"
    assert _render(by_name["Throttled"]["value_template"], h) == "ON"
    assert _render(by_name['Results dent "big" {{x}}']["value_template"], h) == "3"
    assert _render(by_name["Results scratch"]["value_template"], h) == "0"  # none yet
    assert by_name["Results ok"]["state_class"] == "total_increasing"
    assert retained and all(retained)


def test_without_the_acl_entry_the_broker_drops_the_configs(tmp_path, broker, caplog):
    """The discovery topics are outside the device's pattern lines: a device enrolled
    without `--homeassistant` has them refused (so enrolment must grant them), and over
    MQTT 5 the refusal reaches the operator's log with what to do."""
    caplog.set_level(logging.ERROR, logger="edgerun.mqtt")
    pub, outbox = _device(tmp_path, broker, ha=False)
    ha = Listener(broker, ("homeassistant/#", f"{PREFIX}/test/+/state"))
    try:
        wait(lambda: ha.on(r".*/dev1/state$"), 30, "the birth")
        wait(lambda: "enroll --homeassistant" in caplog.text, 30, "the refusal logged")
        assert "refused the discovery config homeassistant/" in caplog.text
        assert _configs(ha) == {}
    finally:
        ha.stop()
        pub.stop()
        outbox.close()


def test_disabling_removes_the_retained_configs(tmp_path, broker):
    pub, outbox = _device(tmp_path, broker, ha=True)
    first = Listener(broker, ("homeassistant/#",), name="ha1")
    try:
        wait(lambda: len(_configs(first)) >= 12, 15, "the discovery configs")
        published = set(_configs(first))
    finally:
        first.stop()
        pub.stop()
        outbox.close()
    record = json.loads((tmp_path / "homeassistant.json").read_text())["topics"]
    assert set(record) == published
    pub, outbox = _device(tmp_path, broker, ha=True, enabled=False)
    try:
        wait(lambda: json.loads((tmp_path / "homeassistant.json").read_text())["topics"]
              == [], 15, "the removals to be acknowledged")
    finally:
        pub.stop()
        outbox.close()
    late = Listener(broker, ("homeassistant/#",), name="ha2")  # a Home Assistant starting now
    try:
        late.sync()  # any retained config left behind has arrived by now
        assert _configs(late) == {} and late.on(r"^homeassistant/") == []
    finally:
        late.stop()


def test_a_label_gone_with_its_model_is_removed(tmp_path, broker):
    pub, outbox = _device(tmp_path, broker, ha=True, labels=("ok", "scratch"))
    ha = Listener(broker, ("homeassistant/#",))
    try:
        wait(lambda: any(c["name"] == "Results scratch" for c in _configs(ha).values()), 15,
              "the scratch counter")
    finally:
        pub.stop()
        outbox.close()
    pub, outbox = _device(tmp_path, broker, ha=True, labels=("ok", "crack"))
    try:
        wait(lambda: any(c["name"] == "Results crack" for c in _configs(ha).values()), 15,
              "the crack counter")
        wait(lambda: not any(c["name"] == "Results scratch" for c in _configs(ha).values()),
              10, "the scratch counter to be removed")
    finally:
        ha.stop()
        pub.stop()
        outbox.close()


def _results(n: int, start: int = 0) -> list[dict]:
    return [{"t": time.time(), "ref": f"f{i}", "label": "scratch" if i % 3 else "ok",
             "score": 0.5, "variant": "m-int8", "rung": 2} for i in range(start, start + n)]


def test_result_per_message_flows_without_a_coordinator(tmp_path, broker):
    """No coordinator acks, so the batched path stops at its in-flight window; each result
    still arrives alone, once, in order, valid against its schema."""
    pub, outbox = _device(tmp_path, broker, ha=True, each=True, inflight=10, batch_max=5)
    sub = Listener(broker, (f"{PREFIX}/test/+/result/each", "homeassistant/#"))
    try:
        wait(lambda: _configs(sub), 30, "the discovery configs")
        for i in range(0, 60, 20):
            outbox.append_many(_results(20, i))
        wait(lambda: len(sub.on(r".*/result/each$")) >= 60, 15, "60 single results")
        time.sleep(0.3)
        msgs = [payloads.decode("result/each", body) for _, body, _ in sub.on(r".*/each$")]
        assert [m["seq"] for m in msgs] == list(range(1, 61))
        assert {m["stream"] for m in msgs} == {outbox.stream}
        assert pub.stats.published_results == 10  # the batched path waits for acks
        last = next(c for c in _configs(sub).values() if c["name"] == "Last result")
        assert last["state_topic"].endswith("/result/each")
        assert _render(last["value_template"], msgs[-1]) == msgs[-1]["label"]
    finally:
        sub.stop()
        pub.stop()
        outbox.close()


def test_result_per_message_keeps_exactly_once_to_the_coordinator(tmp_path, broker):
    creds = broker.coordinator("test", keepalive_s=5)
    # a 0.2 s ingest window, not 2 s: 21 in flight never fill a window (25 results end it
    # early), so each 21 waited out the whole window, 10 s for the 100
    coord = Coordinator(CoordinatorConfig(fleet="test", broker=creds, device_keys=str(
        tmp_path / "keys"), store=str(tmp_path / "coord.db"), ingest_window_s=0.2))
    coord.start()
    assert coord.connected.wait(30)
    pub, outbox = _device(tmp_path, broker, ha=False, each=True, batch_max=7, inflight=21)
    sub = Listener(broker, (f"{PREFIX}/test/+/result/each",))
    try:
        for i in range(0, 100, 10):
            outbox.append_many(_results(10, i))
            time.sleep(0.02)
        wait(lambda: coord.store.counts().get("dev1") == 100, 20, "100 stored results")
        wait(lambda: len(sub.on(r".*")) >= 100, 30, "100 single results")
        wait(lambda: outbox.stats()["results_held"] == 0, 30, "the outbox to be acked empty")
        seqs = [q for _, q in coord.store.result_seqs("dev1")]
        assert seqs == list(range(1, 101))
        assert sorted(json.loads(b)["seq"] for _, b, _ in sub.on(r".*")) == list(range(1, 101))
        assert coord.counters["quarantined"] == 0  # the coordinator never sees result/each
    finally:
        sub.stop()
        pub.stop()
        outbox.close()
        coord.stop()


def test_results_held_while_the_broker_was_away_are_published_once_back(tmp_path, broker):
    pub, outbox = _device(tmp_path, broker, ha=False, each=True)
    sub = Listener(broker, (f"{PREFIX}/test/+/result/each",))
    try:
        outbox.append_many(_results(5))
        wait(lambda: len(sub.on(r".*")) == 5, 30, "5 single results")
        sub.stop()
        broker.stop()
        outbox.append_many(_results(5, 5))  # produced while the broker is down
        broker.start()
        sub = Listener(broker, (f"{PREFIX}/test/+/result/each",))  # same login: no reload
        wait(lambda: pub.stats.connected, 30, "the device to reconnect")
        outbox.append_many(_results(5, 10))
        wait(lambda: len(sub.on(r".*")) >= 10, 15, "the held and the new results")
        time.sleep(0.3)
        assert sorted(json.loads(b)["seq"] for _, b, _ in sub.on(r".*")) == list(range(6, 16))
    finally:
        sub.stop()
        pub.stop()
        outbox.close()


def test_enrol_with_homeassistant_grants_exactly_the_config_topics(tmp_path):
    from runtime.coordinator.enroll import enroll_device

    enroll_device("test", "dev.1", tmp_path / "b", tmp_path / "out", tmp_path / "keys",
                  homeassistant="homeassistant")
    enroll_device("test", "dev2", tmp_path / "b", tmp_path / "out2", tmp_path / "keys")
    acl = (tmp_path / "b" / "acl").read_text()
    block = acl.split("user test/dev.1\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert block == ["topic write homeassistant/sensor/edgerun_test_dev_1/+/config",
                     "topic write homeassistant/binary_sensor/edgerun_test_dev_1/+/config"]
    assert "user test/dev2\n" not in acl  # not asked for: nothing beyond the pattern lines
    # (its bundle connection is an identity of its own: docs/security.md, "Client ids")
    assert f"pattern write {PREFIX}/%u/result/each" in acl


def test_a_real_daemon_announces_its_model_labels_and_each_result(tmp_path, broker):
    """`edgerun serve` with [homeassistant] and result_per_message: discovery names the
    running model's labels and the device profile, and results arrive one a message."""
    from support.daemon_harness import Serve, write_config
    from support.waiting import wait

    from runtime.engine.manifest import load_manifest

    creds = broker.credentials(Identity(device_username("t", "box1"), "device",
                                        write=config_topics("homeassistant", "t", "box1")))
    cfg = write_config(tmp_path, tmp_path / "cache", extra=f"""
[telemetry.broker]
host = "127.0.0.1"
port = {broker.port}
username = "{creds.username}"
password_file = "{creds.password_file}"
[homeassistant]
enabled = true
""")
    cfg.write_text(cfg.read_text().replace("health_interval_s = 0.3",
                                           "health_interval_s = 0.3\nresult_per_message = true"))
    ha = Listener(broker, ("homeassistant/#", f"{PREFIX}/t/+/result/each"))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: len(ha.on(r".*/result/each$")) >= 20, 180, "20 single results", d)
        configs = _configs(ha)
    finally:
        assert d.stop() == 0
        ha.stop()
    from models import bundled

    labels = load_manifest(bundled()).labels
    names = {c["name"] for c in configs.values()}
    assert {f"Results {label}" for label in labels} <= names
    assert {c["device"]["model"] for c in configs.values()} == {"generic-x86"}
    seqs = [json.loads(b)["seq"] for _, b, _ in ha.on(r".*/result/each$")]
    assert seqs == sorted(set(seqs))  # once each, in order


def test_the_record_names_only_this_devices_config_topics(tmp_path):
    node = node_id("test", "dev1")
    (tmp_path / "homeassistant.json").write_text(json.dumps({"topics": [
        f"homeassistant/sensor/{node}/temperature/config", f"ha2/sensor/{node}/rung/config",
        "#", "edgerun/v1/test/dev1/state", f"homeassistant/sensor/{node}x/a/config",
        "homeassistant/sensor/edgerun_test_dev2/temperature/config", 7, None]}))
    d = Discovery(HomeAssistantConfig(enabled=False), "test", "dev1", tmp_path, DeviceInfo)
    assert d.messages() == {f"homeassistant/sensor/{node}/temperature/config": b"",
                            f"ha2/sensor/{node}/rung/config": b""}
    (tmp_path / "homeassistant.json").write_text("{not json")
    assert Discovery(HomeAssistantConfig(), "test", "dev1", tmp_path, DeviceInfo).messages() == {}
