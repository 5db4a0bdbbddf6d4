"""Telemetry throughput: outbox + broker + coordinator store vs bare paho, and fleet ingest.

All in one run on this machine, against one local Mosquitto:

1. edgerun end to end: results appended one by one to the outbox (fsync `full`, then `normal`),
   published by the device's Publisher, stored by a coordinator process, acked. Rate = N results
   / time from the first append until the coordinator's store holds all N.
2. bare paho: one QoS 1 message per result from a paho client (loop thread) to a subscriber
   process that only counts. No durability, no store, no acks: the ceiling of the transport.
3. fleet: 1,000 simulated devices each sending health every second to the coordinator for
   --fleet-s seconds; reports the coordinator's health age p50/p99 (health `t` to stored+viewed).

Usage: python bench/telemetry.py [--n 20000] [--fleet-s 10]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.config.telemetry import BrokerConfig, OutboxConfig, TelemetryConfig
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher
from runtime.wire.broker import Mosquitto, free_port, wait_port

_COUNTER = """
import sys, time, paho.mqtt.client as mqtt
n = int(sys.argv[2]); got = [0]; first = [0.0]
def on_message(c, u, m):
    if not got[0]: first[0] = time.time()
    got[0] += 1
    if got[0] == n:
        print(time.time(), flush=True)
c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
c.on_message = on_message
c.connect("127.0.0.1", int(sys.argv[1]))
c.subscribe("bare/#", 1)
print("ready", flush=True)
c.loop_forever()
"""


def _result(i: int) -> dict:
    return {"t": time.time(), "variant": "inspection/fp32@openvino:CPU/t1", "rung": 0,
            "label": "ok", "score": 0.97, "latency_ms": 1.2, "frame": i}


def start_coordinator(tmp: Path, port: int, name: str) -> tuple[subprocess.Popen, Path, int]:
    """`edgerun coordinator` as a process with its own store; returns (proc, store, api port)."""
    store = tmp / f"{name}.db"
    http = free_port()
    conf = tmp / f"{name}.toml"
    conf.write_text(f'[coordinator]\nfleet = "bench"\nstore = "{store}"\nhttp_port = {http}\n'
                    f'client_id = "{name}"\n[coordinator.broker]\nhost = "127.0.0.1"\n'
                    f"port = {port}\n")
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator", "--config",
                             str(conf)], stderr=subprocess.DEVNULL)
    wait_port(http, 30)
    return proc, store, http


def stored(store: Path) -> int:
    """Results in a coordinator store (read-only peek)."""
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        finally:
            db.close()
    except sqlite3.OperationalError:
        return 0


def edgerun_rate(tmp: Path, port: int, n: int, fsync: str) -> float:
    """Results/s through outbox, broker and coordinator store with the given fsync policy."""
    coord, store, _ = start_coordinator(tmp, port, f"coord-{fsync}")
    try:
        cfg = TelemetryConfig(fleet="bench", device=f"dev-{fsync}",
                              broker=BrokerConfig(host="127.0.0.1", port=port),
                              outbox=OutboxConfig(path=str(tmp / f"outbox-{fsync}.db"),
                                                  fsync=fsync),
                              batch_max=100, inflight=2000)
        outbox = Outbox(cfg.outbox)
        pub = Publisher(cfg, outbox)
        pub.start()
        deadline = time.monotonic() + 20
        while not pub.stats.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # let the coordinator subscribe
        t0 = time.time()
        for i in range(n):
            outbox.append(_result(i))
        append_s = time.time() - t0
        while stored(store) < n:
            time.sleep(0.01)
        elapsed = time.time() - t0
        pub.stop()
        outbox.close()
        print(f"  edgerun fsync={fsync:<6} {n / elapsed:8.0f} results/s end to end "
              f"(append alone {n / append_s:.0f}/s)", flush=True)
        return n / elapsed
    finally:
        coord.terminate()
        coord.wait(10)


def bare_rate(port: int, n: int) -> float:
    """Messages/s of a bare paho QoS 1 publisher to a counting subscriber process."""
    sub = subprocess.Popen([sys.executable, "-c", _COUNTER, str(port), str(n)],
                           stdout=subprocess.PIPE, text=True)
    assert sub.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    t0 = time.time()
    for i in range(n):
        client.publish("bare/dev/result", json.dumps(_result(i)), qos=1)
    t_end = float(sub.stdout.readline())
    client.loop_stop()
    client.disconnect()
    sub.terminate()
    rate = n / (t_end - t0)
    print(f"  bare paho QoS1      {rate:8.0f} messages/s (no durability, no store)", flush=True)
    return rate


def fleet_ingest(tmp: Path, port: int, devices: int, seconds: float) -> dict:
    """Health from `devices` simulated devices at 1 Hz; the coordinator's health age."""
    coord, _, http = start_coordinator(tmp, port, "coord-fleet")
    try:
        clients = []
        for k in range(4):  # 4 connections share the simulated fleet
            c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                            client_id=f"sim{k}")
            c.max_inflight_messages_set(1000)
            c.connect("127.0.0.1", port)
            c.loop_start()
            clients.append(c)
        time.sleep(0.5)
        sent, t_start = 0, time.time()
        for tick in range(int(seconds)):
            t_tick = t_start + tick
            for d in range(devices):
                body = json.dumps({"v": 1, "t": time.time(), "boot": "b", "temp_c": 50.0,
                                   "rung": 0, "choice": "x"})
                clients[d % 4].publish(f"edgerun/v1/bench/sim{d:04d}/health", body, qos=1)
                sent += 1
            time.sleep(max(0.0, t_tick + 1 - time.time()))
        time.sleep(2)
        # the API wants the token the coordinator made next to its store
        auth = {"Authorization": "Bearer " + (tmp / "api-token").read_text().strip()}
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{http}/api/v1/stats", headers=auth)) as r:
            stats = json.loads(r.read())
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{http}/api/v1/fleet", headers=auth)) as r:
            known = len(json.loads(r.read()))
        for c in clients:
            c.loop_stop()
            c.disconnect()
        ages = stats["health_age_s"]
        print(f"  fleet {devices} devices x {seconds:.0f} s: sent {sent}, stored "
              f"{stats['counters'].get('health', 0)}, devices known {known}, health age "
              f"p50 {ages['p50']:.3f} s p99 {ages['p99']:.3f} s", flush=True)
        return {"sent": sent, "stored": stats["counters"].get("health", 0), **ages}
    finally:
        coord.terminate()
        coord.wait(10)


def main() -> None:
    """Run all three and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--fleet-s", type=float, default=10)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        broker = Mosquitto(tmp, extra="max_queued_messages 0", auth=False).start()
        try:
            print(f"results: {a.n} per run, one local Mosquitto", flush=True)
            bare = bare_rate(broker.port, a.n)
            full = edgerun_rate(tmp, broker.port, a.n, "full")
            normal = edgerun_rate(tmp, broker.port, a.n, "normal")
            print(f"ratio edgerun/bare: normal {normal / bare:.2f}, full {full / bare:.2f} "
                  f"(target: normal >= 2000/s and >= 0.50)")
            fleet = fleet_ingest(tmp, broker.port, a.devices, a.fleet_s)
            print(f"fleet: health age p99 {fleet['p99']:.3f} s (target < 2 s), "
                  f"stored {fleet['stored']}/{fleet['sent']}")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
