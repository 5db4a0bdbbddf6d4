"""What a control tick's conditions call for: a re-profile of the [model], a `slow_inference`
event, or nothing. Pure: `Serving` asks once a tick and acts on the answer.

    simulated device   nothing, and the profiler is not asked: the temperature and latencies
                       it would judge are this host's, not the simulated plant's
    re-profile due     reprofile(why): the temperature moved from the profiling one, or
                       inference is slower than profiled (runtime/device/profiling.py)
    slower than profiled   a `slow_inference` warning with the profiler's fields (variant,
                       p95_ms), beside the re-profile it asks for

Table: tests/device/test_conditions.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.wire.events import EventType

# Profiler.due's answer: (why a re-profile is due or None, the slow_inference fields or None)
Due = tuple[str | None, dict[str, Any] | None]


@dataclass(frozen=True)
class Event:
    """One event for the operator: its type, severity and fields."""

    type: EventType
    severity: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Calls:
    """What the conditions call for: the re-profile's reason (None: none) and the events."""

    reprofile: str | None = None
    events: tuple[Event, ...] = ()


NOTHING = Calls()


def conditions(simulated: bool, due: Callable[[], Due]) -> Calls:
    """What a tick's conditions call for (module table). `due`: the profiler's verdict on this
    host's temperature and latencies (runtime.device.profiling.Profiler.due), asked only when
    it applies, at most once."""
    if simulated:
        return NOTHING
    why, slow = due()
    return Calls(why, (Event(EventType.SLOW_INFERENCE, "warning", dict(slow)),) if slow else ())
