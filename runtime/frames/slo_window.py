"""Each stored frame's latency over the last 30 s and whether it met the SLO: the pipeline's
rate, latency percentiles and SLO compliance in health. Windows on the monotonic clock: a
wall clock step never empties or freezes one."""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import numpy as np

WINDOW_S = 30.0
# The shortest span a rate is read over. Over a few ms it is a count divided by a jitter:
# two results 1 ms apart then a health read 1,000/s, a batch of results (stored with one
# stamp) and a health 5 ms later 1,400/s. Over at least 1 s it is at most the results of
# the first second, never a rate that was not kept for one.
MIN_SPAN_S = 1.0


def window_rate(n: int, now: float, first: float) -> float:
    """Results per second of the `n` results of a window, the earliest stamped `first`:
    (n - 1) over the time from it to now (to now, not to the last result: a source gone
    silent reads a falling rate, not its old one until its last result left the window),
    that time never under MIN_SPAN_S. From the earliest result, not the window's start: a
    store holding less than the window (maxlen, at a high rate) and a source that began
    delivering within it are read over what they span."""
    return (n - 1) / max(now - first, MIN_SPAN_S) if n > 1 else 0.0


class SloWindow:
    """The recent frames' (monotonic time, inference ms, SLO met); thread-safe appends."""

    WINDOW_S = WINDOW_S

    def __init__(self) -> None:
        self._frames: collections.deque = collections.deque(maxlen=2000)
        self.target_ms = math.inf
        self.end_to_end = False  # whether the SLO bounds frame in to result, not inference

    def set(self, target_ms: float, end_to_end: bool) -> None:
        """Judge on each frame's capture to durable result (`end_to_end`) or its inference."""
        self.target_ms, self.end_to_end = target_ms, end_to_end

    def add(self, mono: float, infer_ms: float, e2e_ms: float) -> None:
        """A frame stored at `mono`: its inference and capture-to-result times."""
        judged = e2e_ms if self.end_to_end else infer_ms
        self._frames.append((mono, infer_ms, judged <= self.target_ms))

    def recent(self) -> list[tuple[float, float, bool]]:
        """The frames of the last WINDOW_S."""
        now = time.monotonic()
        return [x for x in list(self._frames) if now - x[0] <= self.WINDOW_S]

    def rate_hz(self, recent: list | None = None) -> float:
        """Results per second over the window (`window_rate`)."""
        recent = self.recent() if recent is None else recent
        return window_rate(len(recent), time.monotonic(), recent[0][0]) if recent else 0.0

    def stats(self) -> dict[str, Any]:
        """Rate, inference p50/p95 and SLO compliance (None: no frame in the window)."""
        recent = self.recent()
        ms = np.array([m for _, m, _ in recent]) if recent else np.array([])
        return {
            "rate_hz": self.rate_hz(recent),
            "latency_ms": {"p50": float(np.percentile(ms, 50)) if len(ms) else None,
                           "p95": float(np.percentile(ms, 95)) if len(ms) else None},
            "slo": {"target_ms": self.target_ms,
                    "of": "end_to_end" if self.end_to_end else "inference",
                    "compliance": (sum(1 for *_, met in recent if met) / len(recent))
                    if recent else None},
        }
