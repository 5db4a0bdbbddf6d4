"""The alert state machine (runtime/coordinator/alerts.py): its table row by row, and the
sequences a refresh feeds it (flaps, clears settling, alerts active before a start)."""

from __future__ import annotations

import pytest

from runtime.coordinator import alerts
from runtime.coordinator.alerts import (
    ACTIVE,
    CLEARED,
    CLEARING,
    DUE,
    HELD,
    PAUSED,
    RAISED,
    RAISING,
    SETTLED,
    AlertStates,
)


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
    (None, HELD, (RAISING, None)),
    (None, DUE, (None, None)),
    (RAISING, RAISED, (RAISING, None)),
    (RAISING, HELD, (RAISING, None)),
    (RAISING, CLEARED, (PAUSED, None)),
    (PAUSED, HELD, (RAISING, None)),
    (PAUSED, RAISED, (ACTIVE, RAISED)),
    (PAUSED, CLEARED, (PAUSED, None)),
    (PAUSED, SETTLED, (None, None)),
    (PAUSED, DUE, (PAUSED, None)),
    (RAISING, SETTLED, (RAISING, None)),
    (RAISING, DUE, (ACTIVE, RAISED)),
    (ACTIVE, HELD, (ACTIVE, None)),
    (ACTIVE, DUE, (ACTIVE, None)),
    (CLEARING, HELD, (ACTIVE, None)),
    (CLEARING, DUE, (CLEARING, None)),
])
def test_transition_table(state, event, want):
    assert alerts.transition(state, event) == want


def test_the_table_covers_every_state_and_input():
    assert set(alerts.TABLE) == {(s, e) for s in (None, RAISING, PAUSED, ACTIVE, CLEARING)
                                 for e in (RAISED, HELD, CLEARED, SETTLED, DUE)}
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
    a = AlertStates({"offline": 0})  # a delay of 0: at once, as any code
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


# `offline` told only once it has lasted 60 s: (time, changes fed, settle at that time) ->
# what is told, as (time, code, state, raised_t); then how many were held back
@pytest.mark.parametrize("steps, told, held", [
    # a broker's restart: every device's will, back in seconds: nothing told
    ([(0, [("offline", RAISED)]), (8, [("offline", CLEARED)]), (100, [])], [], 1),
    # a device that stays offline: told at 60 s, stamped then; its clear as any
    ([(0, [("offline", RAISED)]), (59, []), (60, []), (70, [("offline", CLEARED)]), (100, [])],
     [(60, "offline", RAISED, None), (100, "offline", CLEARED, 60)], 0),
    # raised again while raising: the delay counts from the first
    ([(0, [("offline", RAISED)]), (30, [("offline", RAISED)]), (60, [])],
     [(60, "offline", RAISED, None)], 0),
    # back, then offline again after it settled (30 s away): a new delay
    ([(0, [("offline", RAISED)]), (5, [("offline", CLEARED)]), (35, []),
      (40, [("offline", RAISED)]), (99, []), (100, [])], [(100, "offline", RAISED, None)], 1),
    # back for less than alert_clear_s: a flap, its delay counted from the first
    ([(0, [("offline", RAISED)]), (5, [("offline", CLEARED)]), (10, [("offline", RAISED)]),
      (59, []), (60, [])], [(60, "offline", RAISED, None)], 0),
    # and gone again by its delay: told when it comes back
    ([(0, [("offline", RAISED)]), (50, [("offline", CLEARED)]), (60, []),
      (70, [("offline", RAISED)])], [(70, "offline", RAISED, None)], 0),
    # another code beside it is told at once
    ([(0, [("offline", RAISED), ("hot", RAISED)]), (5, [("offline", CLEARED)]), (35, [])],
     [(0, "hot", RAISED, None)], 1),
    # a clear of an offline raised before this process started: told as before
    ([(5, [("offline", CLEARED)]), (35, [])], [(35, "offline", CLEARED, None)], 0),
])
def test_a_raise_delay_holds_back_what_goes_within_it(steps, told, held):
    a = AlertStates({"offline": 60})
    got = []
    for t, changes in steps:
        for x in a.apply([("d", code, st, f"{code} {st}") for code, st in changes], t):
            got.append((t, x.code, x.state, x.raised_t))
        for x in a.settle(t, clear_s=30):
            got.append((t, x.code, x.state, x.raised_t))
    assert got == told
    assert a.held_back == held
    assert a.state("d", "offline") in (None, ACTIVE, CLEARING, RAISING)


def test_hold_tracks_an_untold_alert_of_a_delayed_code_as_raising_from_then():
    a = AlertStates({"offline": 60})
    assert not a.hold("d", "hot", 0.0, "m")  # no delay: nothing to hold
    assert a.hold("d", "offline", 10.0, "device is offline")
    assert a.raising_since("d", "offline") == 10.0 and a.state("d", "offline") == RAISING
    assert not a.hold("d", "offline", 20.0, "again")  # tracked already
    assert a.settle(69.0, clear_s=30) == []
    (told,) = a.settle(70.0, clear_s=30)
    assert (told.code, told.state, told.message) == ("offline", RAISED, "device is offline")
    assert a.raising_since("d", "offline") is None


@pytest.mark.parametrize("stale, told_offline_at", [
    (None, 60),  # a will: held back
    (ACTIVE, 0),  # after a stale told: at once
    (CLEARING, 0),
])
def test_a_delayed_raise_after_a_told_alert_of_its_after_codes_is_told_at_once(
        stale, told_offline_at):
    a = AlertStates({"offline": 60}, after={"offline": ("stale",)})
    if stale is not None:
        a.apply([("d", "stale", RAISED, "m")], -10.0)
    if stale == CLEARING:
        a.apply([("d", "stale", CLEARED, "m")], -5.0)
    got = a.apply([("d", "offline", RAISED, "m"), ("d", "stale", CLEARED, "m")], 0.0)
    got += a.settle(30.0, clear_s=100) + a.settle(60.0, clear_s=100)
    assert [(x.code, x.state) for x in got] == [("offline", RAISED)]
    assert a.raised_at("d", "offline") == told_offline_at


def test_a_link_that_flaps_offline_for_most_of_each_minute_is_told():
    """Old code: each offline shorter than offline_alert_s was dropped when the device came
    back, however briefly: a device offline 50 s of every minute (a link that drops and
    comes back for seconds) was never told, where without the delay it was one alert (a
    flap within alert_clear_s). Now a raise that goes and comes back within alert_clear_s
    keeps its delay counted from when it first came."""
    a = AlertStates({"offline": 60})
    told = []
    for minute in range(10):
        t = minute * 60.0
        told += a.apply([("d", "offline", RAISED, "device is offline")], t)
        told += a.settle(t + 25, clear_s=30)
        told += a.apply([("d", "offline", CLEARED, "device is offline")], t + 50)
        told += a.settle(t + 55, clear_s=30)
    assert [(x.code, x.state) for x in told] == [("offline", RAISED)]
    assert a.held_back == 0
