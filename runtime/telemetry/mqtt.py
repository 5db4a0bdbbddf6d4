"""Shared paho-mqtt plumbing: client construction from config and the reconnect backoff."""

from __future__ import annotations

import random
from pathlib import Path

import paho.mqtt.client as mqtt

from runtime.telemetry.config import BrokerConfig


def make_client(broker: BrokerConfig, client_id: str, protocol: str,
                clean: bool = True) -> mqtt.Client:
    """A paho 2.x client with TLS and credentials from `broker`; not yet connected.

    `protocol` is "5" or "3.1.1"; for 3.1.1 `clean` is the clean-session flag (for 5 it is
    passed at connect time as clean_start).
    """
    v5 = protocol == "5"
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else clean,
    )
    if broker.username:
        password = None
        if broker.password_file:
            password = Path(broker.password_file).expanduser().read_text().strip()
        client.username_pw_set(broker.username, password)
    if broker.tls.ca or broker.tls.cert:
        client.tls_set(ca_certs=broker.tls.ca or None, certfile=broker.tls.cert or None,
                       keyfile=broker.tls.key or None)
    client.max_queued_messages_set(0)
    return client


def connect(client: mqtt.Client, broker: BrokerConfig, protocol: str, clean: bool = True,
            session_expiry_s: int = 0) -> None:
    """Open the TCP/TLS connection and send CONNECT (CONNACK arrives through the loop)."""
    if protocol == "5":
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        if session_expiry_s:
            props.SessionExpiryInterval = session_expiry_s
        client.connect(broker.host, broker.port, broker.keepalive_s, clean_start=clean,
                       properties=props)
    else:
        client.connect(broker.host, broker.port, broker.keepalive_s)


class ProtocolProbe:
    """MQTT 5 where the broker speaks it, 3.1.1 otherwise. A 3.1.1-only broker (the embedded
    demo one) refuses a v5 CONNECT, so until a connection has worked every failed attempt
    alternates the protocol; after that it sticks."""

    def __init__(self, configured: str):
        self.configured = self.current = configured
        self.worked = False

    def failed(self) -> None:
        """An attempt failed before CONNACK."""
        if not self.worked and self.configured == "5":
            self.current = "3.1.1" if self.current == "5" else "5"

    def succeeded(self) -> None:
        """CONNACK accepted: keep this protocol."""
        self.worked = True


class Backoff:
    """Capped exponential backoff with full jitter, so a fleet does not reconnect in step."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None):
        self.base_s, self.cap_s = base_s, cap_s
        self.attempts = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Delay before the next attempt; grows until `reset`."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.attempts, 16))
        self.attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """A connection succeeded."""
        self.attempts = 0
