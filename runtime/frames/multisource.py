"""Several sources in one daemon: their lanes, a fair queue between them, the aggregate load.

One model session serves every source (`[[sources]]` share `[model]`), so the sources compete
for one inference thread. Three rules keep that honest:

- **Fairness**: each source has its own bounded lane in the raw-frame queue (`FairQueue`); the
  preprocess thread takes from the lanes in turn. A busy camera drops its *own* stale frames
  (latest wins) and never pushes out another source's frame; folder and trigger lanes block
  their own capture thread instead and never drop.
- **Latency at the combined rate** (`aggregate`): the operator's `latency_ms` is what each
  stream must see. In the worst case one frame from every stream arrives at once and the last
  one waits for the other n - 1 inferences, so a variant qualifies only if n x its latency
  fits the target; and the one inference thread must keep up with the sum of the rates, so
  its latency x the combined rate must stay under `UTILISATION_MAX`. The selector and the
  ladder are handed the stricter of the two as the per-inference target.
- **Energy per second of the box**: the control step plans rung powers at the combined rate
  (the sum of the sources' rates), so a budget in watts is the whole box's; a rate cap it
  sets is shared out in proportion to each source's rate (`shares`).

Pure apart from `FairQueue` (a thread-safe container).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.frames.slo_window import window_rate

UTILISATION_MAX = 0.8  # the share of the inference thread's time frames may fill


def aggregate(latency_ms: float, rates_hz: Sequence[float]) -> tuple[float, str]:
    """(per-inference latency target in ms, why) for streams at `rates_hz` sharing one
    inference thread, each needing `latency_ms` (see module doc). One stream: unchanged."""
    n = len(rates_hz)
    if n <= 1:
        return latency_ms, ""
    total = sum(rates_hz)
    burst = latency_ms / n
    capacity = UTILISATION_MAX * 1e3 / total if total > 0 else float("inf")
    target = min(burst, capacity)
    bound = (f"{n} streams x latency <= {latency_ms:g} ms" if burst <= capacity else
             f"{total:g} Hz combined x latency <= {UTILISATION_MAX:g} of the inference thread")
    return target, (f"{n} sources at {total:g} Hz combined share one inference thread: each "
                    f"inference must take <= {target:.3g} ms ({bound})")


def planned_rate(sources: Sequence[Any], governor_rate_hz: float) -> float:
    """The rate the control step plans rung powers at: the sum of `[[sources]]` rates (the
    whole box's load), else `[governor] rate_hz` (0: as fast as the top rung runs)."""
    return sum(s.rate_hz for s in sources) or governor_rate_hz


def shares(rates_hz: Sequence[float]) -> list[float]:
    """Each source's part of the combined rate (a combined rate cap is split by these)."""
    total = sum(rates_hz)
    if total <= 0:
        return [1.0 / len(rates_hz)] * len(rates_hz)
    return [r / total for r in rates_hz]


class Pacer:
    """A source's own rate in `[[sources]]`. A live source (camera, stream) keeps being read
    (its buffer must not fill with ever older frames) and frames before their slot are
    skipped; another kind waits for its slot (its frames are never skipped). Slots are
    phase-locked (due += period) so a camera whose frames arrive just before their slot is
    not halved: a frame within a quarter period of its slot takes it."""

    def __init__(self, hz: float):
        self.period = 1.0 / hz
        self.due = -float("inf")

    def ready(self, now: float) -> bool:
        """A live frame arriving at `now` may be taken."""
        return now >= self.due - self.period / 4

    def wait_s(self, now: float) -> float:
        """How long a non-live source waits before handing over its frame."""
        return max(0.0, self.due - now)

    def taken(self, now: float) -> None:
        """A frame was handed over at `now`: the next slot."""
        late = now - self.due >= self.period  # stalled (or first): start afresh from now
        self.due = now + self.period if late else self.due + self.period


@dataclass
class Lane:
    """One source as the pipeline runs it: how to open it, its pace and ROI, its state and
    its own counters (health's `pipeline.sources`)."""

    name: str
    open: Callable[[], Any]  # () -> runtime.frames.sources.Source; SourceError when it cannot
    share: float = 1.0  # of the combined rate cap
    pace_hz: float = 0.0  # capture no faster than this (0: as the source delivers)
    # a source that is not live (a folder, a trigger, a video file) waits for its slot under
    # pace_hz; False: only a live one is paced (a single [source]'s video file, see single())
    pace_not_live: bool = True
    roi: tuple[float, ...] = ()
    roi_units: str = "pixels"
    roi_key: str = "source.roi"  # the config key named in ROI errors
    source: Any = None
    state: str = "opening"  # opening | running | failed | ended
    counters: collections.Counter = field(default_factory=collections.Counter)
    e2e: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))
    rects: dict = field(default_factory=dict)  # (w, h) -> roi.Rect or roi.RoiError
    model: str = ""  # the key of its own model (runtime/choice/joint.py); "": the [model]'s
    tiles: int = 0  # inferences its last frame cost (a tiled frame: one per tile; 0: none yet)
    refused: str = ""  # why it is never opened (its own model failed at start): said once
    retry_cap_s: float = 30.0  # the longest wait between re-opens (see retry_cap_s())
    down_since: float | None = None  # monotonic time its outage began (None: delivering)
    last_gap_s: float | None = None  # how long its last outage lasted, failure to frame
    io_timeout_s: float = 0.0  # the longest an open or read of its source blocks (stop waits)

    def stats(self, backlog: int, window_s: float = 30.0) -> dict[str, Any]:
        """Rate and capture-to-result p95 over the last `window_s`, frames waiting, counters."""
        now = time.monotonic()  # e2e is kept by monotonic time (pipeline.py)
        recent = [(t, ms) for t, ms in list(self.e2e) if now - t <= window_s]
        # up to now, not to the last frame (slo_window.window_rate)
        rate = window_rate(len(recent), now, recent[0][0]) if recent else 0.0
        p95 = float(np.percentile([m for _, m in recent], 95)) if recent else None
        return {"state": self.state, "rate_hz": round(rate, 3),
                "e2e_p95_ms": round(p95, 3) if p95 is not None else None,
                "backlog": backlog, **{k: int(v) for k, v in self.counters.items()},
                "down_s": round(time.monotonic() - self.down_since, 1)
                if self.down_since is not None else None,
                "last_gap_s": round(self.last_gap_s, 1) if self.last_gap_s is not None
                else None}


