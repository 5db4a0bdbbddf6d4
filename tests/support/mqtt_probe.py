"""Raw MQTT clients for tests: what an outsider, an enrolled identity or a hand-written
device could publish or see."""

from __future__ import annotations

import json
from pathlib import Path

import paho.mqtt.client as mqtt

from runtime.config.telemetry import BrokerConfig
from runtime.wire import payloads
from support.waiting import until, wait


class Probe:
    """A raw paho client logging in with a BrokerConfig (or anonymously) for ACL checks."""

    def __init__(self, port: int, cfg: BrokerConfig | None = None, client_id: str = "",
                 v5: bool = True, reconnect: bool = True):
        self.got: list[tuple[str, bytes]] = []
        self.connack: list = []
        self.disconnects: list = []
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  # False: once dropped it stays down (paho retries each 1 s)
                                  reconnect_on_failure=reconnect)
        if cfg is not None and cfg.username:
            self.client.username_pw_set(cfg.username,
                                        Path(cfg.password_file).read_text().strip())
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda c, u, f, rc, p: self.disconnects.append(rc)
        self.client.on_message = lambda c, u, m: self.got.append((m.topic, m.payload))
        self.subacks: set[int] = set()
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.subacks.add(mid)
        self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()
        until(lambda: self.connack, 30)  # a loaded box: seconds

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connack.append(reason_code)
        if reason_code.is_failure:
            # no retries: paho's reconnect wait would hold close() up for a second
            client.disconnect()

    @property
    def accepted(self) -> bool:
        return bool(self.connack) and not self.connack[0].is_failure

    def sub(self, topic: str) -> None:
        """Subscribe and wait for the broker's SUBACK (granted or refused): a publish from
        another connection right after would otherwise race the subscription."""
        _, mid = self.client.subscribe(topic, 1)
        assert until(lambda: mid in self.subacks, 30), f"no SUBACK for {topic} in 30 s"

    def pub(self, topic: str, body: bytes = b"{}", retain: bool = False) -> None:
        self.client.publish(topic, body, qos=1, retain=retain).wait_for_publish(30)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Sender:
    """A device identity publishing hand-made messages over MQTT (what a device could send)."""

    def __init__(self, cfg: BrokerConfig):
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        self.c.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
        self.c.connect(cfg.host, cfg.port)
        self.c.loop_start()

    def pub(self, device: str, kind: str, body: dict) -> None:
        self.c.publish(payloads.topic("test", device, kind), json.dumps(body).encode(),
                       qos=1).wait_for_publish(5)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


RICH_HEALTH = {"temp_c": 61.5, "passive_trip_c": 70.0, "throttled": False, "battery_frac": 0.42,
        "rung": 2, "rungs": 3, "accuracy": 0.91, "power_w": 3.25, "rung_energy_mj": 12.5,
        "governor": {"enabled": True, "level": 1},
        "pipeline": {"rate_hz": 8.0, "latency_ms": {"p50": 10.0, "p95": 18.0},
                     "frames_bad": {"total": 2}, "frames": 100, "results": 98},
        "slo": {"target_ms": 20.0, "compliance": 0.97},
        "backlog": {"results_held": 1500, "bytes": 4096, "oldest_seq": 3, "evicted_total": 0}}


class Outsider:
    """A plain MQTT client logging in as `cfg` says (anonymously when it has no username):
    what anyone could publish on an open broker, or what an enrolled identity may."""

    def __init__(self, cfg: BrokerConfig):
        self.got: list[tuple[str, bytes]] = []
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        if cfg.username:
            self.c.username_pw_set(cfg.username,
                                   Path(cfg.password_file).read_text().strip())
        self.c.on_message = lambda c, u, m: self.got.append((m.topic, m.payload))
        self.subacks: set[int] = set()
        self.c.on_subscribe = lambda c, u, mid, codes, p: self.subacks.add(mid)
        self.c.connect(cfg.host, cfg.port)
        self.c.loop_start()

    def sub(self, topic: str) -> None:
        """Subscribe and wait for the SUBACK (was: a 0.2 s sleep; a publish right after,
        e.g. the command the forger must answer, could overtake the SUBSCRIBE)."""
        _, mid = self.c.subscribe(topic, 1)
        wait(lambda: mid in self.subacks, 30, f"the SUBACK for {topic}")

    def pub(self, topic: str, body: bytes | dict, retain: bool = False) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.c.publish(topic, raw, qos=1, retain=retain).wait_for_publish(30)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def stream_of(out: Outsider, device="dev1") -> str:
    """The outbox stream id in `device`'s retained state message."""
    state_topic = payloads.topic("test", device, "state")
    out.sub(state_topic)
    wait(lambda: any(t == state_topic for t, _ in out.got), 30, "retained state")
    return json.loads([p for t, p in out.got if t == state_topic][-1])["stream"]
