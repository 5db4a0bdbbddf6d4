"""Table tests for the coordinator's trust boundary (runtime/coordinator/admission.py): what
`Admission.admit` refuses and why, and what `Admission.batch` coalesces, orders and blames.
Pure: no broker, no store."""

from __future__ import annotations

import collections

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.admission import Admission
from runtime.coordinator.commander import Refused
from runtime.wire import payloads

NOW = 1_796_600_000.0  # a synced coordinator clock; future_skew_s 300, coalesce_s 1
F = "edgerun/v1/f"


def health(t: float) -> bytes:
    return payloads.encode("health", {"v": 1, "t": t, "boot": "b1"})


def event(t: float) -> bytes:
    return payloads.encode("event", {"v": 1, "t": t, "type": "overheat"})


def state(t: float) -> bytes:
    return payloads.encode("state", {"v": 1, "online": True, "boot": "b1", "t": t})


ADMIT = [
    # name, topic, payload, None (admitted) or a phrase of the refusal
    ("another fleet's topic", "edgerun/v1/g/dev1/health", health(NOW), "not a topic of this"),
    ("a kind only the coordinator publishes", f"{F}/dev1/cmd", b"{}", "do not publish 'cmd'"),
    ("a device id with a space", f"{F}/ev il/health", health(NOW), "device id is not"),
    ("a health stamped exactly future_skew_s ahead", f"{F}/dev1/health", health(NOW + 300),
     None),
    ("a health a second further ahead", f"{F}/dev1/health", health(NOW + 301),
     "ahead of the coordinator's clock"),
    ("an event stamped an hour ahead", f"{F}/dev1/event", event(NOW + 3600),
     "ahead of the coordinator's clock"),
    ("a state stamped an hour ahead", f"{F}/dev1/state", state(NOW + 3600),
     "ahead of the coordinator's clock"),
]


@pytest.mark.parametrize(("name", "topic", "raw", "refused"), ADMIT, ids=[a[0] for a in ADMIT])
def test_admit(name, topic, raw, refused):
    a = Admission(CoordinatorConfig(fleet="f"), collections.Counter())
    if refused is None:
        assert a.admit(topic, raw, NOW)[0] == "dev1"
    else:
        with pytest.raises(Refused, match=refused):
            a.admit(topic, raw, NOW)


BATCH = [
    # name, (topic, payload) all received at NOW, kinds stored in order, counters
    ("a health held back goes before its device's state",
     [(f"{F}/dev1/health", health(NOW)), (f"{F}/dev1/health", health(NOW + 0.1)),
      (f"{F}/dev1/state", state(NOW))],
     ["health", "health", "state"], {"health_coalesced": 1}),
    ("healths of two device-clock windows are both kept (an outbox's history)",
     [(f"{F}/dev1/health", health(NOW)), (f"{F}/dev1/health", health(NOW + 5))],
     ["health", "health"], {"health_coalesced": 0}),
    ("events that differ only in their stamp are one",
     [(f"{F}/dev1/event", event(NOW)), (f"{F}/dev1/event", event(NOW + 0.5))],
     ["event"], {"events_coalesced": 1}),
]


@pytest.mark.parametrize(("name", "msgs", "kinds", "counted"), BATCH, ids=[b[0] for b in BATCH])
def test_batch(name, msgs, kinds, counted):
    counters: collections.Counter = collections.Counter()
    a = Admission(CoordinatorConfig(fleet="f"), counters)
    bad: list = []
    inbound, _, _ = a.batch([(topic, raw, NOW) for topic, raw in msgs], NOW, bad)
    assert not bad and [i.kind for i in inbound] == kinds
    assert {k: counters[k] for k in counted} == counted


@pytest.mark.parametrize(("topic", "raw", "device"), [
    (f"{F}/dev1/health", health(NOW + 3600), "dev1"),
    (f"{F}/ev il/health", health(NOW), ""),  # not a valid id: blamed on no device
])
def test_a_refused_message_is_blamed_on_a_valid_device_id_only(topic, raw, device):
    a = Admission(CoordinatorConfig(fleet="f"), collections.Counter())
    bad: list = []
    a.batch([(topic, raw, NOW)], NOW, bad)
    assert [b[0] for b in bad] == [device]
