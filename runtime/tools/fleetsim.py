"""A fleet simulator: N devices speaking the device protocol from one process.

Each simulated device has a boot id, a result stream, an in-memory outbox and the device's
ack rules (client.py): results go out in batches `{"v", "stream", "boot", "floor", "results"}`
and leave the outbox only when an ack `{stream, seq, from}` covers them with `from` at or
below the outbox's floor; what is not acked within `ack_timeout_s` is re-sent. Each device
publishes a retained birth at start and a retained clean-shutdown state at stop, health every
`health_s` and a result every `result_s` (each device's phase is random, so the load is
spread). Devices share `connections` MQTT connections (one paho client and thread each, so
10,000 devices do not need 10,000 sockets); MQTT carries one will per connection, so the will
of a connection is its first device's `connection lost` state.

Usage: python -m runtime.tools.fleetsim --port 1883 --devices 1000 --health-s 1 --result-s 1 \\
           --seconds 30 [--fleet bench] [--connections 8]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from runtime.wire import payloads


@dataclass
class SimDevice:
    """One simulated device's protocol state."""

    name: str
    boot: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    stream: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    outbox: dict[int, str] = field(default_factory=dict)  # seq -> result JSON, until acked
    last_seq: int = 0
    acked: int = 0
    sent_upto: int = 0
    last_progress: float = 0.0
    timeout_scale: int = 1  # doubles after each re-send, up to 8, as client.py does
    next_health: float = 0.0
    next_result: float = 0.0
    acks_refused: int = 0


@dataclass
class SimStats:
    """What the simulator did (totals over all devices)."""

    results_appended: int = 0
    results_published: int = 0
    resent: int = 0
    health_published: int = 0
    acks: int = 0
    acks_refused: int = 0
    publish_errors: int = 0


