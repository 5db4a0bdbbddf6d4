"""An independent Sparkplug B host for tests: the Tahu schema compiled here, by protoc
(grpcio-tools) into a descriptor set loaded in a pool of its own (not the _pb2 module
edgerun encodes with), and the spec's rules a host relies on, checked on every message."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = Path(__file__).resolve().parents[2] / "runtime/telemetry/sparkplug/sparkplug_b.proto"


@functools.cache
def payload_class() -> Any:
    """The Payload message class, compiled from the .proto by protoc in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spb.desc"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}",
                        f"--descriptor_set_out={out}", PROTO.name], check=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("org.eclipse.tahu.protobuf.Payload"))


def decode(raw: bytes) -> Any:
    """A Payload from bytes, by the independent schema."""
    return payload_class().FromString(raw)


def value(m: Any) -> Any:
    """A metric's value (None when null)."""
    return None if m.is_null else getattr(m, m.WhichOneof("value"))


@dataclass
class Message:
    """One Sparkplug message as a host saw it."""

    kind: str  # NBIRTH, DDATA, ...
    device: str
    payload: Any

    def metrics(self) -> dict[str, Any]:
        """name -> Metric (the last of a name)."""
        return {m.name: m for m in self.payload.metrics}


@dataclass
class Host:
    """Collects an edge node's messages (in arrival order) and checks the rules: `seq`
    continuity (NBIRTH 0, then +1 mod 256 on every message but NDEATH), NDEATH's bdSeq =
    the NBIRTH's, no data before the births of its connection, every birth metric typed."""

    messages: list[Message] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: int | None = None
    _bd_seq: int | None = None
    _born: set[str] = field(default_factory=set)
    _node_born: bool = False

    def on_message(self, topic: str, raw: bytes) -> None:
        """Feed one message from spBv1.0/# (STATE ignored)."""
        parts = topic.split("/")
        if parts[1] == "STATE":
            return
        kind, device = parts[2], parts[4] if len(parts) > 4 else ""
        if kind in ("NCMD", "DCMD"):
            return
        p = decode(raw)
        with self.lock:
            self.messages.append(Message(kind, device, p))
            self._check(kind, device, p)

    def _bad(self, why: str) -> None:
        self.violations.append(f"#{len(self.messages)}: {why}")

    def _check(self, kind: str, device: str, p: Any) -> None:
        names = {m.name: m for m in p.metrics}
        if kind == "NDEATH":
            if p.HasField("seq"):
                self._bad("NDEATH carries a seq")
            bd = value(names["bdSeq"]) if "bdSeq" in names else None
            if bd != self._bd_seq:
                self._bad(f"NDEATH bdSeq {bd} != NBIRTH's {self._bd_seq}")
            self._node_born, self._born, self._seq = False, set(), None
            return
        if not p.HasField("seq"):
            self._bad(f"{kind} without seq")
            return
        if kind == "NBIRTH":
            if p.seq != 0:
                self._bad(f"NBIRTH seq {p.seq}")
            if "bdSeq" not in names or "Node Control/Rebirth" not in names:
                self._bad("NBIRTH without bdSeq or Node Control/Rebirth")
            else:
                self._bd_seq = value(names["bdSeq"])
            self._node_born, self._born, self._seq = True, set(), 0
        else:
            if self._seq is None or p.seq != (self._seq + 1) % 256:
                self._bad(f"{kind}/{device} seq {p.seq} after {self._seq}")
            self._seq = p.seq
            if not self._node_born:
                self._bad(f"{kind}/{device} before NBIRTH")
            if kind == "DBIRTH":
                self._born.add(device)
            elif kind in ("DDATA", "DDEATH") and device not in self._born:
                self._bad(f"{kind}/{device} before its DBIRTH")
        if kind.endswith("BIRTH"):
            for m in p.metrics:
                if not m.datatype or not m.name:
                    self._bad(f"{kind} metric {m.name!r} without name or datatype")

    def of(self, kind: str, device: str = "") -> list[Message]:
        """The messages of a kind (and device) so far."""
        with self.lock:
            return [m for m in self.messages if m.kind == kind and
                    (not device or m.device == device)]

    def by_seq(self, device: str) -> dict[int, dict[str, Any]]:
        """The device's metrics as a host holds them (births set them, data updates them: a
        data message carries only what changed) at the first message of each result's
        `Last Result/Seq`, with `historical`: whether that message's Seq was historical."""
        with self.lock:
            messages = [m for m in self.messages if m.device == device]
        held: dict[str, Any] = {}
        out: dict[int, dict[str, Any]] = {}
        for m in messages:
            ms = m.metrics()
            held.update({k: value(v) for k, v in ms.items()})
            if "Last Result/Seq" in ms and held["Last Result/Seq"] is not None:
                # the first message of a result (a live DDATA after history may repeat it)
                out.setdefault(held["Last Result/Seq"], {
                    **held, "historical": ms["Last Result/Seq"].is_historical})
        return out


def state(online: bool, ts_ms: int) -> bytes:
    """A 3.0 primary host STATE payload."""
    return json.dumps({"online": online, "timestamp": ts_ms}).encode()


class PrimaryHost:
    """A 3.0 primary host application on a real broker (tests and bench/sparkplug_soak.py):
    its will is STATE offline; on every (re)connect it subscribes to spBv1.0/# and then says
    STATE online (retained, a newer timestamp each time), so a node gated on it
    (`primary_host_id`) births only once this host is listening (no birth missed across a
    broker restart). Every message goes to `host` (a Host) for the rules."""

    def __init__(self, broker: Any, group: str, node: str, host_id: str = "scada"):
        import time

        import paho.mqtt.client as mqtt

        cfg = broker.client(host_id, read=("spBv1.0/#",),
                            write=(f"spBv1.0/STATE/{host_id}", f"spBv1.0/{group}/NCMD/{node}"))
        self.host, self.topic = Host(), f"spBv1.0/STATE/{host_id}"
        self._time = time
        self.connects = 0
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id=f"{host_id}-{time.monotonic_ns()}",
                             protocol=mqtt.MQTTv311)
        self.c.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
        self.c.will_set(self.topic, state(False, self._now()), qos=1, retain=True)
        self.c.reconnect_delay_set(0.1, 0.5)
        self.c.on_connect = self._on_connect
        self.c.on_message = lambda c, u, m: self.host.on_message(m.topic, m.payload)
        self.c.connect("127.0.0.1", broker.port, 5)
        self.c.loop_start()

    def _now(self) -> int:
        return self._time.time_ns() // 1_000_000

    def _on_connect(self, c: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            return
        c.subscribe("spBv1.0/#", 1)  # before STATE, on the same connection: in this order
        c.publish(self.topic, state(True, self._now()), qos=1, retain=True)
        self.connects += 1

    def close(self) -> None:
        """Say offline and disconnect."""
        self.c.publish(self.topic, state(False, self._now()), qos=1,
                       retain=True).wait_for_publish(5)
        self.c.disconnect()
        self.c.loop_stop()
