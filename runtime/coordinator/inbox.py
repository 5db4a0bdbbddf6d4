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

The whole inbox still fills: 25 devices flooding, or a fleet's ordinary traffic while the
store hangs. The MQTT thread then blocked up to 1 s on each message, so every device's traffic
(and the keepalive's PINGRESP) waited behind the flood. `offer` never blocks now: a message
that finds the inbox full is dropped at once, counted against its sender (`dropped_full`) and
against the device holding most of the inbox at that moment (`filled_by`: who crowded it out).
What is dropped costs a re-send or nothing, except for three kinds kept in a reserve:

- results are re-sent by their device until the coordinator acks them (it acks what it
  stored, not what it read), healths are periodic and coalesced to the latest anyway:
  refused with the rest, they cost a re-send or nothing;
- a birth (`state`) is sent once per connection (retained, but redelivered only when the
  coordinator resubscribes), a command reply once per command, an event once (the device
  drops it from its outbox on the PUBACK, which paho sends when this callback returns; a
  device sends at most one of a type a minute). Lost, a boot goes unseen until the device
  reconnects, a command waits out its timeout and fails its rollout step, an operator never
  hears of a full disk. So these may take the last `reserve` places, each sender while it
  holds fewer than KEPT_EACH of these kinds: a device flooding births or events cannot spend
  the reserve, and a busy one (while the store hangs every device sending results holds many
  of them here) still gets its birth, reply or event in. Counting every kind refused the
  reserve to all but quiet devices in the very case it is for.
"""

from __future__ import annotations

import collections
import queue
from typing import Any

PER_DEVICE = 2000  # messages of one device waiting in the inbox at most
KEPT = ("state", "cmd/reply", "event")  # what a full inbox keeps in its reserve (docstring)
KEPT_EACH = 8  # a sender holding this many messages of KEPT kinds may not spend the reserve


def sender(topic: str) -> str:
    """The device level of an edgerun topic (`edgerun/v1/<fleet>/<device>/<kind>`): the
    fourth level of any topic of five or more ("" for a shorter one; the prefix is not
    checked, the coordinator subscribes to edgerun topics only). The broker's ACL lets a
    device publish only under its own id."""
    parts = topic.split("/", 4)
    return parts[3] if len(parts) > 4 else ""


def kind(topic: str) -> str:
    """The kind of an edgerun topic: what follows its device level ("" for a shorter one)."""
    parts = topic.split("/", 4)
    return parts[4] if len(parts) > 4 else ""


class Inbox(queue.Queue):
    """A bounded FIFO of (topic, payload, received) whose items are counted per sender under
    the queue's own lock; `offer` refuses a sender holding `per_device` already, and any
    message the inbox has no room for, without blocking."""

    def __init__(self, maxsize: int, per_device: int = PER_DEVICE, reserve: int | None = None):
        super().__init__(maxsize)
        self.per_device = per_device
        # the last places, for births and command replies only (module docstring)
        self.reserve = maxsize // 20 if reserve is None else reserve
        self.held: collections.Counter = collections.Counter()  # sender -> items waiting
        self.kept: collections.Counter = collections.Counter()  # sender -> KEPT ones of them
        self.dropped: collections.Counter = collections.Counter()  # sender -> refused
        self.dropped_full: collections.Counter = collections.Counter()  # sender -> no room
        self.filled_by: collections.Counter = collections.Counter()  # top holder -> refusals
        self.top, self._top_due = "", 0  # the top holder, looked up once per 256 refusals
        # sender -> when its newest waiting message was received: a device whose messages
        # wait here is not silent, however long the store takes (Coordinator._refresh)
        self.latest: dict[str, float] = {}

    def offer(self, item: tuple[str, Any, float]) -> str | None:
        """Put `item` (None), or refuse it at once, counted: "share" when its sender holds
        `per_device` already, "full" when the inbox has no room for it. Never blocks: the
        caller is the MQTT thread, which reads every device's traffic and the keepalive."""
        who = sender(item[0])
        with self.mutex:
            held = self.held[who]
            if held >= self.per_device:
                self.dropped[who] += 1
                return "share"
            room = self.maxsize - self.reserve
            if kind(item[0]) in KEPT and self.kept[who] < KEPT_EACH:
                room = self.maxsize
            if self._qsize() >= room:
                self.dropped_full[who] += 1
                if self._top_due <= 0 or not self.held.get(self.top):
                    self.top = max(self.held, key=self.held.__getitem__, default="")
                    self._top_due = 256
                self._top_due -= 1
                self.filled_by[self.top] += 1
                return "full"
            self._put(item)  # what put() does, without its wait for room
            self.unfinished_tasks += 1
            self.not_empty.notify()
        return None

    def waiting(self) -> dict[str, float]:
        """Each sender with messages waiting: when the newest of them was received."""
        with self.mutex:
            return dict(self.latest)

    def dropped_total(self) -> int:
        """Messages refused over a sender's share since the start."""
        with self.mutex:
            return sum(self.dropped.values())

    def full_stats(self) -> dict[str, Any]:
        """Messages refused for want of room since the start, and the five devices most
        charged with filling the inbox (refusals while each held most of it)."""
        with self.mutex:
            return {"dropped_full": sum(self.dropped_full.values()),
                    "filled_by": dict(self.filled_by.most_common(5)),
                    "reserve": self.reserve}

    # queue.Queue's hooks, called with self.mutex held
    def _put(self, item: tuple[str, Any, float]) -> None:
        who = sender(item[0])
        self.held[who] += 1
        if kind(item[0]) in KEPT:
            self.kept[who] += 1
        self.latest[who] = max(self.latest.get(who, item[2]), item[2])
        super()._put(item)

    def _get(self) -> tuple[str, Any, float]:
        item = super()._get()
        who = sender(item[0])
        self.held[who] -= 1
        if kind(item[0]) in KEPT:
            self.kept[who] -= 1
            if self.kept[who] <= 0:
                del self.kept[who]
        if self.held[who] <= 0:
            del self.held[who]
            self.latest.pop(who, None)
        return item
