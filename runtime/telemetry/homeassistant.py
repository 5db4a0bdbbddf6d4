"""Home Assistant MQTT discovery: a device's health and results as entities of one HA device.

Opt-in (`[homeassistant] enabled = true`). On every connection (and on every re-birth, e.g.
a new model brings new labels) the MQTT thread publishes one retained config message per
entity to `<discovery_prefix>/<component>/<node_id>/<object_id>/config`, the topic format of
https://www.home-assistant.io/integrations/mqtt/ (node and object ids `[a-zA-Z0-9_-]`). The
entities read the topics the device publishes anyway, so nothing new is sent per tick:

- `edgerun/v1/<fleet>/<device>/health`: temperature, throttled (binary), rung, rate, p95
  latency, power, battery (when the device has one), and one results counter per label;
- `.../result/each` (with `[telemetry] result_per_message`) or else the batched `.../result`:
  the last result's label, with the result as attributes;
- `.../state` (the retained birth and will): availability of every entity.

What was published is recorded in `<state_dir>/homeassistant.json`; configs that are no longer
wanted (discovery disabled, a label gone with its model) are removed with an empty retained
message, as HA's discovery documents, and leave the record only once the broker acknowledged
the removal. The device's broker identity must be allowed to publish the config topics
(`edgerun fleet enroll --homeassistant`, see docs/homeassistant.md); an ACL that refuses them
makes the broker drop the messages, and no entity appears.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.homeassistant import HomeAssistantConfig
from runtime.durable import write_atomic
from runtime.wire import payloads
from runtime.wire.ha_discovery import ID_UNSAFE, config_topic, node_id
from runtime.wire.ha_discovery import config_topics as config_topics  # the device's ACL lines

log = logging.getLogger("edgerun.homeassistant")

MAX_LABEL_ENTITIES = 64  # counters for the first 64 labels; the rest stay in health only
RECORD = "homeassistant.json"


@dataclass(frozen=True)
class DeviceInfo:
    """What the entities describe, from the running daemon."""

    labels: tuple[str, ...] = ()  # the running model's labels (one counter entity each)
    model: str = ""  # the device profile's name (HA's device "model")
    sw_version: str = ""
    battery: bool = False  # the device has a battery gauge


def _object_id(text: str) -> str:
    """An object id for a label: itself when already in HA's alphabet, else a safe form
    plus a hash of the original, so two labels never share an id."""
    safe = ID_UNSAFE.sub("_", text)[:40]
    if safe == text:
        return safe
    return f"{safe}_{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _jinja_string(text: str) -> str:
    """`text` as a Jinja string literal. Everything but letters, digits, space and `_.-`
    becomes a \\u or \\U escape (Jinja decodes them), so a label from a model file can hold
    no quote, brace or backslash that would end the literal or the template."""
    out = []
    for c in text:
        if c.isascii() and (c.isalnum() or c in " _.-"):
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:  # outside the BMP
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def entities(fleet: str, device: str, info: DeviceInfo, result_each: bool
             ) -> dict[tuple[str, str], dict[str, Any]]:
    """The discovery configs: (component, object id) -> config payload."""
    node = node_id(fleet, device)
    t = {k: payloads.topic(fleet, device, k) for k in ("state", "health", "result")}
    dev = {"identifiers": [node], "name": device, "manufacturer": "edgerun",
           "model": info.model or "edgerun device", "sw_version": info.sw_version}
    avail = [{"topic": t["state"], "payload_available": "online",
              "payload_not_available": "offline",
              "value_template": "{{ 'online' if value_json.online else 'offline' }}"}]

    def sensor(obj: str, name: str, template: str, topic: str | None = None,
               **extra: Any) -> tuple[tuple[str, str], dict[str, Any]]:
        return ("sensor", obj), {"name": name, "unique_id": f"{node}_{obj}",
                                 "state_topic": topic or t["health"],
                                 "value_template": template, "availability": avail,
                                 "device": dev, **extra}

    numeric = {"state_class": "measurement"}
    diag = {"entity_category": "diagnostic"}
    out = dict([
        sensor("temperature", "Temperature", "{{ value_json.temp_c }}", device_class="temperature",
               unit_of_measurement="°C", **numeric),
        sensor("rung", "Rung", "{{ value_json.rung }}", icon="mdi:stairs",
               json_attributes_topic=t["health"],
               json_attributes_template="{{ {'rungs': value_json.rungs, 'choice': "
                                        "value_json.choice, 'reason': value_json.governor.reason}"
                                        " | tojson }}", **numeric),
        sensor("rate", "Inference rate", "{{ value_json.pipeline.rate_hz }}",
               device_class="frequency", unit_of_measurement="Hz",
               suggested_display_precision=2, **numeric),
        sensor("latency_p95", "Latency p95", "{{ value_json.pipeline.latency_ms.p95 }}",
               device_class="duration", unit_of_measurement="ms", suggested_display_precision=2,
               **numeric, **diag),
        sensor("power", "Power", "{{ value_json.power_w }}", device_class="power",
               unit_of_measurement="W", suggested_display_precision=2, **numeric, **diag),
    ])
    if info.battery:
        out.update([sensor("battery", "Battery",
                           "{{ (value_json.battery_frac * 100) | round(1) "
                           "if value_json.battery_frac is number else None }}",
                           device_class="battery", unit_of_measurement="%", **numeric)])
    if result_each:
        each = payloads.topic(fleet, device, "result/each")
        out.update([sensor("last_result", "Last result", "{{ value_json.label }}", each,
                           icon="mdi:eye-check", json_attributes_topic=each)])
    else:
        out.update([sensor("last_result", "Last result", "{{ value_json.results[-1].label }}",
                           t["result"], icon="mdi:eye-check", json_attributes_topic=t["result"],
                           json_attributes_template="{{ value_json.results[-1] | tojson }}")])
    for label in info.labels[:MAX_LABEL_ENTITIES]:
        obj = f"count_{_object_id(label)}"
        out.update([sensor(obj, f"Results {label}"[:255],
                           f"{{{{ value_json.pipeline.labels.get({_jinja_string(label)}, 0) }}}}",
                           state_class="total_increasing", unit_of_measurement="results",
                           icon="mdi:counter")])
    out[("binary_sensor", "throttled")] = {
        "name": "Throttled", "unique_id": f"{node}_throttled",
        "state_topic": t["health"], "device_class": "heat", "payload_on": "ON",
        "payload_off": "OFF", "value_template": "{{ 'ON' if value_json.throttled else 'OFF' }}",
        "availability": avail, "device": dev}
    return out


class Discovery:
    """Publishes and retracts one device's discovery configs (MQTT thread; see module
    docstring). `info` is called on the MQTT thread for the current labels and names."""

    def __init__(self, cfg: HomeAssistantConfig, fleet: str, device: str, state_dir: Path,
                 info: Callable[[], DeviceInfo], result_each: bool = False):
        self.cfg, self.fleet, self.device = cfg, fleet, device
        self.path = Path(state_dir) / RECORD
        self._info, self.result_each = info, result_each
        self._lock = threading.Lock()
        self._published: set[str] = self._load()  # config topics that may be in the broker
        self._sent: dict[str, bytes] = {}  # what this connection published, to skip repeats
        self._removing: dict[int, str] = {}  # paho mid -> topic of an empty (removal) message
        self._mids: dict[int, str] = {}  # paho mid -> config topic, until the broker answers

    def _load(self) -> set[str]:
        try:
            doc = json.loads(self.path.read_text())
            # only this device's config topics (under any prefix: it may have changed), so a
            # damaged or planted record cannot make us blank someone else's retained topics
            mine = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*/(sensor|binary_sensor)/"
                              + re.escape(node_id(self.fleet, self.device))
                              + r"/[a-zA-Z0-9_-]+/config$")
            return {t for t in doc["topics"] if isinstance(t, str) and mine.match(t)}
        except FileNotFoundError:
            return set()
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("%s unreadable (%s): discovery configs published before cannot be "
                        "removed; remove them by hand if needed (docs/homeassistant.md)",
                        self.path, e)
            return set()

    def _save(self) -> None:
        try:
            write_atomic(self.path, json.dumps({"topics": sorted(self._published)}))
        except OSError as e:
            log.warning("cannot record the Home Assistant discovery topics in %s (%s); a later "
                        "start may leave stale entities behind", self.path, e)

    def messages(self) -> dict[str, bytes]:
        """Config topic -> retained payload wanted now (b"" removes an entity)."""
        want: dict[str, bytes] = {}
        if self.cfg.enabled:
            info = self._info()
            for (component, obj), body in entities(self.fleet, self.device, info,
                                                   self.result_each).items():
                topic = config_topic(self.cfg.discovery_prefix, component, self.fleet,
                                     self.device, obj)
                want[topic] = json.dumps(body, separators=(",", ":")).encode()
        for topic in self._published - set(want):
            want[topic] = b""
        return want

    def on_connected(self) -> None:
        """A new connection: everything is published again (the broker may have lost its
        retained store)."""
        with self._lock:
            self._sent.clear()
            self._removing.clear()
            self._mids.clear()

    def publish(self, client: Any) -> int:
        """Publish what changed since this connection last published; returns how many."""
        want = self.messages()
        n = 0
        with self._lock:
            for topic, body in want.items():
                if self._sent.get(topic) == body:
                    continue
                info = client.publish(topic, body, qos=1, retain=True)
                self._sent[topic] = body
                self._mids[info.mid] = topic
                n += 1
                if body:
                    self._published.add(topic)
                else:
                    self._removing[info.mid] = topic
            if n:
                self._save()
        if n and self.cfg.enabled:
            log.info("Home Assistant discovery: %d config messages under %s/", n,
                     self.cfg.discovery_prefix)
        elif n:
            log.info("Home Assistant discovery off: removing %d entities", n)
        return n

    def refused(self, mid: int) -> str | None:
        """The broker refused message `mid`: what it was when it was one of ours (a refused
        removal stays in the record, to be sent again at the next connection)."""
        with self._lock:
            topic = self._mids.pop(mid, None)
            self._removing.pop(mid, None)
            if topic is not None:
                self._sent.pop(topic, None)
        return f"the discovery config {topic}" if topic else None

    def acked(self, mid: int) -> None:
        """The broker acknowledged message `mid`: a removal done leaves the record."""
        with self._lock:
            self._mids.pop(mid, None)
            topic = self._removing.pop(mid, None)
            if topic is not None:
                self._published.discard(topic)
                self._save()
