"""Fuzz the wire: >= 10,000 random and malformed messages on every topic either side reads,
while a device process streams results to a coordinator over a real Mosquitto with ACLs on.
Afterwards: 0 results lost, 0 duplicated, every thread alive, both sides answering.

With ACLs on a stranger cannot publish at all (tests/wire/test_broker_acl.py), so the fuzz comes
from what is left: enrolled identities that are broken or compromised. Each message is
published by the identity the ACL lets publish on its topic: a second coordinator of the
fleet on the device's `ack` and `cmd`, an identity granted the device's topics on its topics
(a broken ACL; the device's own login would take over its session, since the broker binds
client ids to usernames: tests/wire/test_client_ids.py), enrolled devices `fuzz0`..`fuzz4` on
theirs. The final counts
check that the broker delivered the fuzz (nothing was silently refused by the ACL).

Forged but *well-formed* traffic for the real device's own stream (an ack with a plausible
seq, a result with a valid seq) is out of scope here: from a holder of the right login it
cannot be told from the real thing. Everything else is in:
random bytes, deep nesting, wrong types, huge numbers, huge payloads, truncations, valid
traffic for other (invented) devices, and acks for the real stream beyond what it sent.

`EDGERUN_FUZZ_N` sets the message count (default 10,000, the CI size).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
from support.fleet import Device, key_of, outbox_count, start_coordinator
from support.mqtt_probe import stream_of
from support.waiting import wait

from runtime.config.telemetry import BrokerConfig
from runtime.coordinator.api import serve
from runtime.wire import payloads
from runtime.wire.brokerauth import Identity

N = int(os.environ.get("EDGERUN_FUZZ_N", "10000"))
DEVICE_TOPICS = ("ack", "cmd")
COORD_TOPICS = ("result", "health", "state", "event", "cmd/reply")
ODD = ["x", "", [], {}, [1, [2]], None, True, False, -1, 0, 1.5, 2 ** 62, "9" * 30]
HUGE = ["2" + "0" * 30, "9223372036854775808", "-9223372036854775809", "1e400", "-1e400",
        "NaN", "Infinity", "9e15", "4611686018427387904", "1e308"]


def _template(kind: str, rng: random.Random, stream: str) -> dict:
    t = time.time()
    if kind == "result":
        return {"v": 1, "stream": stream, "boot": "b", "floor": 1,
                "results": [{"seq": rng.randint(1, 10), "t": t, "label": "ok", "score": 0.5}]}
    if kind == "health":
        return {"v": 1, "t": t, "boot": "b", "temp_c": 50.0, "backlog": {
            "results_held": 1, "evicted_total": 0}, "slo": {"compliance": 1.0},
            "governor": {"enabled": True}, "mqtt": {"connected": True}}
    if kind == "state":
        return {"v": 1, "online": True, "boot": "b", "t": t, "stream": stream}
    if kind == "event":
        return {"v": 1, "t": t, "type": "x", "severity": "info"}
    if kind == "cmd/reply":
        return {"v": 1, "id": "0123456789", "ok": True, "status": "done", "t": t,
                "device": "dev1"}
    if kind == "ack":
        return {"v": 1, "stream": stream, "seq": 1, "from": 1}
    return {"v": 1, "id": "0123456789", "device": "dev1", "cmd": "ping", "args": {},
            "issued_at": t, "expires_at": t + 60, "key_id": "k", "sig": "AAAA"}


def _mutate(obj, rng: random.Random, value=None):
    """Replace one member somewhere in `obj` with `value` (default: one of another type)."""
    node = obj
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return obj
        k = rng.choice(keys)
        if isinstance(node[k], dict | list) and node[k] and rng.random() < 0.5:
            node = node[k]
            continue
        node[k] = rng.choice(ODD) if value is None else value
        return obj


def _huge_number(obj, rng: random.Random) -> bytes:
    """`obj` as JSON with one member replaced by an out-of-range number literal."""
    text = json.dumps(_mutate(obj, rng, "__HUGE__"))
    return text.replace('"__HUGE__"', rng.choice(HUGE)).encode()


def messages(rng: random.Random, stream: str, n: int):
    """(topic, payload) pairs: every kind of bad input, spread over both sides' topics."""
    for i in range(n):
        side = rng.random()
        if side < 0.4:
            kind, device = rng.choice(DEVICE_TOPICS), "dev1"
        elif side < 0.9:
            kind, device = rng.choice(COORD_TOPICS), "dev1"
        else:  # well-formed traffic for devices that do not exist
            kind = rng.choice(COORD_TOPICS)
            device = f"fuzz{rng.randint(0, 4)}"
        topic = payloads.topic("test", device, kind)
        real = device == "dev1"
        # Acks for the real stream only with values the device must refuse; other
        # well-formed dev1 traffic uses invented streams/boots (see the module docstring).
        base = _template(kind, rng, stream if kind == "ack" and real else f"fz{i % 97}")
        how = rng.random()
        if how < 0.15:
            body = rng.randbytes(rng.randint(0, 600))
        elif how < 0.25:
            depth = rng.choice([20, 100, 1000, 5000, 50_000])
            body = (rng.choice(["[", '{"a":']) * depth).encode()
        elif how < 0.5:
            body = json.dumps(_mutate(base, rng)).encode()
        elif how < 0.65:
            body = _huge_number(base, rng)
        elif how < 0.75:
            text = json.dumps(base)
            body = text[:rng.randint(0, len(text) - 1)].encode()  # truncated
        elif how < 0.752:
            body = json.dumps({**base, "pad": "x" * rng.choice([70_000, 1_100_000, 2_500_000])
                               }).encode()  # huge payloads
        elif kind == "ack" and real:
            body = json.dumps({**base, "seq": rng.randint(10 ** 6, 2 ** 62 - 1),
                               "from": rng.randint(1, 3)}).encode()  # beyond anything sent
        elif real:
            body = json.dumps(_mutate(base, rng)).encode()
        else:
            body = json.dumps(base).encode()  # valid, for an invented device
        yield topic, body


