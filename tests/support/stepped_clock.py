"""A wall clock and a monotonic one that a test moves by hand (clock-jump tests)."""

from __future__ import annotations


class Clocks:
    """A wall clock and a monotonic one the test moves: `run` moves both, `step` the wall."""

    def __init__(self, wall: float):
        self.w, self.m = wall, 1000.0

    def run(self, s: float) -> None:
        """Time passes: both clocks advance by `s`."""
        self.w += s
        self.m += s

    def step(self, s: float) -> None:
        """The wall clock is stepped by `s` (NTP, `date -s`); monotonic time does not move."""
        self.w += s
