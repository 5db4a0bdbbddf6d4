"""The coordinator's trust boundary for one batch off the wire: each message admitted on its
own (topic of this fleet, a valid device id, size- and depth-limited JSON, schema, timestamps
not ahead of our clock), healths and repeated events coalesced per device (coalesce.py).

What is refused is appended to the caller's quarantine list with why, never raised: a bad
message, or an unexpected exception while admitting it, costs that message and nothing else.
"""

from __future__ import annotations

import collections
import hashlib
import json
import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.config.telemetry import check_name
from runtime.coordinator import result_items
from runtime.coordinator.coalesce import Coalescer
from runtime.coordinator.commander import Refused
from runtime.coordinator.store import Inbound
from runtime.wire import clock as wire_clock
from runtime.wire import payloads

INBOUND = (  # the device topics the coordinator subscribes to; metrics counts them
    "state", "result", "health", "event", "cmd/reply")


class Admission:
    """Admits a batch of (topic, payload, received) into what to store (see module
    docstring); counts each kind admitted and each message coalesced into `counters`."""

    def __init__(self, cfg: CoordinatorConfig, counters: collections.Counter):
        self.cfg, self.counters = cfg, counters
        # Bounded work per message: healths and repeated events coalesce per device
        self._healths = Coalescer(cfg.coalesce_s)
        self._events = Coalescer(cfg.coalesce_s, max_keys=10_000)  # keys: distinct events

    def held(self) -> bool:
        """Whether coalesced healths or events wait for their window's end."""
        return bool(self._healths.held() or self._events.held())

    def stats(self) -> dict[str, dict[str, int]]:
        """The healths' and events' coalescers: held, bound, passed."""
        return {"healths": self._healths.stats(), "events": self._events.stats()}

    def batch(self, batch: list[tuple[str, bytes, float]], now: float,
              bad: list[tuple[str, str, str, int, float]]
              ) -> tuple[list[Inbound], list[tuple[str, int]], list[tuple[str, dict, str, int]]]:
        """(what to store, its (topic, size) each for quarantine, the command replies): the
        batch admitted, healths and repeated events coalesced, the coalesced ones whose turn
        came put first; the refused appended to `bad`."""
        inbound: list[Inbound] = []
        sources: list[tuple[str, int]] = []  # (topic, size) per inbound, for quarantine
        replies: list[tuple[str, dict, str, int]] = []

        def held(items: list) -> None:
            """Coalesced messages whose turn came: before what arrived after them."""
            for key, (topic_name, size, msg) in items:
                inbound.append(Inbound(key[0], "event" if topic_name.endswith("/event")
                                       else "health", msg, size))
                sources.append((topic_name, size))

        # the coalescers' windows on the monotonic clock (a wall clock stepped back an hour
        # held every device's health for that hour): receipt times moved onto it
        shift = time.monotonic() - now
        held([*self._healths.due(now + shift), *self._events.due(now + shift)])
        for topic_name, raw, received in batch:
            device = ""
            try:
                device, kind, msg, refused, unseq = self.admit_items(topic_name, raw, now)
            except Refused as e:
                bad.append((device or _topic_device(topic_name), topic_name, str(e), len(raw),
                            received))
                continue
            except Exception as e:  # a bug must cost this message, never the loop
                bad.append((_topic_device(topic_name), topic_name,
                            f"internal error: {type(e).__name__}: {e}", len(raw), received))
                continue
            self.counters[kind] += 1
            for why, size in unseq:  # refused items with no seq to mark: counted here
                bad.append((device, topic_name, f"result item without a usable seq: {why}",
                            size, received))
            if kind == "state":  # what the device said before its state goes before it (a
                # health held back must not make a device that went to sleep look awake)
                held([*self._healths.flush(lambda k, d=device: k[0] == d),
                      *self._events.flush(lambda k, d=device: k[0] == d)])
            if kind == "cmd/reply":
                replies.append((device, msg, topic_name, len(raw)))
            elif kind == "health" and not self._healths.offer(
                    (device, _bucket(msg["t"], self.cfg.coalesce_s)),
                    (topic_name, len(raw), msg), received + shift):
                self.counters["health_coalesced"] += 1  # the latest is stored at the window end
            elif kind == "event" and not self._events.offer(
                    (device, _event_key(msg)), (topic_name, len(raw), msg), received + shift):
                self.counters["events_coalesced"] += 1
            else:
                inbound.append(Inbound(device, kind, msg, len(raw), refused))
                sources.append((topic_name, len(raw)))
        return inbound, sources, replies

    def admit(self, topic_name: str, raw: bytes, now: float) -> tuple[str, str, dict]:
        """(device, kind, payload) of an acceptable message; raises Refused saying why not."""
        return self.admit_items(topic_name, raw, now)[:3]

    def admit_items(self, topic_name: str, raw: bytes, now: float
                    ) -> tuple[str, str, dict, tuple[tuple[int, str, int], ...],
                               tuple[tuple[str, int], ...]]:
        """`admit`, a result message whose items are not all valid taken item by item
        (result_items.py): (device, kind, payload with the valid items, (seq, reason, bytes)
        of each refused item with a seq, (reason, bytes) of each without one)."""
        parsed = payloads.parse_topic(topic_name)
        if parsed is None or parsed[0] != self.cfg.fleet:
            raise Refused("not a topic of this fleet")
        _, device, kind = parsed
        if kind not in INBOUND:
            raise Refused(f"devices do not publish {kind!r}")
        if check_name("device", device):
            raise Refused("device id is not 1-64 characters of A-Z a-z 0-9 _ . -")
        refused: tuple[tuple[int, str, int], ...] = ()
        unseq: tuple[tuple[str, int], ...] = ()
        try:
            if kind == "result":  # one bad item must not refuse the others (a poison
                # pill: the device re-sent the message for ever); a message that is not
                # one at all still is refused whole
                items = result_items.decode(raw)
                msg, refused, unseq = items.msg, items.refused, items.unseq
            else:
                msg = payloads.decode(kind, raw)
        except payloads.PayloadError as e:
            raise Refused(str(e)) from None
        # A coordinator clock reading before 2025 cannot say a stamp is ahead: it put every
        # synced device's state, health and event in quarantine, 56 years "ahead" of 1970.
        # Past 2100 is refused whatever our clock reads.
        limit = (now + self.cfg.future_skew_s if now >= wire_clock.FLOOR_T
                 else wire_clock.CEILING_T)
        if kind in ("state", "health", "event") and msg["t"] > limit:
            clk = msg.get("clk")
            if not (isinstance(clk, dict) and clk.get("sync") is False) or \
                    msg["t"] > wire_clock.CEILING_T:  # unsynced, but no later than 2100
                raise Refused(f"{kind}: stamped {msg['t'] - now:.0f} s ahead of the "
                              "coordinator's clock (more than future_skew_s = "
                              f"{self.cfg.future_skew_s:.0f}, or past 2100 unsynced)")
            # the device says its clock is not synced (a box reading 2100): its time is a
            # claim, placed once its boot's clock is synced (clock_place.py); ranked by
            # boottime meanwhile (clock.made_after), so it cannot pin the latest health
            self.counters["unsynced_future_stamps"] += 1
        return device, kind, msg, refused, unseq


def _bucket(t: float, width_s: float) -> int:
    """The device-clock window of a health stamped `t`: healths of one window coalesce, so a
    burst of a device's history (its outbox after an outage) is kept, one a window."""
    return int(t // width_s) if width_s > 0 else 0


def _event_key(msg: dict) -> str:
    """What makes two events the same (coalesced): everything but their stamp (a digest:
    the coalescer remembers keys up to its bound)."""
    text = json.dumps({k: v for k, v in msg.items() if k != "t"}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _topic_device(topic_name: str) -> str:
    """The device level of an edgerun topic when it is a valid id, else "" (for quarantine)."""
    parts = topic_name.split("/")
    return parts[3] if len(parts) > 4 and check_name("device", parts[3]) is None else ""
