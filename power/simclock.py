"""One simulated clock for the simulator and the daemon that runs against it (lockstep).

The plant (power/plant.py) moves only when the daemon's control loop advances this clock by
the time it has ticked; whatever else needs simulated time reads the same clock (the sensors'
timestamps, the synthetic camera's frame slots). A busy host therefore slows the simulation
down instead of letting the plant run ahead of the controller (REFERENCE.md: PX4 runs its
software-in-the-loop this way; a clock of wall time times a factor depends on the host).

`Pace` maps simulated time onto wall time at a target speed: the loop waits for a tick's wall
time when it is early; when it is late by more than `slack_s` it carries on from where it is
(no sprint to catch up), and says so once, with the speed it really runs at.
"""

from __future__ import annotations

import collections
import threading
import time


class SimClock:
    """Simulated seconds: read by anyone, moved forward only by the one loop that owns it."""

    def __init__(self, t0: float):
        self._t = t0
        self._cv = threading.Condition()
        self._closed = False
        self._soonest = float("inf")  # the earliest time a waiter waits for

    def now(self) -> float:
        """The simulated time, s."""
        return self._t

    def advance_to(self, t: float) -> None:
        """Move to `t` (never back) and wake whoever waits for it."""
        with self._cv:
            if t < self._t:
                raise ValueError(f"simulated time cannot go back ({t} < {self._t})")
            self._t = t
            if t >= self._soonest:  # a wake-up costs the waker the GIL hand-over: only
                self._soonest = float("inf")  # when someone's time has come
                self._cv.notify_all()

    def wait_until(self, t: float, timeout_s: float) -> bool:
        """Block until simulated time reaches `t` (True), or `timeout_s` of wall time pass or
        the clock is closed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._t < t and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._soonest = min(self._soonest, t)
                self._cv.wait(left)
            return self._t >= t

    def close(self) -> None:
        """Release every waiter (the simulation is over)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class WallClock:
    """The same two calls on this host's monotonic clock (a real camera's pace)."""

    def now(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wait_until(self, t: float, timeout_s: float) -> bool:
        """Sleep until `t` when that is within `timeout_s`, else sleep `timeout_s`."""
        wait = t - time.monotonic()
        if wait > timeout_s:
            time.sleep(timeout_s)
            return False
        if wait > 0:
            time.sleep(wait)
        return True


class Pace:
    """Simulated time against wall time at `speed` simulated seconds per wall second.

    Pure: every call takes the wall time. `due_in` says how long to wait before simulated
    time `t` may be reached; `reached` records that it was, and returns one line when the
    pace changes (fell behind by more than `slack_s`, or kept up again for `recover_s`).
    `speed_x` is the speed really achieved over the last `window_s` of wall time."""

    def __init__(self, speed: float, sim_t0: float, wall_t0: float, slack_s: float = 1.0,
                 recover_s: float = 5.0, window_s: float = 5.0):
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.speed, self.slack_s, self.recover_s, self.window_s = (speed, slack_s, recover_s,
                                                                   window_s)
        self._sim0, self._wall0 = sim_t0, wall_t0
        self.slowed = False
        self.slowdowns = 0
        self._late_at = -float("inf")  # wall time of the last fall behind
        self._seen: collections.deque[tuple[float, float]] = collections.deque()
        self._seen.append((wall_t0, sim_t0))

    def restart(self, sim_t: float, wall_t: float) -> None:
        """Count the pace from here (e.g. when serving starts after profiling)."""
        self._sim0, self._wall0 = sim_t, wall_t
        self._seen.clear()
        self._seen.append((wall_t, sim_t))

    def late_s(self, sim_t: float, wall_now: float) -> float:
        """Wall seconds simulated time `sim_t` is overdue at `wall_now` (< 0: not yet due)."""
        return wall_now - (self._wall0 + (sim_t - self._sim0) / self.speed)

    def due_in(self, sim_t: float, wall_now: float) -> float:
        """Wall seconds to wait before simulated time `sim_t` is due (0 when due or late)."""
        return max(0.0, -self.late_s(sim_t, wall_now))

    def reached(self, sim_t: float, wall_now: float) -> str | None:
        """Simulated time `sim_t` was reached at `wall_now`; a line when the pace changed."""
        self._seen.append((wall_now, sim_t))
        while len(self._seen) > 2 and self._seen[1][0] <= wall_now - self.window_s:
            self._seen.popleft()
        late = self.late_s(sim_t, wall_now)
        if late > self.slack_s:
            self._sim0, self._wall0 = sim_t, wall_now  # carry on from here: no sprint
            self._late_at = wall_now
            if not self.slowed:
                self.slowed = True
                self.slowdowns += 1
                return (f"simulation slowed down: this host cannot keep {self.speed:g}x (fell "
                        f"{late:.1f} s of wall time behind); it runs slower with the same "
                        "decisions")
        elif self.slowed and wall_now - self._late_at >= self.recover_s:
            self.slowed = False
            return f"simulation back at {self.speed:g}x"
        return None

    def speed_x(self) -> float | None:
        """Simulated seconds per wall second over the last window (None before 2 samples
        a measurable time apart)."""
        (w0, s0), (w1, s1) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (w1 - w0) if w1 - w0 > 1e-6 else None
