"""Telemetry against a real Mosquitto: delivery through faults, commands, birth/death."""

from __future__ import annotations

import json
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.fleet import (
    Device,
    assert_exactly_once,
    outbox_count,
    read_lines,
    start_coordinator,
)
from support.waiting import wait

from runtime.wire import commands, payloads
from runtime.wire.broker import Mosquitto


def test_broker_restart_and_device_kill9_and_coordinator_down_lose_nothing(tmp_path, broker):
    total = 600
    coord = start_coordinator(tmp_path, broker)
    dev = Device(tmp_path, broker, total, rate=300).start()
    wait(lambda: coord.store.counts().get("dev1", 0) > 50, 20, "first results")
    broker.stop()  # broker down while the device keeps appending
    time.sleep(0.5)
    broker.start()
    wait(lambda: coord.store.counts().get("dev1", 0) > 250, 30, "results after broker restart")
    dev.kill9()  # device killed mid-stream, restarted on the same outbox
    dev.start()
    coord.stop()  # coordinator down for a while; the device keeps publishing
    time.sleep(1.0)
    coord = start_coordinator(tmp_path, broker)
    wait(lambda: coord.store.counts().get("dev1", 0) >= total, 60, "all results stored")
    time.sleep(0.5)
    assert_exactly_once(coord, total)
    # every result was acked: the device outbox drains
    # (its database and its result log)
    wait(lambda: outbox_count(tmp_path) == 0, 20, "outbox drained")
    dev.term()
    coord.stop()


def test_slow_coordinator_with_broker_dropping_messages_loses_nothing(tmp_path):
    """The broker may queue only 5 messages for the coordinator's session. The coordinator,
    slow to ingest, is first away altogether while the device publishes: the broker keeps 5
    of the device's messages for it and drops the rest (its log says so; a slow-but-online
    coordinator makes it drop only by a race of acks). What it dropped was never acked, so
    the device sends it again, and every result is stored exactly once."""
    b = Mosquitto(tmp_path, extra="max_queued_messages 5\nmax_inflight_messages 2").start()
    try:
        total = 400
        coord = start_coordinator(tmp_path, b, ingest_delay_s=0.05, ingest_batch=5)
        coord.stop()  # its session (subscriptions, 7 days' expiry) stays at the broker
        stats = tmp_path / "device-stats.json"
        dev = Device(tmp_path, b, total, stats=stats).start()
        log = tmp_path / "mosquitto.log"
        dropping = "Outgoing messages are being dropped for client coordinator."
        # the device's first burst alone (birth + 100 results in batches of 20) is over 5
        wait(lambda: dropping in log.read_text(), 60, "the broker dropping messages")
        coord = start_coordinator(tmp_path, b, ingest_delay_s=0.05, ingest_batch=5)
        wait(lambda: coord.store.counts().get("dev1", 0) >= total, 90, "all results stored")
        assert_exactly_once(coord, total)
        wait(lambda: json.loads(stats.read_text())["mqtt"]["acked_seq"] == total, 30,
             "the device's stats after the last ack")  # rewritten every 0.25 s
        mqtt_stats = json.loads(stats.read_text())["mqtt"]
        dev.term()
        coord.stop()
        # what the broker dropped was never acked, so the device sent it again
        assert mqtt_stats["resends"] > 0, mqtt_stats
        assert mqtt_stats["published_results"] > total, mqtt_stats
    finally:
        b.stop()


def test_shared_subscription_two_coordinators_one_store(tmp_path, broker):
    total = 300
    c1 = start_coordinator(tmp_path, broker, share_group="g", client_id="c1")
    c2 = start_coordinator(tmp_path, broker, share_group="g", client_id="c2")
    dev = Device(tmp_path, broker, total, rate=500).start()
    wait(lambda: c1.store.counts().get("dev1", 0) >= total, 60, "all results stored")
    assert c1.counters["result"] > 0 and c2.counters["result"] > 0  # the load was split
    assert_exactly_once(c1, total)
    dev.term()
    c1.stop()
    c2.stop()