RETRY_CAP_S = 30.0
CAMERA_RETRY_CAP_S = 2.0
# A camera that refused the credentials is retried after at least this long: it is up, and
# each attempt is a failed login; many cameras lock the account (for all its clients, the
# NVR's too) or the address after a handful in a few minutes. A password fixed on the camera
# is met within a minute; one fixed in the config needs a restart anyway.
AUTH_RETRY_S = 60.0
# An OpenCV open that timed out held OpenCV's process-wide open lock for its open_timeout_s:
# its re-open waits at least LOCK_WAITS times that long, so a camera that does not answer
# holds the lock at most 1 / (1 + LOCK_WAITS) of the time (a fifth) and a live camera's
# re-open beside it is seldom held up; up to LOCK_RETRY_MAX_S, the cap of a source that is
# not a camera (open_timeout_s 8: 30 s, a share of 8 / 38). Measured with the camera cap of
# 2 s instead: a camera behind a black hole (open_timeout_s 8) held a live camera's return
# 8.1-8.6 s after each of its restarts (docs/sources.md).
LOCK_WAITS = 4.0
LOCK_RETRY_MAX_S = 30.0


def is_camera(path: str) -> bool:
    """Whether a capture's path is a live camera rather than a file: a stream URL, a device
    index or node (`0`, `/dev/video0`), or a GStreamer pipeline (`... ! appsink`)."""
    return "://" in path or path.isdigit() or path.startswith("/dev/video") or " ! " in path


def retry_cap_s(cfg: Any) -> float:
    """The longest wait between re-opens of a failed source. A camera or stream (a capture of
    a URL, a device or a GStreamer pipeline; a pylon camera) is retried at least every
    CAMERA_RETRY_CAP_S: a rebooted camera is back in tens of seconds and must be met within
    seconds, not after a backoff grown to 30 s (measured before: results 8 s after a 9 s
    outage ended). An attempt on a camera that is still down costs one refused connection,
    or waits out open_timeout_s without CPU: no spinning. A folder, file or trigger source
    keeps the 30 s cap."""
    path = str(getattr(cfg, "path", "") or "")
    kind = getattr(cfg, "kind", "")
    if kind == "pylon" or (kind == "capture" and is_camera(path)):
        return CAMERA_RETRY_CAP_S
    return RETRY_CAP_S


def retry_floor_s(error: BaseException) -> tuple[float, str]:
    """(the least wait before re-opening a source whose open or read raised `error`, why;
    0 and "": the backoff alone decides). Pure. A camera that refused the credentials:
    AUTH_RETRY_S. An open that timed out holding OpenCV's open lock: LOCK_WAITS x the time
    it held it, at most LOCK_RETRY_MAX_S (see above). The cost: a camera whose opens time
    out (unplugged, its network down) is met up to that long after it answers again; one
    that reboots refuses connections meanwhile (fails at once) and keeps the camera cap."""
    from runtime.frames.frame import CredentialsRefused, OpenTimedOut

    if isinstance(error, CredentialsRefused):
        return AUTH_RETRY_S, "the camera refused the credentials"
    if isinstance(error, OpenTimedOut) and error.lock_s > 0:
        return (min(LOCK_RETRY_MAX_S, LOCK_WAITS * error.lock_s),
                "an OpenCV open that times out holds every other OpenCV camera's open")
    return 0.0, ""


