"""The fleet simulator keeps the device's ack rules and re-send backoff (client.py), so what
the fleet benches measure is what real devices would cause."""

from __future__ import annotations

import json
from types import SimpleNamespace

from runtime.tools.fleetsim import FleetSim


def _ack(sim: FleetSim, dev, seq: int, first: int, stream: str | None = None) -> None:
    body = json.dumps({"v": 1, "stream": stream or dev.stream, "seq": seq, "from": first})
    sim.groups[0]._on_message(None, None, SimpleNamespace(
        topic=f"edgerun/v1/bench/{dev.name}/ack", payload=body.encode()))


def test_acks_are_checked_like_a_device_and_resends_back_off():
    sim = FleetSim("127.0.0.1", 1, devices=1, result_s=0.001, health_s=3600,
                   ack_timeout_s=10.0)
    dev, group = sim.devices[0], sim.groups[0]
    dev.next_result = dev.next_health = 0.0
    for _ in range(5):
        group.step(True)  # appends one result each and publishes the batch (no broker: queued)
        dev.next_result = 0.0
    assert dev.last_seq == 5 and sorted(dev.outbox) == [1, 2, 3, 4, 5]
    assert dev.sent_upto == 5

    _ack(sim, dev, 3, 1, stream="other")  # another stream: ignored
    _ack(sim, dev, 9, 1)  # beyond anything appended: refused
    assert sim.stats.acks_refused == 1 and len(dev.outbox) == 5
    _ack(sim, dev, 2, 1)
    assert sorted(dev.outbox) == [3, 4, 5] and dev.acked == 2
    _ack(sim, dev, 5, 4)  # vouches from 4, but the device still holds 3: refused
    assert sim.stats.acks_refused == 2 and sorted(dev.outbox) == [3, 4, 5]

    dev.last_progress -= 10.5  # the ack timeout passed (the clock moved back, not slept)
    group.step(False)  # everything unacked is re-sent, and the timeout doubles
    assert sim.stats.resent == 3 and dev.timeout_scale == 2 and dev.sent_upto == 5
    dev.last_progress -= 10.5
    group.step(False)  # 10.5 s < 10 s x 2: not yet
    assert sim.stats.resent == 3
    dev.last_progress -= 10.0
    group.step(False)
    assert sim.stats.resent == 6 and dev.timeout_scale == 4
    _ack(sim, dev, 5, 3)
    assert dev.outbox == {} and dev.timeout_scale == 1 and sim.unacked() == 0