def test_commands_through_coordinator_and_raw(tmp_path, broker):
    kid = commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    commands.generate_keypair(tmp_path / "evil.pem", tmp_path / "evil.pub")
    coord = start_coordinator(tmp_path, broker, signing_key=str(tmp_path / "k.pem"))
    dev = Device(tmp_path, broker, 5, trusted_key=tmp_path / "k.pub").start()
    wait(lambda: "dev1" in coord.views, 20, "device known")

    assert coord.send_command("dev1", "ping")["status"] == "done"
    reply = coord.send_command("dev1", "set_latency_target", {"ms": 12})
    assert reply["ok"] and reply["status"] == "accepted"
    wait(lambda: "cmd set_latency_target" in read_lines(tmp_path / "device.out"), 10,
          "the daemon side received the typed command")
    # the coordinator holds a command to the devices' gate before signing it
    with pytest.raises(commands.CommandRefused, match="set_rate: fps:"):
        coord.send_command("dev1", "set_rate", {"fps": -3})
    with pytest.raises(KeyError):
        coord.send_command("nosuchdevice", "ping")

    # Raw publishes: what a broken or hostile publisher could send.
    replies: list[dict] = []
    cli = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
    raw = broker.coordinator("test", "raw")  # may command: the device's own checks are tested
    cli.username_pw_set(raw.username, Path(raw.password_file).read_text().strip())
    cli.on_message = lambda c, u, m: replies.append(json.loads(m.payload))
    subacks: list[int] = []
    cli.on_subscribe = lambda c, u, mid, codes, p: subacks.append(mid)
    cli.connect("127.0.0.1", broker.port)
    _, mid = cli.subscribe(payloads.topic("test", "dev1", "cmd/reply"), 1)
    cli.loop_start()
    # the first reply would be lost if its command overtook the SUBSCRIBE (a fixed 0.3 s
    # sleep was a guess)
    wait(lambda: mid in subacks, 30, "the SUBACK of cmd/reply")
    good_key = commands.load_private_key(tmp_path / "k.pem")
    evil_key = commands.load_private_key(tmp_path / "evil.pem")
    valid = commands.sign(good_key, "dev1", "ping")
    tampered = dict(commands.sign(good_key, "dev1", "set_rate", {"fps": 1}), args={"fps": 999})
    expired = commands.sign(good_key, "dev1", "ping", now=time.time() - 120, ttl_s=60)
    unsigned = {k: v for k, v in commands.sign(good_key, "dev1", "ping").items() if k != "sig"}
    wrong_key = dict(commands.sign(evil_key, "dev1", "ping"), key_id=kid)
    other_device = commands.sign(good_key, "dev9", "ping")
    out_of_range = commands.sign(good_key, "dev1", "set_rate", {"fps": -3})
    cases = [
        (valid, "done"), (out_of_range, "set_rate: fps: expected a number"),
        (valid, "replayed"), (tampered, "bad signature"),
        (expired, "expired"), (unsigned, "sig"), (wrong_key, "bad signature"),
        (other_device, "addressed to device"), (b"{not json", "not JSON"),
        (b"{" + b" " * 9000 + b"}", "exceeds"),
    ]
    for payload, expect in cases:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        n = len(replies)
        cli.publish(payloads.topic("test", "dev1", "cmd"), body, qos=1)
        wait(lambda n=n: len(replies) > n, 30, f"reply to {expect}")
        got = replies[-1]
        assert expect in (got.get("reason") or "") or got["status"] == expect, got
    cli.loop_stop()
    cli.disconnect()
    # the device is still alive and answering
    assert coord.send_command("dev1", "ping")["status"] == "done"
    assert dev.proc.poll() is None
    dev.term()
    coord.stop()


def test_birth_death_after_kill9_and_clean_stop(tmp_path, broker):
    keepalive = 2
    coord = start_coordinator(tmp_path, broker)
    dev = Device(tmp_path, broker, 1, keepalive=keepalive).start()
    wait(lambda: coord.views.get("dev1") and coord.views["dev1"].status == "online", 20,
          "birth")
    assert coord.views["dev1"].versions == {"edgerun": "test"}
    dev.kill9()
    t0 = time.monotonic()
    wait(lambda: coord.views["dev1"].status == "offline", keepalive * 1.5 + 2, "death")
    assert time.monotonic() - t0 <= keepalive * 1.5 + 1.0  # broker-side detection + delivery
    assert coord.views["dev1"].reason == "connection lost"

    dev.start()
    wait(lambda: coord.views["dev1"].status == "online", 20, "rebirth")
    dev.term()
    wait(lambda: coord.views["dev1"].status == "offline", 30, "clean offline")
    assert coord.views["dev1"].reason == "clean shutdown"
    coord.stop()


def test_fleet_cli_over_the_api(tmp_path, broker, capsys):
    from runtime.cli import main
    from runtime.coordinator.api import serve

    commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    coord = start_coordinator(tmp_path, broker, signing_key=str(tmp_path / "k.pem"))
    api = serve(coord, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{api.server_address[1]}"
    token = ["--token-file", str(tmp_path / "api-token")]  # made next to the store
    dev = Device(tmp_path, broker, 20, trusted_key=tmp_path / "k.pub").start()
    try:
        wait(lambda: coord.store.counts().get("dev1", 0) >= 20, 20, "results")
        assert main(["fleet", "--api", url, *token, "ls"]) == 0
        out = capsys.readouterr().out
        assert "dev1" in out and "online" in out
        assert main(["fleet", "--api", url, *token, "show", "dev1"]) == 0
        assert "20 results at the coordinator" in capsys.readouterr().out  # the summary
        assert main(["fleet", "--api", url, *token, "show", "dev1", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["results_stored"] == 20 and shown["status"] == "online"
        assert main(["fleet", "--api", url, *token, "send", "dev1", "set_latency_target",
                     "ms=15"]) == 0
        assert capsys.readouterr().out.startswith("accepted")
        # refused by the coordinator's API (400 naming the argument), never sent
        with pytest.raises(SystemExit, match=r"set_rate: fps: .* got -1 \(HTTP 400\)"):
            main(["fleet", "--api", url, *token, "send", "dev1", "set_rate", "fps=-1"])
        with pytest.raises(SystemExit, match="unknown device"):
            main(["fleet", "--api", url, *token, "send", "nobody", "ping"])
    finally:
        dev.term()
        api.shutdown()
        coord.stop()
