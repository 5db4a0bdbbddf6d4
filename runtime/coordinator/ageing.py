"""Which devices a fleet refresh must recompute, so a refresh costs the devices changing, not
the fleet: those touched since the last refresh (a message, a row another coordinator wrote)
and those whose status can change by silence alone now (fleet.next_change: the end of the
stale or offline threshold, a sleeper's wake plus margin), kept in a heap. Also counts the
fleet's edgerun versions as devices change, for the `version` alert's majority.

Times: `take`'s `now` is the coordinator's steady time (runtime/wire/clock.py StepClock:
the wall clock less the steps it took since the start). A view's times (`last_seen`,
`wake_at`) are wall times, stamped under the step in force then, which `touch` remembers per
device: its view is judged at `now_of` (the steady time plus that step), so a step of the
wall clock after it was stamped neither ages it (a week forward: the whole fleet stale, then
offline, an alert each) nor keeps it fresh (an hour back: a silent device stale an hour
late). Without a step, `now_of` is the wall clock, as before.

Not thread-safe: the coordinator uses it under its views lock.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable

from runtime.coordinator import fleet


class Ageing:
    """Per-device deadlines (a heap with one live entry per device) and touched devices."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}  # device -> its live (earliest) heap entry
        self._touched: set[str] = set()
        self._version: dict[str, str] = {}
        self._counts: Counter = Counter()
        self._step: dict[str, float] = {}  # device -> the step its view's times were stamped in
        self._default = 0.0  # ... for devices not touched since the reset

    def reset(self, devices: Iterable[str], step: float = 0.0) -> None:
        """Forget every deadline and count: all of `devices` are due at the next take, their
        views stamped under `step`."""
        self.__init__()
        self._touched = set(devices)
        self._default = step

    def touch(self, device: str, step: float | None = None) -> None:
        """The device's view changed: recompute it at the next take; `step`: the wall
        clock's steps (StepClock.step) in force when its new times were stamped."""
        self._touched.add(device)
        if step is not None:
            self._step[device] = step

    def now_of(self, device: str, now: float) -> float:
        """The wall time to judge `device`'s view at, at steady time `now` (pure)."""
        return now + self._step.get(device, self._default)

    def take(self, now: float) -> set[str]:
        """The devices to recompute at `now`: touched ones and those whose deadline passed."""
        out, self._touched = self._touched, set()
        heap = self._heap
        while heap and heap[0][0] < now:
            t, device = heapq.heappop(heap)
            if self._due.get(device) == t:  # else superseded by an earlier entry, done
                del self._due[device]
                out.add(device)
        return out

    def schedule(self, device: str, view: fleet.DeviceView, cfg: fleet.FleetConfig) -> None:
        """Remember when a just-recomputed view can next change by silence. A later deadline
        than the one held is not pushed: the held one fires, finds the device, and the
        recompute then schedules the real one (so the heap holds about one entry a device)."""
        t = fleet.next_change(view, cfg)
        if t == math.inf:
            return
        t -= self.now_of(device, 0.0)  # a wall time of its view's, as steady time
        held = self._due.get(device)
        if held is None or t < held:
            self._due[device] = t
            heapq.heappush(self._heap, (t, device))

    def count_version(self, device: str, view: fleet.DeviceView) -> None:
        """Count the edgerun version the device's view reports (replacing its previous one)."""
        new, old = fleet.version_of(view), self._version.get(device)
        if new == old:
            return
        if old is not None:
            self._counts[old] -= 1
            if self._counts[old] <= 0:
                del self._counts[old]
        if new is None:
            del self._version[device]
        else:
            self._version[device] = new
            self._counts[new] += 1

    def majority(self) -> str | None:
        """The fleet's majority version over the devices counted (fleet.majority_of)."""
        return fleet.majority_of(self._counts)

    def pending(self) -> int:
        """Devices with a deadline held (for stats and tests)."""
        return len(self._due)
