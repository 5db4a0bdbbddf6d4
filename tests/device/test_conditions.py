"""What a control tick's conditions call for (runtime/device/conditions.py), and Serving acting
on it: each row a tick's case."""

from types import SimpleNamespace

import pytest

from runtime.device.conditions import NOTHING, Calls, Event, conditions
from runtime.device.serving import Serving

HOT = "temperature 75.0 °C, profiled at 40.0 °C"
SLOW = "p95 9.00 ms vs 3.00 ms profiled: the device is slower than when profiled (throttling?)"
SLOW_FIELDS = {"variant": "v", "p95_ms": 9.0}


CONDITIONS = [
    # name, simulated, the profiler's verdict, what is called for, times the profiler is asked
    ("nothing moved: nothing to do", False, (None, None), NOTHING, 1),
    ("the temperature moved from the profiling one: a re-profile, no event",
     False, (HOT, None), Calls(HOT), 1),
    ("slower than profiled: the warning, and the re-profile it asks for",
     False, (SLOW, SLOW_FIELDS), Calls(SLOW, (Event("slow_inference", "warning", SLOW_FIELDS),)),
     1),
    # a simulated device: its temperature and latencies are this host's, not the plant's
    ("simulated, this host hot: no re-profile, the profiler not even asked",
     True, (HOT, None), NOTHING, 0),
    ("simulated, this host slow: no event, no re-profile", True, (SLOW, SLOW_FIELDS), NOTHING, 0),
    ("simulated, nothing moved", True, (None, None), NOTHING, 0),
]


@pytest.mark.parametrize(("name", "simulated", "due", "want", "asked"), CONDITIONS,
                         ids=[c[0] for c in CONDITIONS])
def test_what_a_tick_s_conditions_call_for(name, simulated, due, want, asked):
    calls = []

    def ask():
        calls.append(1)
        return due

    assert conditions(simulated, ask) == want
    assert len(calls) == asked


def test_the_event_s_fields_are_a_copy():
    """The event carries the profiler's fields as they were, whatever it does with its dict."""
    slow = dict(SLOW_FIELDS)
    got = conditions(False, lambda: (SLOW, slow))
    slow["p95_ms"] = 1.0
    assert got.events[0].fields == SLOW_FIELDS


ACTS = [
    # name, simulated, the profiler's verdict, events emitted, re-profiles started
    ("slow: the event and the re-profile", False, (SLOW, SLOW_FIELDS),
     [("slow_inference", "warning", SLOW_FIELDS)], [SLOW]),
    ("hot: the re-profile alone", False, (HOT, None), [], [HOT]),
    ("nothing moved", False, (None, None), [], []),
    ("simulated: neither", True, (SLOW, SLOW_FIELDS), [], []),
]


@pytest.mark.parametrize(("name", "simulated", "due", "events", "reprofiled"), ACTS,
                         ids=[c[0] for c in ACTS])
def test_serving_acts_on_what_the_conditions_call_for(name, simulated, due, events,
                                                      reprofiled):
    """Serving emits each event and starts the re-profile the conditions call for, and asks
    the profiler with the governor's temperature."""
    got_events, got_reprofiles, asked = [], [], []

    def profiler_due(temp, *a):
        asked.append(temp)
        return due

    serving = SimpleNamespace(
        simulated=simulated, profiler=SimpleNamespace(due=profiler_due), pipeline=None,
        box=SimpleNamespace(model=None), cfg=SimpleNamespace(daemon=None),
        live_energy_j=lambda: None, accelerator_state=None,
        event=lambda t, s, **f: got_events.append((t, s, f)), reprofile=got_reprofiles.append)
    Serving._check_conditions(serving, 61.5)
    assert (got_events, got_reprofiles) == (events, reprofiled)
    assert asked == ([] if simulated else [61.5])
