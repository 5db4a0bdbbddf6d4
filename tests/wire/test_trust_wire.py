"""Issue 12, the wire: no message breaks a device or the coordinator (findings 1-4, 6, 9, 11).

Pure checks first (parser, schemas, alerts, store), then a real Mosquitto, a device process
and a coordinator, with an outside client publishing what an attacker or a broken publisher
would. The device and the coordinator always log in with their own identities. Where the
attack is a stranger forging acks, results, states or command replies, the broker is left
open by mistake (anonymous, no ACLs: the defence-in-depth case; with ACLs on a stranger is
refused, tests/wire/test_broker_acl.py). Everything else runs with ACLs on, as in production.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.fleet import Device, assert_exactly_once, key_of, outbox_count, start_coordinator
from support.mqtt_probe import Outsider, stream_of
from support.waiting import wait

from models import bundled
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound, Store
from runtime.wire import commands, payloads, safejson
from runtime.wire.broker import Mosquitto

# -- parser and schemas -----------------------------------------------------------------------


@pytest.mark.parametrize("raw, why", [
    (b"[" * 8192, "not JSON"),  # finding 4: was a RecursionError out of on_message
    (b"[" * 20 + b"]" * 20, "nested deeper"),
    (b'{"seq": 1e999}', "overflows"),
    (b'{"seq": NaN}', "NaN"),
    (b'{"seq": ' + b"9" * 5000 + b"}", "out of range"),
    (b'{"seq": 9223372036854775808}', "out of range"),  # 2^63
    (b'"\\ud800"', "surrogate"),
    (b"\xff\xfe", "not UTF-8"),
    (b" " * (2 << 20), "exceeds"),
])
def test_safejson_refuses_what_would_break_a_thread(raw, why):
    with pytest.raises(safejson.JsonRejected, match=why):
        safejson.loads(raw, max_bytes=1 << 20)


@pytest.mark.parametrize("kind, obj, where", [
    ("health", {"v": 1, "t": 1, "boot": "b", "backlog": {"evicted_total": "x"}},
     "backlog/evicted_total"),  # finding 3
    ("health", {"v": 1, "t": 1, "boot": "b", "temp_c": "hot"}, "temp_c"),
    ("health", {"v": 1, "t": 1, "boot": "b", "invented": 1}, "top level"),
    ("health", {"v": 1, "t": 1, "boot": "b", "governor": {"enabled": "no"}}, "governor"),
    ("result", {"v": 1, "stream": "s", "boot": "b", "floor": 1,
                "results": [{"seq": 2 ** 62, "t": 1}]}, "results/0/seq"),  # finding 9
    ("result", {"v": 1, "stream": "s", "boot": "b", "floor": 2 ** 62,
                "results": [{"seq": 1, "t": 1}]}, "floor"),
    ("result", {"v": 1, "stream": "s/x", "boot": "b", "floor": 1,
                "results": [{"seq": 1, "t": 1}]}, "stream"),
    ("state", {"v": 1, "online": True, "boot": "b", "t": 9e15}, "t"),  # finding 11
    ("ack", {"v": 1, "stream": "s", "seq": 10}, "from"),  # the old, unverifiable ack
])
def test_schemas_refuse_wrong_types_and_out_of_range_numbers(kind, obj, where):
    with pytest.raises(payloads.PayloadError, match=where.split("/")[0]):
        payloads.decode(kind, json.dumps(obj).encode())


def _open_members(schema: dict, obj, path: str = "") -> list[str]:
    """Paths of members of `obj` that `schema` neither declares (`properties`) nor types
    (an `additionalProperties` schema, e.g. the pipeline's counters): in an object schema
    without additionalProperties, jsonschema lets any member through unchecked."""
    out: list[str] = []
    if isinstance(obj, dict) and ("properties" in schema or "additionalProperties" in schema):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for k, v in obj.items():
            if k in props:
                out += _open_members(props[k], v, f"{path}/{k}")
            elif isinstance(extra, dict):
                out += _open_members(extra, v, f"{path}/{k}")
            elif extra is True:
                out.append(f"{path}/{k}")
            # extra False: validation has refused it already
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += _open_members(schema["items"], v, f"{path}/{i}")
    return out


def test_open_members_finds_what_a_schema_leaves_unchecked():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {}}},  # no additionalProperties
        "b": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
        "c": {"type": "array", "items": {"type": "object", "properties": {}}}},
        "additionalProperties": False}
    obj = {"a": {"x": 1, "y": 2}, "b": {"n": 3}, "c": [{"z": 1}], "d": 4}
    assert _open_members(schema, obj) == ["/a/y", "/c/0/z"]


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                    reason="bundled model not built")
def test_health_schema_declares_every_field_the_daemon_sends(tmp_path, broker, profile_cache):
    """The health messages a real `edgerun serve` publishes, taken off the broker: each is
    valid against the closed schema (a field sent but not declared fails there), and none
    has a member in an object the schema leaves open (which no validation would catch)."""
    from support.daemon_harness import Serve, write_broker_config

    cfg = write_broker_config(tmp_path, broker, profile_cache)
    spy = Outsider(broker.coordinator("sys", "spy"))
    spy.sub("edgerun/v1/sys/box1/health")
    d = Serve(tmp_path, cfg)
    try:
        # serving: the pipeline's latencies are in (the first healths come before them)
        wait(lambda: sum(b'"p95": ' in p or b'"p95":' in p for _, p in spy.got) >= 3, 180,
             "three healths of a serving daemon", d)
    finally:
        assert d.stop() == 0
        spy.close()
    healths = [json.loads(p) for _, p in spy.got]
    for h in healths:
        payloads.check("health", h)
    unchecked = sorted({m for h in healths for m in _open_members(payloads.SCHEMAS["health"], h)})
    assert unchecked == [], unchecked
    # the sections a serving, connected daemon sends, so the check above covered them
    sent = {k for h in healths for k in h}
    assert {"uptime_s", "temp_c", "choice", "rung", "governor", "pipeline", "slo", "backlog",
            "mqtt", "box_energy"} <= sent, sorted(sent)


def test_health_schema_accepts_every_section_the_daemon_can_send():
    """A health with the sections a plain serving daemon does not send (backend devices,
    preprocessing choices, a simulated board) as Daemon.health() builds them is valid."""
    h = {"v": 1, "t": time.time(), "boot": "abc", "uptime_s": 3.2, "temp_c": 51.5,
         "passive_trip_c": 80.0, "throttled": False, "battery_frac": None,
         "sensor_problems": ["thermal_zone0: stale"], "model": "inspection",
         "choice": "inspection/fp32@onnxruntime", "choice_reason": "lowest energy",
         "rung": 1, "rungs": 3, "accuracy": 0.98, "energy_mj": 1.5,
         "energy_source": "estimate", "power_w": 4.2,
         "governor": {"policy": "step_wise", "level": 0, "budget_w": None, "reason": "",
                      "enabled": True, "disabled_reason": ""},
         "rate_cap_hz": None,
         "pipeline": {"frames": 10, "results": 10, "bad_frames": 0, "rate_hz": 20.0,
                      "latency_ms": {"p50": 3.0, "p95": 5.0}},
         "slo": {"target_ms": 100.0, "compliance": 1.0},
         "backlog": {"results_held": 0, "bytes": 0, "oldest_seq": None, "evicted_total": 0},
         "mqtt": {"connected": True, "connects": 1, "published_results": 10, "resends": 0,
                  "acked_seq": 10, "commands_ok": 0, "commands_refused": 0, "quarantined": 0,
                  "acks_refused": 0, "takeovers": 0, "protocol": "5",
                  "client_id": "edgerun-f-d-abcdefgh"},
         "devices": [{"backend": "onnxruntime", "id": "cpu", "name": "CPU", "threads": 4}],
         "preprocess": {"640x480->32x32": [{"path": "cv2", "ms": 0.1, "mj": 0.01,
                                            "chosen": True}]},
         "simulated": {"t": 100.0, "ambient_c": 25.0}}
    payloads.check("health", h)


def test_publisher_health_section_matches_the_schema(tmp_path):
    from runtime.config.telemetry import OutboxConfig, TelemetryConfig
    from runtime.telemetry.outbox import Outbox
    from runtime.telemetry.publisher import Publisher

    cfg = TelemetryConfig(fleet="f", device="d", outbox=OutboxConfig(path=str(tmp_path / "o.db")))
    outbox = Outbox(cfg.outbox)
    pub = Publisher(cfg, outbox, state_dir=tmp_path)
    payloads.check("health", {"v": 1, "t": 1.0, "boot": outbox.boot, "mqtt": pub.health()})
    assert pub.health()["quarantined"] == 0
    assert pub.stats.client_id == f"edgerun-f-d-{outbox.boot[:8]}"  # per-boot client id
    assert (tmp_path / "device.key").stat().st_mode & 0o777 == 0o600  # made at first start
    assert (tmp_path / "device.pub").exists()
    outbox.close()


# -- fleet alerts read typed fields only -------------------------------------------------------


@pytest.mark.parametrize("health", [
    {"backlog": {"evicted_total": "x", "results_held": [1]}},  # finding 3: was TypeError
    {"temp_c": "hot", "passive_trip_c": {"a": 1}},
    {"slo": "bad"}, {"slo": {"compliance": True}}, {"governor": 5}, {"backlog": None},
    {"temp_c": float("nan"), "passive_trip_c": 80},
])
def test_alerts_never_raise_on_any_shape(health):
    v = fleet.on_activity(fleet.DeviceView("d"), 1.0, health)
    assert isinstance(fleet.alerts(v, fleet.FleetConfig(), "1.0"), tuple)


def test_disabled_governor_is_a_critical_alert_first():
    h = {"governor": {"enabled": False, "disabled_reason": "no valid temperature sensor"}}
    v = fleet.on_activity(fleet.DeviceView("d"), 1.0, h)
    out = fleet.alerts(v, fleet.FleetConfig(), None)
    assert out[0][0] == "governor_disabled"
    assert out[0][1].startswith("critical") and "no valid temperature sensor" in out[0][1]
    ok = fleet.on_activity(fleet.DeviceView("d"), 1.0, {"governor": {"enabled": True}})
    assert fleet.alerts(ok, fleet.FleetConfig(), None) == ()


# -- store: bounded integers, savepoints, verified floors, boot labels ------------------------


def _result(stream, floor, seqs, boot="b1", **item):
    return {"v": 1, "stream": stream, "boot": boot, "floor": floor,
            "results": [{"seq": s, "t": 1.0, **item} for s in seqs]}


def test_one_bad_row_costs_only_its_message(store_url):
    """Finding 9: seq 2^63 raised OverflowError and rolled back the whole batch."""
    store = Store(store_url)
    bad = _result("s1", 1, [2 ** 63])  # as if schema validation had been bypassed
    acks, refused = store.ingest([Inbound("d", "result", _result("s1", 1, [1, 2])),
                                  Inbound("d", "result", bad),
                                  Inbound("d", "health", {"v": 1, "t": 1.0, "boot": "b"}),
                                  Inbound("d", "result", _result("s1", 1, [3]))])
    assert [i for i, _ in refused] == [1]
    assert store.result_seqs("d") == [("s1", 1), ("s1", 2), ("s1", 3)]
    assert [(a.first, a.seq) for a in acks[("d", "s1")]] == [(1, 3)]
    assert store.latest_health()["d"]["boot"] == "b"


def test_a_forged_floor_never_raises_the_ack(store_url):
    """Finding 2: one result with floor 1e9 made the stream's ack 1e9 for ever."""
    store = Store(store_url)
    acks, _ = store.ingest([Inbound("d", "result", _result("s1", 10 ** 9, [1]))])
    assert acks == {}  # seq 1e9 is not stored: the floor is unverified, nothing acked
    acks, _ = store.ingest([Inbound("d", "result", _result("s1", 1, [1, 2, 3]))])
    assert [(a.first, a.seq) for a in acks[("d", "s1")]] == [(1, 3)]
    # a forger who also stores seq 1e9 gets an ack that starts at 1e9: the device, which
    # still holds seq 4, refuses it (client.py), and the real stream's acks go on.
    acks, _ = store.ingest([Inbound("d", "result", _result("s1", 10 ** 9, [10 ** 9]))])
    assert [(a.first, a.seq) for a in acks[("d", "s1")]] == [(10 ** 9, 10 ** 9)]
    acks, _ = store.ingest([Inbound("d", "result", _result("s1", 4, [4, 5]))])
    assert [(a.first, a.seq) for a in acks[("d", "s1")]] == [(4, 5)]
    # a real eviction: the device's floor jumps to 50, and seq 50 is stored, so it counts
    acks, _ = store.ingest([Inbound("d", "result", _result("s1", 50, [50, 51]))])
    assert [(a.first, a.seq) for a in acks[("d", "s1")]] == [(50, 51)]


def test_results_keep_the_boot_that_produced_them(store_url):
    """Finding 11: a result re-sent by a later boot was labelled with the re-sender's boot."""
    store = Store(store_url)
    msg = _result("s1", 1, [1], boot="later")
    msg["results"][0]["boot"] = "producer"
    store.ingest([Inbound("d", "result", msg), Inbound("d", "result", _result("s1", 1, [2]))])
    assert [r["boot"] for r in store.results("d")] == ["producer", "b1"]


def test_outbox_labels_results_with_their_boot(tmp_path):
    from runtime.config.telemetry import OutboxConfig
    from runtime.telemetry.outbox import Outbox

    box = Outbox(OutboxConfig(path=str(tmp_path / "o.db")))
    box.append({"t": 1.0})
    first = box.boot
    box.close()
    box = Outbox(OutboxConfig(path=str(tmp_path / "o.db")))
    assert box.boot != first
    assert json.loads(box.pending(0, 1)[0].json)["boot"] == first
    box.close()


def test_forged_stored_rows_do_not_stop_the_coordinator_starting(tmp_path):
    """Finding 3: with a forged state row stored, the coordinator could not start again."""
    store = Store(tmp_path / "c.db")
    store._db.execute("INSERT INTO states VALUES (?,?)", ("evil", '{"online": "yes"}'))
    store._db.execute("INSERT INTO states VALUES (?,?)", ("worse", '[1, 2]'))
    store._db.execute("INSERT INTO states VALUES (?,?)", ("good", json.dumps(
        {"v": 1, "online": True, "boot": "b", "t": time.time()})))
    store._db.execute("INSERT INTO health VALUES (?,?,?)", ("good", time.time(), json.dumps(
        {"v": 1, "t": time.time(), "boot": "b", "backlog": {"evicted_total": "x"}})))
    store.close()
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    assert set(c.views) == {"good"} and c.views["good"].health == {}
    assert c.store.quarantine_counts() == {"evil": 1, "worse": 1, "good": 1}
    c.store.close()


# -- against a real broker left open ------------------------------------------------------------


@pytest.fixture
def open_broker(tmp_path):
    """A Mosquitto left open by mistake: anonymous clients welcome, no ACLs. Only for the
    tests whose attacker is a stranger publishing where, with ACLs on, only the device or the
    coordinator may (acks, results, states, command replies): the device's and the
    coordinator's own checks are the defence in depth for that misconfiguration, and a
    stranger cannot even log in to the default broker."""
    b = Mosquitto(tmp_path, auth=False).start()
    yield b
    b.stop()


def test_spoofed_acks_delete_nothing_and_poison_does_not_kill_the_device(tmp_path, open_broker):
    """Findings 1 and 4: with the coordinator down, a spoofed ack deleted 840 held results;
    8 KB of `[` on ack or cmd (retained) killed the device's MQTT thread."""
    total = 300
    # The coordinator's persistent session exists, but it is down while this happens.
    start_coordinator(tmp_path, open_broker, signing_key=key_of(tmp_path)).stop()
    dev = Device(tmp_path, open_broker, total, trusted_key=tmp_path / "k.pub").start()
    out = Outsider(open_broker.client("stranger"))  # anonymous: the broker is open
    stream = stream_of(out)
    wait(lambda: "appended" in (tmp_path / "device.out").read_text(), 30, "results appended")
    ack, cmd = payloads.topic("test", "dev1", "ack"), payloads.topic("test", "dev1", "cmd")
    out.pub(ack, b"[" * 8192, retain=True)
    out.pub(cmd, b"[" * 8192, retain=True)
    out.pub(ack, {"v": 1, "stream": stream, "seq": 1_000_000_000})  # the exact ack
    out.pub(ack, {"v": 1, "stream": stream, "seq": 1_000_000_000, "from": 1})
    out.pub(ack, {"v": 1, "stream": stream, "seq": total, "from": 1})  # beyond what it sent
    out.pub(ack, {"v": 1, "stream": "otherstream", "seq": 5, "from": 1})
    time.sleep(1.0)
    # Nothing beyond what the device has sent (inflight 100, no coordinator) was deleted.
    assert outbox_count(tmp_path) >= total - 100
    # A restarted device gets the retained poison at once when it subscribes: still alive.
    dev.kill9()
    dev.start()
    time.sleep(1.0)
    coord = start_coordinator(tmp_path, open_broker, signing_key=key_of(tmp_path))
    wait(lambda: coord.store.counts().get("dev1", 0) >= total, 60, "every result stored")
    assert_exactly_once(coord, total)
    wait(lambda: outbox_count(tmp_path) == 0, 20, "outbox drained by real acks")
    reply = coord.send_command("dev1", "ping")  # the device's MQTT thread is alive
    assert reply["status"] == "done" and reply["verified"] is True
    wait(lambda: any(e["type"] == "ack_refused" for e in coord.store.events("dev1", 1000)),
          10, "the refused acks as an event the operator sees")
    assert dev.proc.poll() is None
    out.pub(ack, b"", retain=True)
    out.pub(cmd, b"", retain=True)
    out.close()
    dev.term()
    coord.stop()


def test_hostile_messages_are_quarantined_and_ingest_goes_on(tmp_path, open_broker):
    """Findings 3, 9, 2, 11 at the coordinator: a string in health stopped ingest for good;
    seq 2^63 rolled back whole batches; floor 1e9 froze the ack; a retained forged state
    hid a real device's death."""
    coord = start_coordinator(tmp_path, open_broker)
    out = Outsider(open_broker.client("stranger"))  # anonymous: the broker is open
    t = payloads.topic
    now = time.time()
    out.pub(t("test", "dev1", "health"), {"v": 1, "t": now, "boot": "x",
                                          "backlog": {"evicted_total": "x"}})
    out.pub(t("test", "dev1", "result"), {"v": 1, "stream": "s", "boot": "b", "floor": 1,
                                          "results": [{"seq": 2 ** 63, "t": now}]})
    out.pub(t("test", "dev1", "result"), b'{"v":1,"stream":"s","boot":"b","floor":1,'
                                         b'"results":[{"seq":1e999,"t":1}]}')
    out.pub(t("test", "dev1", "state"), {"v": 1, "online": True, "boot": "forged", "t": 9e15})
    out.pub(t("test", "dev1", "state"), {"v": 1, "online": True, "boot": "forged",
                                         "t": now + 3600}, retain=True)
    out.pub(t("test", "dev1", "event"), b"[" * 8192)
    out.pub(t("test", "ev il", "health"), {"v": 1, "t": now, "boot": "x"})
    wait(lambda: coord.stats()["quarantined"]["total"] >= 7, 30, "quarantine")
    assert "dev1" not in coord.views  # nothing of it was admitted

    total = 200
    dev = Device(tmp_path, open_broker, total, keepalive=2).start()
    wait(lambda: coord.store.counts().get("dev1", 0) >= total, 60, "results after the poison")
    assert_exactly_once(coord, total)
    wait(lambda: outbox_count(tmp_path) == 0, 20, "outbox drained")
    row = next(r for r in coord.fleet_view() if r["device"] == "dev1")
    assert row["quarantined"] >= 6 and row["status"] == "online"
    assert all(coord.threads_alive().values())
    # The real device dies: its will wins over the forged future state.
    dev.kill9()
    wait(lambda: coord.views["dev1"].status == "offline", 30, "death seen")
    stored = coord.device_view("dev1")["quarantine"]
    assert any("ahead of the coordinator's clock" in q["reason"] for q in stored)
    assert all({"t", "topic", "reason", "size", "device"} <= set(q) for q in stored)
    out.pub(t("test", "dev1", "state"), b"", retain=True)
    out.close()
    coord.stop()


def test_forged_command_replies_are_quarantined_not_reported(tmp_path, open_broker):
    """Finding 6: an outsider on `cmd` answered first and `fleet send` printed it as done."""
    coord = start_coordinator(tmp_path, open_broker, signing_key=key_of(tmp_path))
    dev = Device(tmp_path, open_broker, 5, trusted_key=tmp_path / "k.pub").start()
    wait(lambda: "dev1" in coord.views, 20, "device known")
    out = Outsider(open_broker.client("stranger"))  # anonymous: the broker is open
    out.sub(payloads.topic("test", "dev1", "cmd"))
    reply_topic = payloads.topic("test", "dev1", "cmd/reply")
    forged_key = commands.Ed25519PrivateKey.generate()

    def forge(c, u, m):  # answers every command at once, before the device can
        env = json.loads(m.payload)
        fake = {"v": 1, "id": env["id"], "ok": True, "status": "done", "reason": "forged",
                "t": time.time(), "device": "dev1"}
        c.publish(reply_topic, json.dumps(fake).encode(), qos=1)
        c.publish(reply_topic, json.dumps(commands.sign_reply(forged_key, fake)).encode(),
                  qos=1)
    out.c.on_message = forge
    for _ in range(3):
        reply = coord.send_command("dev1", "ping")
        assert reply["verified"] is True and reply["reason"] == "pong"
    # the forged replies are quarantined by the ingest thread, maybe after the real one won
    wait(lambda: coord.fleet_view()[0]["quarantined"] >= 6, 30, "forged replies quarantined")
    out.close()

    # Without the device's public key nothing is proven: never reported as done.
    (tmp_path / "keys" / "dev1.pub").unlink()
    reply = coord.send_command("dev1", "ping")
    assert reply["verified"] is False and reply["ok"] is False
    assert reply["status"] == "unverified" and reply["device_status"] == "done"
    dev.term()
    coord.stop()


def test_a_takeover_of_the_client_id_is_an_event(tmp_path, broker):
    """Finding 5 (the part on the wire): fixed client ids let anyone kick a device off
    silently. Ids carry the boot now, and a takeover is counted and reported.

    ACLs on: a stranger is refused (tests/wire/test_broker_acl.py), and the broker edgerun
    configures binds client ids to usernames (`use_username_as_clientid`: another enrolled
    identity gets its own session, tests/wire/test_client_ids.py), so what is left is a leaked
    login of the device itself; the thief here is such a client."""
    from runtime.config.telemetry import OutboxConfig, TelemetryConfig
    from runtime.telemetry.outbox import Outbox
    from runtime.telemetry.publisher import Publisher

    cfg = TelemetryConfig(fleet="test", device="dev9", broker=broker.device("test", "dev9"),
                          outbox=OutboxConfig(path=str(tmp_path / "o.db")))
    outbox = Outbox(cfg.outbox)
    pub = Publisher(cfg, outbox)
    pub.start()
    wait(lambda: pub.stats.connected, 30, "connected")
    assert pub.stats.client_id.endswith(outbox.boot[:8])
    watcher = Outsider(broker.coordinator("test", "watcher"))
    watcher.sub(payloads.topic("test", "dev9", "event"))
    thief = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                        client_id=pub.stats.client_id, protocol=mqtt.MQTTv5)
    login = cfg.broker  # the device's own login, leaked: its client id is its username
    thief.username_pw_set(login.username, Path(login.password_file).read_text().strip())
    thief.connect("127.0.0.1", broker.port)
    thief.loop_start()
    wait(lambda: pub.stats.takeovers == 1, 30, "the takeover noticed")
    thief.loop_stop()
    wait(lambda: any(json.loads(b)["type"] == "mqtt_takeover" for _, b in watcher.got), 15,
          "the takeover event, delivered once the device is back")
    watcher.close()
    payloads.check("health", {"v": 1, "t": 1.0, "boot": outbox.boot, "mqtt": pub.health()})
    assert pub.alive()
    pub.stop()
    outbox.close()