class _Group:
    """The devices of one MQTT connection, driven by one thread."""

    def __init__(self, sim: FleetSim, k: int, devices: list[SimDevice]):
        self.sim, self.k, self.devices = sim, k, devices
        self.by_name = {d.name: d for d in devices}
        self.lock = threading.Lock()
        first = devices[0]
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"fleetsim-{sim.fleet}-{k}-{uuid.uuid4().hex[:6]}",
                                  protocol=mqtt.MQTTv5)
        self.client.max_inflight_messages_set(sim.inflight)
        self.client.max_queued_messages_set(0)
        if sim.username:
            self.client.username_pw_set(sim.username, sim.password)
        will = {"v": payloads.VERSION, "online": False, "boot": first.boot, "t": time.time(),
                "reason": "connection lost"}
        self.client.will_set(payloads.topic(sim.fleet, first.name, "state"),
                             payloads.encode("state", will), qos=1, retain=True)
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.connected = threading.Event()

    def _on_connect(self, client, userdata, flags, rc, props=None) -> None:
        if rc == 0:
            # each device's own ack topic (a wildcard would bring every group every ack)
            topics = [(payloads.topic(self.sim.fleet, d.name, "ack"), 1) for d in self.devices]
            for i in range(0, len(topics), 100):
                client.subscribe(topics[i:i + 100])
            self.connected.set()

    def _on_message(self, client, userdata, msg) -> None:
        parsed = payloads.parse_topic(msg.topic)
        dev = self.by_name.get(parsed[1]) if parsed else None
        if dev is None:
            return
        try:
            ack = payloads.decode("ack", msg.payload)
        except payloads.PayloadError:
            self.sim.stats.acks_refused += 1
            return
        with self.lock:
            floor = min(dev.outbox) if dev.outbox else dev.last_seq + 1
            if ack["stream"] != dev.stream or ack["seq"] <= dev.acked:
                return
            if ack["seq"] > dev.last_seq or ack["from"] > floor:
                dev.acks_refused += 1  # the device's own checks (client.py)
                self.sim.stats.acks_refused += 1
                return
            for q in range(max(dev.acked + 1, floor), ack["seq"] + 1):
                dev.outbox.pop(q, None)
            dev.acked = ack["seq"]
            dev.sent_upto = max(dev.sent_upto, dev.acked)
            dev.last_progress = time.monotonic()
            dev.timeout_scale = 1
            self.sim.stats.acks += 1

    def _publish(self, device: SimDevice, kind: str, body: bytes, retain: bool = False
                 ) -> None:
        info = self.client.publish(payloads.topic(self.sim.fleet, device.name, kind), body,
                                   qos=1, retain=retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self.sim.stats.publish_errors += 1

    def birth(self) -> None:
        now = time.time()
        for d in self.devices:
            self._publish(d, "state", payloads.encode("state", {
                "v": payloads.VERSION, "online": True, "boot": d.boot, "t": now,
                "stream": d.stream, "versions": {"edgerun": "fleetsim"}}), retain=True)

    def goodbye(self) -> None:
        now = time.time()
        for d in self.devices:
            self._publish(d, "state", payloads.encode("state", {
                "v": payloads.VERSION, "online": False, "boot": d.boot, "t": now,
                "reason": "clean shutdown"}), retain=True)

    def step(self, appending: bool) -> None:
        """One pass over the group's devices: due health, due results, re-sends."""
        sim, now_m, now = self.sim, time.monotonic(), time.time()
        for d in self.devices:
            if appending and now_m >= d.next_health:
                # a late pass does not burst: at most one health per period
                d.next_health = max(d.next_health + sim.health_s, now_m)
                body = json.dumps({"v": 1, "t": now, "boot": d.boot, "temp_c": 50.0,
                                   "rung": 0, "choice": "sim"}, separators=(",", ":"))
                self._publish(d, "health", body.encode())
                sim.stats.health_published += 1
            with self.lock:
                if appending and now_m >= d.next_result:
                    d.next_result = max(d.next_result + sim.result_s, now_m)
                    d.last_seq += 1
                    d.outbox[d.last_seq] = json.dumps(
                        {"seq": d.last_seq, "t": now, "label": "ok", "score": 0.9,
                         "latency_ms": 3.2}, separators=(",", ":"))
                    sim.stats.results_appended += 1
                if d.sent_upto > d.acked and (
                        now_m - d.last_progress > sim.ack_timeout_s * d.timeout_scale):
                    sim.stats.resent += d.sent_upto - d.acked
                    d.sent_upto = d.acked  # re-send everything not acked
                    d.last_progress = now_m
                    d.timeout_scale = min(8, d.timeout_scale * 2)  # back off, as devices do
                if d.last_seq > d.sent_upto and d.outbox:
                    floor = min(d.outbox)
                    seqs = [q for q in range(max(d.sent_upto + 1, floor), d.last_seq + 1)
                            if q in d.outbox][:sim.batch_max]
                    if not seqs:
                        continue
                    body = (f'{{"v":1,"stream":"{d.stream}","boot":"{d.boot}",'
                            f'"floor":{floor},"results":['
                            + ",".join(d.outbox[q] for q in seqs) + "]}")
                    if d.sent_upto == d.acked:
                        d.last_progress = now_m
                    d.sent_upto = seqs[-1]
                    self._publish(d, "result", body.encode())
                    sim.stats.results_published += len(seqs)


class FleetSim:
    """N simulated devices on a broker (see module docstring)."""

    def __init__(self, host: str, port: int, devices: int, fleet: str = "bench",
                 health_s: float = 1.0, result_s: float = 1.0, connections: int = 4,
                 ack_timeout_s: float = 5.0, batch_max: int = 100, inflight: int = 1000,
                 username: str = "", password: str = "", prefix: str = "sim", seed: int = 1):
        self.host, self.port, self.fleet = host, port, fleet
        self.health_s, self.result_s = health_s, result_s
        self.ack_timeout_s, self.batch_max, self.inflight = ack_timeout_s, batch_max, inflight
        self.username, self.password = username, password
        self.stats = SimStats()
        self._rng = random.Random(seed)
        width = max(5, len(str(devices)))
        self.devices = [SimDevice(f"{prefix}{i:0{width}d}") for i in range(devices)]
        n = max(1, min(connections, devices))
        self.groups = [_Group(self, k, self.devices[k::n]) for k in range(n)]
        self._stop = threading.Event()
        self._appending = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, timeout_s: float = 30.0) -> FleetSim:
        """Connect every group, publish births, start health and results."""
        for g in self.groups:
            g.client.connect(self.host, self.port, keepalive=30)
            g.client.loop_start()
        for g in self.groups:
            if not g.connected.wait(timeout_s):
                raise TimeoutError(f"fleetsim connection {g.k} did not connect")
        time.sleep(0.3)  # let the ack subscriptions settle
        for g in self.groups:
            g.birth()
        t0 = time.monotonic()
        for d in self.devices:  # a random phase each, so the load is spread over a period
            d.next_health = t0 + self._rng.random() * self.health_s
            d.next_result = t0 + self._rng.random() * self.result_s
        self._appending.set()
        for g in self.groups:
            t = threading.Thread(target=self._run, args=(g,), name=f"fleetsim-{g.k}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _run(self, g: _Group) -> None:
        while not self._stop.is_set():
            g.step(self._appending.is_set())
            self._stop.wait(0.02)

    def stop_appending(self) -> None:
        """Stop new health and results; outboxes keep draining (re-sends go on)."""
        self._appending.clear()

    def unacked(self) -> int:
        """Results still held in the simulated outboxes."""
        return sum(len(d.outbox) for d in self.devices)

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until every outbox is empty (every result acked)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.unacked() == 0:
                return True
            time.sleep(0.1)
        return self.unacked() == 0

    def stop(self) -> None:
        """Publish clean-shutdown states, then disconnect."""
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for g in self.groups:
            g.goodbye()
        time.sleep(0.5)
        for g in self.groups:
            g.client.disconnect()
            g.client.loop_stop()


def main() -> None:
    """Run a simulated fleet for --seconds, then drain and print the totals as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--fleet", default="bench")
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--health-s", type=float, default=1.0)
    ap.add_argument("--result-s", type=float, default=1.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--drain-s", type=float, default=60.0)
    a = ap.parse_args()
    sim = FleetSim(a.host, a.port, a.devices, a.fleet, a.health_s, a.result_s,
                   a.connections).start()
    time.sleep(a.seconds)
    sim.stop_appending()
    drained = sim.wait_drained(a.drain_s)
    sim.stop()
    print(json.dumps({"drained": drained, "unacked": sim.unacked(), **vars(sim.stats)}))


if __name__ == "__main__":
    main()
