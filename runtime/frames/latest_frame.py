"""The newest-frame reader thread every live stream is read by (OpenCV's CaptureSource and
PyAV's AvStreamSource): decodes as frames arrive, keeps the newest, hands it over once."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any


class LatestFrame:
    """A live source's reader thread: decodes every frame as it arrives (a stream that is not
    read falls behind live and its buffers fill, then fail: ultralytics#4211) and keeps only
    the newest; `take` hands that one over once, counting the frames decoded and passed over
    since the last one taken and the reader's thread CPU spent on them (the decode CPU per
    served frame). A read that fails ends the thread; `take` raises its SourceError."""

    JOIN_S = 15.0

    def __init__(self, read_one: Callable[[], Any], shown: str,
                 start: bool = True):
        self._read_one = read_one
        self._cond = threading.Condition()
        self._img: Any = None
        self._t = 0.0
        self._mono = -math.inf  # when the newest was decoded (monotonic)
        self._last = -math.inf  # when the last frame was decoded, kept or passed over
        self.interval = 0.0  # between decoded frames, smoothed (0: not yet known)
        self._n = 0
        self._skipped = 0
        self._cpu = 0.0
        self._error: BaseException | None = None
        self.stopping = threading.Event()  # set by stop(); a reader skipping packets checks it
        self._thread = threading.Thread(target=self._run, name=f"reader-{shown}"[:60],
                                        daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start reading (made with start=False: once its owner can be read from)."""
        self._thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            c0 = time.thread_time()
            try:
                img = self._read_one()
            except BaseException as e:  # SourceError, or anything FFmpeg/OpenCV raised
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            t, mono = time.time(), time.monotonic()
            spent = time.thread_time() - c0
            with self._cond:
                self._cpu += spent
                self._n += 1
                if self._img is not None:
                    self._skipped += 1
                self._decoded_at(mono)
                self._img, self._t, self._mono = img, t, mono
                self._cond.notify_all()

    def passed(self) -> None:
        """On the reader thread, inside `read_one`: a frame decoded and passed over there,
        never kept (a frame that cannot be served is not converted): counted and numbered as
        one decoded and skipped, its time in the stream's interval."""
        mono = time.monotonic()
        with self._cond:
            self._n += 1
            self._skipped += 1
            self._decoded_at(mono)

    def _decoded_at(self, mono: float) -> None:
        """A frame decoded at `mono`: the interval between frames, smoothed (caller holds
        the lock)."""
        gap = mono - self._last
        if 0 < gap < 5:
            self.interval = gap if not self.interval else 0.9 * self.interval + 0.1 * gap
        self._last = mono

    def take(self, timeout_s: float, not_before: float = -math.inf
             ) -> tuple[Any, float, int, float, int] | None:
        """(image (what `read_one` returned), wall time decoded, its number, decode CPU
        since the last take, frames skipped since then), or None when no new frame came
        within `timeout_s`; with `not_before` (monotonic), the first frame decoded at or
        after it (one decoded before waits to be replaced: served as it is decoded, not up to
        a frame interval old)."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or (
                self._img is not None and self._mono >= not_before), timeout_s)
            if self._img is None or self._mono < not_before:
                if self._error is not None:
                    raise self._error
                return None
            out = (self._img, self._t, self._n, self._cpu, self._skipped)
            self._img, self._cpu, self._skipped = None, 0.0, 0
            return out

    def stop(self) -> bool:
        """Stop reading; True once the thread has left (the capture may be released)."""
        self.stopping.set()
        self._thread.join(self.JOIN_S)
        return not self._thread.is_alive()