def test_quarantine_log_is_one_line_per_kind_per_minute(caplog):
    import logging

    from runtime.wire.quarantine import RateLimitedLog

    rl = RateLimitedLog(logging.getLogger("t.rl"), every_s=60)
    with caplog.at_level(logging.WARNING, logger="t.rl"):
        written = [rl.log("ack", "bad ack %d", i) for i in range(1000)]
        rl.log("cmd", "bad cmd")
    assert written.count(True) == 1 and len(caplog.records) == 2
    rl.every_s = 0  # a minute later: the next line says how many were suppressed
    rl.log("ack", "bad ack")
    assert "999 more like it" in caplog.records[-1].getMessage()


def test_connection_contains_every_callback_failure(tmp_path, broker):
    """One connection class for the publisher, the coordinator and the trigger source: a
    handler that raises costs that message, never the thread."""
    from runtime.wire.mqtt import Connection

    errors: list[tuple[str, str]] = []
    got: list[bytes] = []

    def handler(client, msg):
        if msg.payload.startswith(b"bad"):
            raise RecursionError("as json.loads would on 8 KB of [")
        got.append(msg.payload)

    login = broker.client("contain-test", read=("x/y",), write=("x/z",))
    conn = Connection(login, "contain-test",
                      name="test-mqtt", subscriptions=[("x/y", 1)], on_message=handler,
                      on_error=lambda what, why: errors.append((what, why)),
                      on_tick=lambda c: None).start()
    assert conn.subscribed.wait(30)
    out = Outsider(broker.client("outsider", read=("x/z",), write=("x/y",)))
    for i in range(5):
        out.pub("x/y", b"bad %d" % i)
    out.pub("x/y", b"good")
    wait(lambda: got == [b"good"], 30, "the good message after five bad ones")
    assert conn.alive() and conn.stats.callback_errors == 5
    assert errors[0][0] == "message" and "RecursionError" in errors[0][1]
    conn.publish("x/z", b"queued from another thread")  # published by the connection's thread
    out.sub("x/z")
    conn.publish("x/z", b"hello")
    wait(lambda: any(p == b"hello" for _, p in out.got), 30, "a queued publish")
    out.close()
    conn.stop()
    assert not conn.alive()


def test_connection_bounds_what_waits_for_the_broker(broker):
    """Messages queued while the broker is away (here: before the thread connects) are
    capped at MAX_OUTGOING, the oldest dropped and counted; the newest arrive."""
    from runtime.wire.mqtt import Connection

    login = broker.client("bound-test", read=("x/y",), write=("x/z",))
    conn = Connection(login, "bound-test", name="test-mqtt", on_tick=lambda c: None)
    conn.MAX_OUTGOING = 3
    for i in range(5):
        conn.publish("x/z", b"m%d" % i)
    assert conn.stats.dropped_outgoing == 2
    out = Outsider(broker.client("outsider2", read=("x/z",), write=("x/y",)))
    out.sub("x/z")
    conn.start()
    try:
        wait(lambda: len(out.got) >= 3, 30, "the three newest messages")
        assert [p for _, p in out.got] == [b"m2", b"m3", b"m4"]
    finally:
        out.close()
        conn.stop()
