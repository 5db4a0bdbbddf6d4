"""When a live reader's next frame is due under a rate cap, shared by the readers that pace
themselves (runtime/frames/av_source.py, runtime/frames/capture_source.py): a frame decoded
too early to be served is passed over without its conversion to BGR (and, on a V4L2 camera,
without its decode: OpenCV's grab only dequeues the buffer)."""

from __future__ import annotations

import math


def spaced(interval: float, hint_hz: float) -> float:
    """Every frame decoded under a rate cap of `hint_hz`: the stream's frame `interval` where
    the cap is at most 2/3 of the stream's rate (a frame comes between two due times), else 0
    (not paced: the pipeline waits out the cap and takes the newest)."""
    return interval if hint_hz > 0 and interval > 0 and 1 / hint_hz >= 1.5 * interval else 0.0


def next_due(now: float, tick: float, step: float, hint_hz: float) -> tuple[float, float]:
    """(tick, due) for the next frame under a rate cap of `hint_hz`, a frame just served at
    `now`; `step`: the interval between the frames decoded (key frames when only they are, else
    every frame; 0: not paced, (-inf, -inf)). The next frame served is the first decoded after
    its due time: half a step before the next tick of a clock 1/hint_hz apart, so that on
    average frames are served at the cap. Ticks counted from each frame's serving instead (a
    few ms after it came) put every frame but one just before its due time where the step is a
    frame and a half short of 1/hint_hz: 2.5 key frames a second at a 1 fps cap were served
    1.2 s apart (0.83 fps). The clock starts again at `now` where the frame came more than a
    step after its tick (a stall, a switch) or the tick lies more than an interval ahead (left
    from an earlier, lower cap)."""
    if step <= 0 or not hint_hz > 0:
        return -math.inf, -math.inf
    if now - tick > step or tick - now > 1 / hint_hz:
        tick = now
    tick += 1 / hint_hz
    return tick, tick - 0.5 * step


class CapClock:
    """When the next frame is due under a rate cap (next_due's tick and due time, monotonic
    s): planned at each frame served, and planned again from the last one served when the
    cap changes, as if it had been served under the new cap (planned at a 0.1 Hz cap, the
    due time held the frames of a 5 Hz cap set after it up to 10 s)."""

    def __init__(self) -> None:
        self.tick = self.due = -math.inf
        self._served = (-math.inf, -math.inf)  # next_due's inputs at the last frame served

    def served(self, now: float, step: float, hint_hz: float) -> None:
        """A frame was served at `now` (`step`, `hint_hz`: as next_due's)."""
        self._served = (now, self.tick)
        self.tick, self.due = next_due(now, self.tick, step, hint_hz)

    def replan(self, step: float, hint_hz: float) -> None:
        """The cap is now `hint_hz`: the due time planned again (none before a frame was
        served)."""
        if self._served[0] > -math.inf:
            self.tick, self.due = next_due(*self._served, step, hint_hz)

    def never_served(self, now: float, interval: float) -> bool:
        """Every frame decoded (`interval`: the stream's, 0 when not paced so): whether a
        frame decoded at `now` is never served. A frame is served only when it is ready (its
        conversion done) at or after the due time; one decoded more than a quarter interval
        before it is ready before it (a conversion takes ~0.4 ms at 720p, the quarter 10 ms
        at 25 fps), and a newer one is served instead."""
        return interval > 0 and now < self.due - interval / 4
