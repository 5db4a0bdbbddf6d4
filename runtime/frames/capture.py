"""One source's capture thread: open it, read it, crop its region of interest and hand each
frame to the pipeline; a failing source is re-opened with backoff and its outage reported.

A failure to open or read is one outage: ONE `source_failed` event and a warning, the
re-opens that fail during it counted and logged at most once a minute, its length in health
(`down_s`, then `last_gap_s`) and said when frames come again. A source that ends (a video
file's last frame) is said once and its thread ends; the rest of the daemon keeps running.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from runtime.frames.badframes import BadFrames
from runtime.frames.frame import BadFrame, Frame, SourceEnded, SourceError
from runtime.frames.multisource import Lane, Pacer, retry_floor_s
from runtime.frames.roi import RoiError, crop, resolve
from runtime.frames.stage_cpu import StageCpu
from runtime.wire.backoff import Backoff
from runtime.wire.events import EventType
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.pipeline")


class Capture:
    """The capture loop of one lane. Its collaborators: `stop` (set: stop capturing),
    `cap_hz()` (the control loop's rate cap: inf = none, 0 = paused), the pipeline's
    refused-frame tally, counters, stage CPU and event sink, and `hand_over(lane, frame,
    waited)`, which takes a frame on to the next stage (`waited`: it had to be waited for,
    so the pipeline is idle); `idle()` says nothing more was ready at once."""

    STABLE_S = 60.0  # a source that ran this long before failing starts its backoff afresh
    READ_S = 0.5  # one read's timeout: how soon a stop or pause is seen
    INLINE_AFTER_WAIT_S = 0.002  # a frame waited for this long found the pipeline idle

    def __init__(self, lane: Lane, n_lanes: int, *, stop: threading.Event,
                 cap_hz: Callable[[], float], bad: BadFrames, counters: collections.Counter,
                 cpu: StageCpu, event: Callable[[dict], None],
                 hand_over: Callable[[Lane, Frame, bool], None], idle: Callable[[], None]):
        self.lane = lane
        self._named = "" if n_lanes == 1 else f"{lane.name} "
        self._stop, self._cap_hz = stop, cap_hz
        self._bad, self._counters, self._cpu, self._event = bad, counters, cpu, event
        self._hand_over, self._idle = hand_over, idle
        self._retry_log = RateLimitedLog(log)  # the re-opens during one outage
        # failures in the outage under way: the backoff's own count runs on across outages
        # (reset only by a source that ran STABLE_S), so it cannot say how many this one took
        self._outage_failures = 0

    def run(self) -> None:
        """The thread's body: until `stop`, or the source ends."""
        lane = self.lane
        if lane.refused:  # its model could not be used: never opened, said once
            lane.state = "failed"
            self._count("source_errors")
            self._event({"type": EventType.SOURCE_FAILED, "severity": "critical",
                         "error": lane.refused[:1000], "source": lane.name})
            return
        # Re-opens back off 0.5, 1, 2, ... s (jittered down to half: cameras on one switch
        # that rebooted together do not reconnect in step) up to the lane's cap
        # (runtime/frames/multisource.py retry_cap_s: a few seconds for a camera, 30 s for
        # the rest); not reset by an open that works (a stream that opens and fails at once
        # must still back off), only by a source that ran STABLE_S.
        backoff, opened = Backoff(0.5, lane.retry_cap_s), 0.0
        pacer = Pacer(lane.pace_hz) if lane.pace_hz > 0 else None
        # per frame, read once here: the loop runs on the thread that infers an idle
        # pipeline's frame (pipeline.py), and its own bookkeeping was CPU the hand loop of
        # docs/benchmarks.md does not spend (monotonic: vDSO; thread_time: a system call)
        monotonic, thread_time, pace_hz = time.monotonic, time.thread_time, lane.pace_hz
        counters, lane_counters, name = self._counters, lane.counters, lane.name
        hint: Callable[[float], None] | None = None  # the open source's rate_hint
        told = -1.0  # the rate last told it (-1: none yet)
        while not self._stop.is_set():
            cap = self._cap_hz()
            if cap <= 0:  # paused by the control loop: read nothing
                self._stop.wait(0.2)
                continue
            if lane.source is None:
                try:
                    lane.source = lane.open()
                    lane.state = "running"
                    opened = monotonic()
                    hint, told = getattr(lane.source, "rate_hint", None), -1.0
                except SourceError as e:
                    self._failed(str(e), backoff, *retry_floor_s(e))
                    continue
                except Exception as e:  # a bug or an unwrapped OS/library error: the same
                    # failure of this source (retried), never the end of its thread
                    log.error("source %s: unexpected error opening it", lane.name,
                              exc_info=backoff.attempts == 0)  # the traceback once a series
                    self._failed(f"{type(e).__name__}: {e}", backoff)
                    continue
            if hint is not None:
                # the rate frames are taken at: a stream may decode key frames only below it.
                # Checked before every read (not only after a frame served): a new cap
                # applies within a read's timeout, not after the frame the old cap's due
                # time held; told when it changed
                taken = min(cap * lane.share, pace_hz or math.inf)
                taken = taken if taken < math.inf else 0.0
                if taken != told:
                    hint(taken)
                    told = taken
            t_read = monotonic()
            self._bad.flush()
            c_read = thread_time()
            try:
                frame = lane.source.read(self.READ_S)
            except BadFrame as e:  # one refused input; the source itself is fine
                self._bad.record(e.kind, e.ref, e.why, lane.name)
                continue
            except SourceEnded as e:  # a video file's last frame: nothing to retry
                lane.source.close()
                self._ended(str(e))
                return
            except Exception as e:  # SourceError, or a bug / unwrapped error (the same to us)
                if not isinstance(e, SourceError):
                    log.error("source %s: unexpected error reading it", lane.name,
                              exc_info=backoff.attempts == 0)
                with contextlib.suppress(Exception):
                    lane.source.close()
                lane.source, hint = None, None
                if monotonic() - opened >= self.STABLE_S:
                    backoff.reset()
                why = str(e) if isinstance(e, SourceError) else f"{type(e).__name__}: {e}"
                self._failed(why, backoff)
                continue
            spent = thread_time() - c_read  # reading, decoding, polling a folder
            if frame is None:
                self._idle()  # nothing more right now: store what is pending
                self._cpu.add("capture", spent)
                continue
            if lane.down_since is not None:
                self._back()
            self._cpu.read(spent, frame)
            if frame.skipped:  # decoded, passed over for a newer one (latest wins)
                lane_counters["skipped_latest"] += frame.skipped
            if frame.damaged:  # the stream's damage the decoder met (concealed or refused)
                self._count("stream_damaged", frame.damaged)
            if frame.not_judged:  # a garbled picture: no verdict on it, a bad frame counted
                # (said at most once a minute: once a burst of damage, not once a frame), and
                # in the source's own health: a camera damaged in every GOP is judged never
                lane_counters["not_judged"] += 1
                self._bad.record("decode_damaged", frame.ref, frame.not_judged, name)
                continue
            if pacer is not None and (lane.source.live or lane.pace_not_live):
                # its own rate_hz (multisource.lanes, single_pace_hz)
                now = monotonic()
                if lane.source.live and not pacer.ready(now):
                    lane_counters["skipped_rate"] += 1  # read to keep the stream fresh
                    continue
                if not lane.source.live and self._stop.wait(pacer.wait_s(now)):
                    return  # stopping: the frame is not handed over (not marked done)
                pacer.taken(monotonic())
            counters["frames"] += 1
            lane_counters["frames"] += 1
            frame.source = name
            if lane.roi:
                c0 = thread_time()
                kept = self._crop(frame)
                self._cpu.add("crop", thread_time() - c0)
                if not kept:
                    continue
            self._hand_over(lane, frame, monotonic() - t_read >= self.INLINE_AFTER_WAIT_S)
            # the cap after a frame served, unless the source paces itself (no cap: no wait)
            if self._cap_hz() < math.inf and not getattr(lane.source, "paced", False) and \
                    self._wait_cap(monotonic()):
                return

    def _wait_cap(self, served: float) -> bool:
        """Wait out the rate cap after a frame served at `served` (monotonic), the cap read
        again every READ_S: a cap raised or lifted meanwhile applies then (one wait of the
        old 1/cap held a 5 Hz cap set after a 0.1 Hz one up to 10 s). True: stopping."""
        while True:
            cap = self._cap_hz() * self.lane.share
            left = served + 1.0 / cap - time.monotonic() if 0 < cap < math.inf else 0.0
            if left <= 0:
                return False
            if self._stop.wait(min(left, self.READ_S)):
                return True

    def _count(self, key: str, n: int = 1) -> None:
        """The pipeline's counter and the lane's own."""
        self._counters[key] += n
        self.lane.counters[key] += n

    def _crop(self, frame: Frame) -> bool:
        """Cut the lane's region of interest out of the frame (before preprocessing). A frame
        the ROI does not fit is counted as `roi_outside` and skipped (False); the rectangle
        is resolved once per frame size."""
        lane = self.lane
        h, w = frame.image.shape[:2]
        rect: Any = lane.rects.get((w, h))
        if rect is None:
            try:
                rect = resolve(lane.roi, lane.roi_units, w, h, lane.roi_key)  # type: ignore[arg-type]
            except RoiError as e:
                rect = e
            if len(lane.rects) < 64:  # a folder of many sizes must not grow this unbounded
                lane.rects[(w, h)] = rect
        if isinstance(rect, RoiError):
            self._bad.record("roi_outside", frame.ref, str(rect), lane.name)
            return False
        frame.image = crop(frame.image, rect)
        return True

    def _ended(self, why: str) -> None:
        """Said once: the capture thread ends, the rest keeps running (queued frames finish,
        health goes on); a restart or a new [source] starts capturing again."""
        self._count("source_ended")
        self.lane.state = "ended"
        log.info("source ended: %s; no more frames%s, the daemon keeps running", why,
                 f" from source {self.lane.name}" if self._named else "")
        self._event({"type": EventType.SOURCE_ENDED, "severity": "info", "reason": why,
                     "source": self.lane.name})

    def _failed(self, why: str, backoff: Backoff, at_least_s: float = 0.0,
                floor_why: str = "") -> None:
        """Count a failure, say it (once an outage) and wait out the backoff's next delay
        (at least `at_least_s`, for `floor_why`: multisource.retry_floor_s)."""
        lane, now = self.lane, time.monotonic()
        delay = max(backoff.next_delay(), at_least_s)
        if delay == at_least_s and floor_why:  # said: the wait is over the lane's cap
            why = f"{why} ({floor_why}: not re-opened for {at_least_s:.0f} s)"
        self._count("source_errors")
        lane.state = "failed"
        self._outage_failures = 1 if lane.down_since is None else self._outage_failures + 1
        if lane.down_since is None:
            lane.down_since = now
            lane.counters["outages"] += 1
            log.warning("source %sfailed: %s; retrying in %.1f s, backing off to at most "
                        "%g s (the daemon keeps running)", self._named, why, delay,
                        max(lane.retry_cap_s, at_least_s))
            self._event({"type": EventType.SOURCE_FAILED, "severity": "warning", "error": why,
                         "retry_s": round(delay, 1), "source": lane.name})
        else:
            self._retry_log.log(f"down-{lane.name}", "source %sstill failing after %.0f s "
                                "(%d failures): %s; retrying every %.1f s", self._named,
                                now - lane.down_since, self._outage_failures, why, delay)
        self._stop.wait(delay)

    def _back(self) -> None:
        """The first frame after an outage: its length into health, said once."""
        lane = self.lane
        assert lane.down_since is not None
        lane.last_gap_s = time.monotonic() - lane.down_since
        lane.down_since = None
        n = self._outage_failures
        log.info("source %sdelivers again after %.1f s (%d failure%s)", self._named,
                 lane.last_gap_s, n, "" if n == 1 else "s")
