"""Due times under a rate cap (runtime/frames/cap_clock.py `next_due`, `CapClock`): frames
served at the cap on average, the clock started again after a stall or a cap left from before,
a changed cap planned from the last frame served, frames that cannot be served known."""

from __future__ import annotations

import itertools
import math

import pytest

from runtime.frames.cap_clock import CapClock, next_due, spaced


def _serve(step: float, hint: float, seconds: float, first: float = 0.0) -> list[float]:
    """Frames arriving every `step` from `first`; each served when it is the first at or after
    the due time (as the reader's `take`): the times served."""
    tick, due, served = -math.inf, -math.inf, []
    t = first
    while t < seconds:
        if t >= due:
            served.append(t)
            tick, due = next_due(t, tick, step, hint)
        t = round(t + step, 9)
    return served


@pytest.mark.parametrize("interval, hint, want", [
    (0.04, 5.0, 0.04),  # 25 fps under a 5 Hz cap: every frame paced
    (0.04, 16.0, 0.04),  # 62.5 ms between due times: a frame still comes between two
    (0.04, 20.0, 0.0),  # over 2/3 of the stream's rate: not paced, the newest taken
    (1.0, 2 / 3, 1.0),  # exactly 2/3 of it: paced
    (0.04, 0.0, 0.0),  # no cap
    (0.0, 5.0, 0.0),  # the stream's interval not known
])
def test_spaced(interval, hint, want):
    assert spaced(interval, hint) == want


@pytest.mark.parametrize("step, hint, rate", [
    (0.4, 1.0, 1.0),  # 2.5 key frames a second at a 1 fps cap: 0.8 and 1.2 s apart
    (0.04, 10.0, 10.0),  # every frame of 25 fps at 10 Hz: 2 and 3 frames apart
    (0.04, 8.0, 8.0),
    (0.04, 12.5, 12.5),
    (1.0, 1.0, 1.0),  # a key frame a second at 1 fps: each one
])
def test_frames_are_served_at_the_cap_on_average(step, hint, rate):
    served = _serve(step, hint, 60.0)
    assert (len(served) - 1) / (served[-1] - served[0]) == pytest.approx(rate, rel=0.02)


def test_key_frames_at_two_and_a_half_a_second_alternate_under_a_1_fps_cap():
    served = _serve(0.4, 1.0, 30.0)
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(served)}
    assert gaps == {0.8, 1.2}


@pytest.mark.parametrize("now, tick, step, hint, expect", [
    # on time: the next tick one interval on, due half a step before it
    (10.0, 10.02, 0.04, 5.0, (10.22, 10.2)),
    # a stall: the frame came 1 s after its tick; the clock starts again (no burst to catch up)
    (11.0, 10.0, 0.04, 5.0, (11.2, 11.18)),
    # the edges, in binary-exact figures (2 Hz cap, a step of 0.25 s): exactly a step after
    # its tick keeps the clock, a step and a half starts it again; a tick exactly an interval
    # ahead is kept
    (10.25, 10.0, 0.25, 2.0, (10.5, 10.375)),
    (10.375, 10.0, 0.25, 2.0, (10.875, 10.75)),
    (10.0, 10.5, 0.25, 2.0, (11.0, 10.875)),
    # a tick far ahead, left from a 0.1 Hz cap: the clock starts again at once at 5 Hz
    (3.0, 10.0, 0.04, 5.0, (3.2, 3.18)),
    # not paced (no cap, or no interval known): nothing due, the clock forgotten
    (3.0, 10.0, 0.0, 5.0, (-math.inf, -math.inf)),
    (3.0, 10.0, 0.04, 0.0, (-math.inf, -math.inf)),
])
def test_next_due(now, tick, step, hint, expect):
    got = next_due(now, tick, step, hint)
    assert got == pytest.approx(expect) if math.isfinite(expect[0]) else got == expect


def test_a_cap_lifted_and_set_again_serves_at_once():
    """Lifted (the clock forgotten), then 5 Hz again: the next frame is due within an interval
    (a tick left 10 s ahead by a 0.1 Hz cap held it 7 s)."""
    tick, _ = next_due(0.0, -math.inf, 0.4, 0.1)  # 0.1 Hz: the next tick at 10 s
    tick, due = next_due(1.0, tick, 0.0, 0.0)  # lifted
    tick, due = next_due(3.0, tick, 0.04, 5.0)
    assert due == pytest.approx(3.18)


def _serve_changed(step: float, before: float, after: float, at: float,
                   seconds: float) -> list[float]:
    """As _serve, the cap moved from `before` to `after` at `at` (the source's rate_hint:
    CapClock.replan)."""
    clock, served = CapClock(), []
    hint, t = before, 0.0
    while t < seconds:
        if hint != after and t >= at:
            hint = after
            clock.replan(step, hint)
        if t >= clock.due:
            served.append(t)
            clock.served(t, step, hint)
        t = round(t + step, 9)
    return served


@pytest.mark.parametrize("step, before, after, first, rate", [
    # raised from 0.1 Hz (the next frame due ~10 s after the last): served at once, at the
    # new cap from there (before, the first came 10 s after the last one served)
    (0.04, 0.1, 5.0, 3.0, 5.0),
    (0.04, 2.0, 10.0, 3.0, 10.0),
    # key frames 2.5 a second: the next key frame
    (0.4, 0.1, 1.0, 3.2, 1.0),
    # lowered: the next frame 1/new cap after the last served (at 2.8 under 5 Hz: 12.8)
    (0.04, 5.0, 0.1, 12.8, 0.1),
    # lifted: every frame from the change
    (0.04, 0.1, 0.0, 3.0, 25.0),
])
def test_a_cap_changed_is_planned_from_the_last_frame_served(step, before, after, first, rate):
    served = _serve_changed(step, before, after, 3.0, 60.0)
    later = [t for t in served if t >= 3.0]
    assert later[0] == pytest.approx(first)
    assert (len(later) - 1) / (later[-1] - later[0]) == pytest.approx(rate, rel=0.03)


def test_a_cap_changed_before_any_frame_served_plans_nothing():
    clock = CapClock()
    clock.replan(0.04, 5.0)
    assert (clock.tick, clock.due) == (-math.inf, -math.inf)


@pytest.mark.parametrize("now, interval, never", [
    # due at 10.16 (a 5 Hz cap, 25 fps): a frame decoded more than a quarter interval
    # (10 ms) before it is ready before it, and the next one is served instead
    (10.0, 0.04, True),
    (10.149, 0.04, True),
    # within the quarter: its conversion may end after the due time; converted
    (10.151, 0.04, False),
    (10.16, 0.04, False),
    (10.5, 0.04, False),  # late: served
    (10.0, 0.0, False),  # the stream's interval not known, or not every frame paced
])
def test_a_frame_never_served(now, interval, never):
    clock = CapClock()
    clock.served(9.98, 0.04, 5.0)  # the clock starts at 9.98: tick 10.18, due 10.16
    assert clock.due == pytest.approx(10.16)
    assert clock.never_served(now, interval) is never


@pytest.mark.parametrize("now, never", [(10.0624, True), (10.0625, False)])
def test_a_frame_exactly_a_quarter_interval_before_its_due_time_is_converted(now, never):
    clock = CapClock()
    clock.served(9.75, 0.25, 2.0)  # tick 10.25, due 10.125; a quarter interval: 0.0625
    assert clock.never_served(now, 0.25) is never
