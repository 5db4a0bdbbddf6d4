"""The coordinator's inbox: what the MQTT thread received, waiting for the ingest thread, with
a share per sending device.

One queue of 50,000 messages for the whole fleet let one authenticated device take all of it:
flooding its own topic (garbage at QoS 0, as fast as its link allows), it held ~49,000 of the
places, so every other device's results waited behind its messages and were stored at a
fraction of their rate (600 results sent at 20/s: 321 stored after 120 s), and the MQTT
thread, blocked on the full queue, stopped answering the broker's keepalive: the coordinator
was disconnected again and again. Each device may now hold PER_DEVICE messages in the inbox;
past that its next ones are dropped at once (counted per device), without blocking: a device
that behaves never has that many waiting (its publisher's in-flight window is a few hundred),
and what it is refused it re-sends.
"""

from __future__ import annotations

import collections
import queue
from typing import Any

PER_DEVICE = 2000  # messages of one device waiting in the inbox at most


def sender(topic: str) -> str:
    """The device level of an edgerun topic (`edgerun/v1/<fleet>/<device>/<kind>`): the
    fourth level of any topic of five or more ("" for a shorter one; the prefix is not
    checked, the coordinator subscribes to edgerun topics only). The broker's ACL lets a
    device publish only under its own id."""
    parts = topic.split("/", 4)
    return parts[3] if len(parts) > 4 else ""


class Inbox(queue.Queue):
    """A bounded FIFO of (topic, payload, received) whose items are counted per sender under
    the queue's own lock; `offer` refuses a sender holding `per_device` already."""

    def __init__(self, maxsize: int, per_device: int = PER_DEVICE):
        super().__init__(maxsize)
        self.per_device = per_device
        self.held: collections.Counter = collections.Counter()  # sender -> items waiting
        self.dropped: collections.Counter = collections.Counter()  # sender -> refused
        # sender -> when its newest waiting message was received: a device whose messages
        # wait here is not silent, however long the store takes (Coordinator._refresh)
        self.latest: dict[str, float] = {}

    def offer(self, item: tuple[str, Any, float], timeout: float) -> bool:
        """Put `item` unless its sender's share is full (False at once, counted); blocks up
        to `timeout` only while the whole inbox is full (queue.Full then)."""
        who = sender(item[0])
        with self.mutex:
            if self.held[who] >= self.per_device:
                self.dropped[who] += 1
                return False
        self.put(item, timeout=timeout)
        return True

    def waiting(self) -> dict[str, float]:
        """Each sender with messages waiting: when the newest of them was received."""
        with self.mutex:
            return dict(self.latest)

    def dropped_total(self) -> int:
        """Messages refused over a sender's share since the start."""
        with self.mutex:
            return sum(self.dropped.values())

    # queue.Queue's hooks, called with self.mutex held
    def _put(self, item: tuple[str, Any, float]) -> None:
        who = sender(item[0])
        self.held[who] += 1
        self.latest[who] = max(self.latest.get(who, item[2]), item[2])
        super()._put(item)

    def _get(self) -> tuple[str, Any, float]:
        item = super()._get()
        who = sender(item[0])
        self.held[who] -= 1
        if self.held[who] <= 0:
            del self.held[who]
            self.latest.pop(who, None)
        return item