def _client(cfg: BrokerConfig, client_id: str) -> mqtt.Client:
    """A raw paho client logged in as `cfg`, its network loop running."""
    c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    c.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    c.max_inflight_messages_set(1000)
    c.connect(cfg.host, cfg.port)
    c.loop_start()
    return c


def test_fuzz_every_inbound_topic_while_streaming(tmp_path, broker):
    total = 1500
    rng = random.Random(12)
    coord = start_coordinator(tmp_path, broker, signing_key=key_of(tmp_path))
    api = serve(coord, "127.0.0.1", 0)
    stats = tmp_path / "device-stats.json"
    dev = Device(tmp_path, broker, total, rate=300, trusted_key=tmp_path / "k.pub",
                 stats=stats).start()
    # One fuzzing client per identity (see the module docstring), keyed by the device whose
    # topics it may publish on; None: the coordinator side (ack, cmd).
    misgranted = Identity("fuzz-dev1", "coordinator", fleets=("test",),
                          write=("edgerun/v1/test/dev1/#",))
    logins = {None: broker.coordinator("test", "fuzzer"), "dev1": broker.credentials(misgranted),
              **{f"fuzz{k}": broker.device("test", f"fuzz{k}") for k in range(5)}}
    fuzzers = {who: _client(cfg, f"fuzz-{who}") for who, cfg in logins.items()}
    try:
        from support.mqtt_probe import Outsider

        probe = Outsider(broker.coordinator("test", "probe"))  # its own: one identity a
        # connection (the fuzzer's login would take over the fuzzer's session)
        stream = stream_of(probe)
        probe.close()
        sent: dict[str, int] = {}
        last: dict[str | None, mqtt.MQTTMessageInfo] = {}
        t0 = time.monotonic()
        for i, (topic, body) in enumerate(messages(rng, stream, N)):
            device, kind = topic.split("/", 4)[3:]
            who = None if kind in DEVICE_TOPICS else device
            last[who] = fuzzers[who].publish(topic, body, qos=1)
            sent[kind] = sent.get(kind, 0) + 1
            if i % 500 == 499:
                for info in last.values():
                    info.wait_for_publish(10)  # keep the broker's queues bounded
        for info in last.values():
            info.wait_for_publish(30)
        fuzz_s = time.monotonic() - t0

        def real() -> list[int]:  # the device's own stream (fuzz adds invented ones to dev1)
            return [q for s, q in coord.store.result_seqs("dev1") if s == stream]

        wait(lambda: len(real()) >= total, 90, "every result stored")
        assert real() == list(range(1, total + 1))  # 0 lost, 0 duplicated, no gap
        wait(lambda: outbox_count(tmp_path) == 0, 30, "device outbox drained")
        reply = coord.send_command("dev1", "ping")
        assert reply["status"] == "done" and reply["verified"] is True  # device answers
        url = f"http://127.0.0.1:{api.server_address[1]}/api/v1/fleet"
        token = (tmp_path / "api-token").read_text().strip()  # made next to the store
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:  # coordinator answers
            fleet_rows = json.loads(resp.read())
        dev1 = next(r for r in fleet_rows if r["device"] == "dev1")
        assert dev1["status"] == "online"
        assert all(coord.threads_alive().values())
        time.sleep(0.5)
        dstats = json.loads(stats.read_text())
        assert "mqtt" in dstats["threads"] and dev.proc.poll() is None
        q = coord.stats()["quarantined"]
        print(f"\nfuzz: {N} messages in {fuzz_s:.1f} s, by topic {sent}; results "
              f"{total} stored exactly once (0 lost, 0 duplicated); coordinator quarantined "
              f"{q['total']} (dev1 {dev1['quarantined']}); device quarantined "
              f"{dstats['mqtt']['quarantined']} (acks refused {dstats['mqtt']['acks_refused']},"
              f" commands refused {dstats['mqtt']['commands_refused']}); threads alive: "
              f"coordinator {coord.threads_alive()}, device {dstats['threads']}")
        # Most fuzz is refused on both sides (the rest is valid traffic of invented devices).
        assert dstats["mqtt"]["quarantined"] > 0.5 * (sent.get("ack", 0) + sent.get("cmd", 0))
        assert q["total"] > 0.5 * sum(v for k, v in sent.items() if k not in DEVICE_TOPICS)
        # ... and the enrolled fuzz devices' messages got through the ACL too.
        seen = set(coord.views) | set(coord.store.quarantine_counts())
        assert {f"fuzz{k}" for k in range(5)} <= seen
    finally:
        for fuzzer in fuzzers.values():
            fuzzer.loop_stop()
            fuzzer.disconnect()
        dev.term()
        api.shutdown()
        coord.stop()
