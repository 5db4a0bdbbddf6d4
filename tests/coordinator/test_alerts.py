"""The alert state machine (runtime/coordinator/alerts.py): its table row by row, and the
sequences a refresh feeds it (flaps, clears settling, alerts active before a start)."""

from __future__ import annotations

import pytest

from runtime.coordinator import alerts
from runtime.coordinator.alerts import ACTIVE, CLEARED, CLEARING, RAISED, SETTLED, AlertStates


@pytest.mark.parametrize("state, event, want", [
    (None, RAISED, (ACTIVE, RAISED)),
    (None, CLEARED, (CLEARING, None)),
    (None, SETTLED, (None, None)),
    (ACTIVE, RAISED, (ACTIVE, None)),
    (ACTIVE, CLEARED, (CLEARING, None)),
    (ACTIVE, SETTLED, (ACTIVE, None)),
    (CLEARING, RAISED, (ACTIVE, None)),
    (CLEARING, CLEARED, (CLEARING, None)),
    (CLEARING, SETTLED, (None, CLEARED)),
])
def test_transition_table(state, event, want):
    assert alerts.transition(state, event) == want


def test_the_table_covers_every_state_and_input():
    assert set(alerts.TABLE) == {(s, e) for s in (None, ACTIVE, CLEARING)
                                 for e in (RAISED, CLEARED, SETTLED)}
    with pytest.raises(KeyError):
        alerts.transition(ACTIVE, "exploded")


# (time, changes fed, settle at that time) -> what is told, as (code, state, raised_t)
@pytest.mark.parametrize("steps, told, flaps", [
    # raised at once; cleared only once away 30 s, with when it was raised
    ([(0, [("hot", RAISED)]), (10, [("hot", CLEARED)]), (39, []), (40, [])],
     [(0, "hot", RAISED, None), (40, "hot", CLEARED, 0)], 0),
    # a flap: back within 30 s is the same alert (no second raise, no clear)
    ([(0, [("hot", RAISED)]), (10, [("hot", CLEARED)]), (20, [("hot", RAISED)]), (60, [])],
     [(0, "hot", RAISED, None)], 1),
    # active before this process started: its clear is told, raised_t unknown
    ([(5, [("stale", CLEARED)]), (35, [])], [(35, "stale", CLEARED, None)], 0),
    # two codes are two machines
    ([(0, [("hot", RAISED), ("stale", RAISED)]), (1, [("hot", CLEARED)]), (31, [])],
     [(0, "hot", RAISED, None), (0, "stale", RAISED, None), (31, "hot", CLEARED, 0)], 0),
])
def test_sequences(steps, told, flaps):
    a = AlertStates()
    got = []
    for t, changes in steps:
        for x in a.apply([("d", code, st, f"{code} {st}") for code, st in changes], t):
            got.append((t, x.code, x.state, x.raised_t))
        for x in a.settle(t, clear_s=30):
            got.append((t, x.code, x.state, x.raised_t))
    assert got == told
    assert a.flaps == flaps


def test_raised_at_while_active_or_clearing_then_forgotten():
    a = AlertStates()
    a.apply([("d", "hot", RAISED, "m")], 100.0)
    assert a.raised_at("d", "hot") == 100.0 and a.state("d", "hot") == ACTIVE
    a.apply([("d", "hot", CLEARED, "gone")], 110.0)
    assert a.raised_at("d", "hot") == 100.0 and a.state("d", "hot") == CLEARING
    (clear,) = a.settle(140.0, 30)
    assert clear.message == "gone" and clear.raised_t == 100.0
    assert a.state("d", "hot") is None and a.raised_at("d", "hot") is None


def test_a_clear_with_no_wait_settles_in_the_same_refresh_whatever_the_stamp():
    """The raise is told with a stamp rounded to the ms (the payload's); the clock of the
    clear must stay `now`'s, or a clear with alert_clear_s 0 waited for the next refresh
    whenever the stamp rounded up."""
    a = AlertStates()
    a.apply([("d", "hot", RAISED, "m")], 100.0004, stamp=100.0)
    a.apply([("d", "hot", CLEARED, "gone")], 100.0006, stamp=100.001)
    (clear,) = a.settle(100.0006, clear_s=0)
    assert clear.raised_t == 100.0


def test_clearing_lists_what_went_until_it_settles_or_comes_back():
    s = AlertStates()
    s.apply([("b", "hot", RAISED, "hot"), ("a", "offline", RAISED, "off")], now=0.0)
    s.apply([("b", "hot", CLEARED, "cool again"), ("a", "offline", CLEARED, "back")], now=5.0)
    assert s.clearing() == [("a", "offline", 5.0, "back"), ("b", "hot", 5.0, "cool again")]
    s.apply([("a", "offline", RAISED, "off")], now=6.0)  # a flap: active again, not clearing
    assert s.clearing() == [("b", "hot", 5.0, "cool again")]
    s.settle(now=40.0, clear_s=30.0)
    assert s.clearing() == []