class FairQueue:
    """Bounded per-lane FIFOs, served round-robin (see module doc)."""

    def __init__(self, lanes: Sequence[str], maxsize: int):
        self._q = {name: collections.deque() for name in lanes}
        self._order = list(lanes)
        self._next = 0
        self._max = maxsize
        # Two conditions on one lock, each notified only when it can matter (queue.Queue's
        # way): a notify_all on every put and get woke every capture thread and the
        # preprocess thread per frame, each wake-up a context switch and a GIL hand-over.
        self._lock = threading.Lock()
        self._items = threading.Condition(self._lock)  # the consumer waits for an item
        self._room = threading.Condition(self._lock)  # producers wait for room on a lane

    def put(self, lane: str, item: Any, live: bool, stop: threading.Event) -> bool:
        """Queue `item` on its lane. A live lane that is full drops its own oldest item
        (True is returned); another lane blocks until there is room or `stop` is set."""
        with self._lock:
            q = self._q[lane]
            dropped = False
            while len(q) >= self._max:
                if live:
                    q.popleft()
                    dropped = True
                    break
                if stop.is_set():
                    return False
                self._room.wait(0.2)
            q.append(item)
            self._items.notify()
            return dropped

    def get(self, timeout: float) -> Any | None:
        """The next item, taking lanes in turn; None when nothing came within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for i in range(len(self._order)):
                    k = (self._next + i) % len(self._order)
                    q = self._q[self._order[k]]
                    if q:
                        self._next = (k + 1) % len(self._order)
                        if len(q) >= self._max:  # a producer of this lane may wait for room
                            self._room.notify_all()  # (the lanes' producers share it)
                        return q.popleft()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._items.wait(left)

    def empty(self) -> bool:
        """Nothing waits on any lane. Without the lock: the lanes' deques are fixed at
        start, a deque's length is read atomically, and the answer may be stale the moment
        it is given either way (asked by the capture thread each frame: pipeline._inline)."""
        return not any(self._q.values())

    def qsize(self, lane: str) -> int:
        """Items waiting on one lane."""
        with self._lock:
            return len(self._q[lane])


def lanes(sources: Sequence[Any], opener: Callable[[Any, int], Any],
          model_of: Callable[[Any], str] | None = None) -> list[Lane]:
    """Lanes for `[[sources]]` entries: `opener(cfg, i)` opens entry i; `model_of(cfg)` is the
    key of its model ("" = the [model]'s; default: none of its own). A synthetic source
    paces itself at its rate; every other kind is paced by its lane."""
    part = shares([s.rate_hz for s in sources])
    return [Lane(s.name, (lambda s=s, i=i: opener(s, i)), share=part[i],
                 pace_hz=0.0 if s.kind == "synthetic" else s.rate_hz, roi=tuple(s.roi),
                 roi_units=s.roi_units, roi_key=f'[[sources]] name = "{s.name}": roi',
                 model=model_of(s) if model_of else "", retry_cap_s=retry_cap_s(s),
                 io_timeout_s=io_timeout_s(s))
            for i, s in enumerate(sources)]


def single(cfg: Any, opener: Callable[[], Any]) -> list[Lane]:
    """The one lane of a `[source]` section: named `name` or "main", paced at
    `single_pace_hz(cfg)`; a video file played by a capture source is not paced (it is not
    live: known once it is opened), as before several sources existed."""
    return [Lane(cfg.name or "main", opener, pace_hz=single_pace_hz(cfg), pace_not_live=False,
                 roi=tuple(cfg.roi), roi_units=cfg.roi_units, roi_key="[source] roi",
                 retry_cap_s=retry_cap_s(cfg), io_timeout_s=io_timeout_s(cfg))]


def single_pace_hz(cfg: Any) -> float:
    """The rate a single `[source]` is inspected at (0: as it delivers). A camera (a capture
    of a camera or stream, a free-running pylon camera) at its `rate_hz`, as a `[[sources]]`
    entry is, the frames between its slots skipped: the budget plans it at that rate
    (runtime/device/source_plan.py streams()), and a 10 fps camera at `rate_hz = 2` was
    inspected 8-10 times a second (field run, 2026-12-07). The others keep their own pace:
    a synthetic source paces itself, a folder is a backlog inspected as fast as it can be,
    a trigger (MQTT or a PLC's edges) is the line's pace."""
    if cfg.trigger or cfg.kind not in ("capture", "pylon"):
        return 0.0
    return float(cfg.rate_hz)


def io_timeout_s(cfg: Any) -> float:
    """The longest one open or read of a source may block in a library (FFmpeg, pylon):
    the larger of its open_timeout_s and read_timeout_s (0 for a source that has neither)."""
    return max(float(getattr(cfg, "open_timeout_s", 0) or 0),
               float(getattr(cfg, "read_timeout_s", 0) or 0))
