"""Telemetry against a real Mosquitto: delivery through faults, commands, birth/death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire import commands, payloads
from runtime.wire.broker import Mosquitto

DEVICE_PROC = str(Path(__file__).parents[1] / "device_proc.py")


def _coordinator(tmp_path, broker: Mosquitto, **kw) -> Coordinator:
    kw.setdefault("device_keys", str(tmp_path / "keys"))
    creds = broker.coordinator("test", kw.get("client_id", "coordinator"), keepalive_s=5)
    cfg = CoordinatorConfig(fleet="test", broker=creds,
                            store=str(tmp_path / "coord.db"), **kw)
    c = Coordinator(cfg)
    c.start()
    assert c.connected.wait(30)
    return c


class Device:
    """tests/device_proc.py as a child process."""

    def __init__(self, tmp_path, broker: Mosquitto, total, **kw):
        creds = broker.device("test", kw.get("device", "dev1"))
        # The device's reply-signing key (the publisher's default path, next to its outbox)
        # and its public half where the coordinator looks (coordinator.device_keys).
        if not (tmp_path / "device.key").exists():
            (tmp_path / "keys").mkdir(exist_ok=True)
            commands.generate_keypair(tmp_path / "device.key", tmp_path / "keys" / "dev1.pub")
        self.args = [sys.executable, DEVICE_PROC, "--outbox", str(tmp_path / "dev.db"),
                     "--port", str(broker.port), "--total", str(total),
                     "--username", creds.username, "--password-file", creds.password_file]
        for k, v in kw.items():
            self.args += [f"--{k.replace('_', '-')}", str(v)]
        self.log = (tmp_path / "device.out").open("a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Device:
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def term(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)


def _wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _assert_exactly_once(coord: Coordinator, total: int, device="dev1"):
    rows = coord.store.result_seqs(device)
    streams = {s for s, _ in rows}
    assert len(streams) == 1
    seqs = [q for _, q in rows]
    assert seqs == list(range(1, total + 1))
    ordered = [r["seq"] for r in coord.store.results(device, 0, total + 10)]
    assert sorted(ordered) == seqs


def test_broker_restart_and_device_kill9_and_coordinator_down_lose_nothing(tmp_path, broker):
    total = 600
    coord = _coordinator(tmp_path, broker)
    dev = Device(tmp_path, broker, total, rate=300).start()
    _wait(lambda: coord.store.counts().get("dev1", 0) > 50, 20, "first results")
    broker.stop()  # broker down while the device keeps appending
    time.sleep(0.5)
    broker.start()
    _wait(lambda: coord.store.counts().get("dev1", 0) > 250, 30, "results after broker restart")
    dev.kill9()  # device killed mid-stream, restarted on the same outbox
    dev.start()
    coord.stop()  # coordinator down for a while; the device keeps publishing
    time.sleep(1.0)
    coord = _coordinator(tmp_path, broker)
    _wait(lambda: coord.store.counts().get("dev1", 0) >= total, 60, "all results stored")
    time.sleep(0.5)
    _assert_exactly_once(coord, total)
    # every result was acked: the device outbox drains
    db_path = tmp_path / "dev.db"
    import sqlite3

    _wait(lambda: sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM results"
                                                   ).fetchone()[0] == 0, 20, "outbox drained")
    dev.term()
    coord.stop()


def test_slow_coordinator_with_broker_dropping_messages_loses_nothing(tmp_path):
    b = Mosquitto(tmp_path, extra="max_queued_messages 5\nmax_inflight_messages 2").start()
    try:
        total = 400
        coord = _coordinator(tmp_path, b, ingest_delay_s=0.05, ingest_batch=5)
        dev = Device(tmp_path, b, total).start()
        _wait(lambda: coord.store.counts().get("dev1", 0) >= total, 90, "all results stored")
        _assert_exactly_once(coord, total)
        dev.term()
        coord.stop()
        log = (tmp_path / "mosquitto.log").read_text()
        assert "Outgoing messages are being dropped" in log or coord.counters["result"] > 0
    finally:
        b.stop()


def test_shared_subscription_two_coordinators_one_store(tmp_path, broker):
    total = 300
    c1 = _coordinator(tmp_path, broker, share_group="g", client_id="c1")
    c2 = _coordinator(tmp_path, broker, share_group="g", client_id="c2")
    dev = Device(tmp_path, broker, total, rate=500).start()
    _wait(lambda: c1.store.counts().get("dev1", 0) >= total, 60, "all results stored")
    assert c1.counters["result"] > 0 and c2.counters["result"] > 0  # the load was split
    _assert_exactly_once(c1, total)
    dev.term()
    c1.stop()
    c2.stop()


def _read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_commands_through_coordinator_and_raw(tmp_path, broker):
    kid = commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    commands.generate_keypair(tmp_path / "evil.pem", tmp_path / "evil.pub")
    coord = _coordinator(tmp_path, broker, signing_key=str(tmp_path / "k.pem"))
    dev = Device(tmp_path, broker, 5, trusted_key=tmp_path / "k.pub").start()
    _wait(lambda: "dev1" in coord.views, 20, "device known")

    assert coord.send_command("dev1", "ping")["status"] == "done"
    reply = coord.send_command("dev1", "set_latency_target", {"ms": 12})
    assert reply["ok"] and reply["status"] == "accepted"
    _wait(lambda: "cmd set_latency_target" in _read_lines(tmp_path / "device.out"), 10,
          "the daemon side received the typed command")
    assert not coord.send_command("dev1", "set_rate", {"fps": -3})["ok"]
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
    _wait(lambda: mid in subacks, 30, "the SUBACK of cmd/reply")
    good_key = commands.load_private_key(tmp_path / "k.pem")
    evil_key = commands.load_private_key(tmp_path / "evil.pem")
    valid = commands.sign(good_key, "dev1", "ping")
    tampered = dict(commands.sign(good_key, "dev1", "set_rate", {"fps": 1}), args={"fps": 999})
    expired = commands.sign(good_key, "dev1", "ping", now=time.time() - 120, ttl_s=60)
    unsigned = {k: v for k, v in commands.sign(good_key, "dev1", "ping").items() if k != "sig"}
    wrong_key = dict(commands.sign(evil_key, "dev1", "ping"), key_id=kid)
    other_device = commands.sign(good_key, "dev9", "ping")
    cases = [
        (valid, "done"), (valid, "replayed"), (tampered, "bad signature"),
        (expired, "expired"), (unsigned, "sig"), (wrong_key, "bad signature"),
        (other_device, "addressed to device"), (b"{not json", "not JSON"),
        (b"{" + b" " * 9000 + b"}", "exceeds"),
    ]
    for payload, expect in cases:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        n = len(replies)
        cli.publish(payloads.topic("test", "dev1", "cmd"), body, qos=1)
        _wait(lambda n=n: len(replies) > n, 30, f"reply to {expect}")
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
    coord = _coordinator(tmp_path, broker)
    dev = Device(tmp_path, broker, 1, keepalive=keepalive).start()
    _wait(lambda: coord.views.get("dev1") and coord.views["dev1"].status == "online", 20,
          "birth")
    assert coord.views["dev1"].versions == {"edgerun": "test"}
    dev.kill9()
    t0 = time.monotonic()
    _wait(lambda: coord.views["dev1"].status == "offline", keepalive * 1.5 + 2, "death")
    assert time.monotonic() - t0 <= keepalive * 1.5 + 1.0  # broker-side detection + delivery
    assert coord.views["dev1"].reason == "connection lost"

    dev.start()
    _wait(lambda: coord.views["dev1"].status == "online", 20, "rebirth")
    dev.term()
    _wait(lambda: coord.views["dev1"].status == "offline", 30, "clean offline")
    assert coord.views["dev1"].reason == "clean shutdown"
    coord.stop()


def test_fleet_cli_over_the_api(tmp_path, broker, capsys):
    from runtime.cli import main
    from runtime.coordinator.api import serve

    commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    coord = _coordinator(tmp_path, broker, signing_key=str(tmp_path / "k.pem"))
    api = serve(coord, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{api.server_address[1]}"
    token = ["--token-file", str(tmp_path / "api-token")]  # made next to the store
    dev = Device(tmp_path, broker, 20, trusted_key=tmp_path / "k.pub").start()
    try:
        _wait(lambda: coord.store.counts().get("dev1", 0) >= 20, 20, "results")
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
        assert main(["fleet", "--api", url, *token, "send", "dev1", "set_rate", "fps=-1"]) == 1
        assert "refused" in capsys.readouterr().out
        with pytest.raises(SystemExit, match="unknown device"):
            main(["fleet", "--api", url, *token, "send", "nobody", "ping"])
    finally:
        dev.term()
        api.shutdown()
        coord.stop()
