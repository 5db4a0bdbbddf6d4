"""OpenCV's capture: a V4L2 device, a video file, an RTSP/HTTP URL (a live one read by
LatestFrame's thread, runtime/frames/latest_frame.py)."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path

import cv2
import numpy as np

from runtime.config.source import SourceConfig
from runtime.frames.cap_clock import CapClock, spaced
from runtime.frames.frame import Frame, OpenTimedOut, SourceEnded, SourceError
from runtime.frames.frame_shape import FrameShape
from runtime.frames.latest_frame import LatestFrame
from runtime.frames.stream_url import shown, unresolved

log = logging.getLogger("edgerun.source")


_FFMPEG_OPTIONS = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_FFMPEG_LEVEL = "OPENCV_FFMPEG_LOGLEVEL"
# The capture options travel in the environment, read by FFmpeg during the open: one open
# at a time (OpenCV itself serialises FFmpeg opens in a process, with a lock of its own).
_env_lock = threading.Lock()
_quieted = False


def quiet_ffmpeg(debug: bool | None = None) -> None:
    """Keep FFmpeg's and OpenCV's own lines off the terminal and the journal.

    FFmpeg (inside OpenCV) writes from C straight to the process's stdout/stderr; OpenCV
    offers Python no per-message hook, so those lines cannot be turned into log records. What
    can be set is their level: FFmpeg's is read from OPENCV_FFMPEG_LOGLEVEL when OpenCV first
    uses FFmpeg, OpenCV's own (its VIDEOIO warnings) with cv2.utils.logging. Unless the
    operator set those variables, both are silenced, except with `-v` (debug logging), where
    FFmpeg's warnings appear on stdout prefixed `[OPENCV:FFMPEG:24]`. The daemon says itself
    what failed (open or read timeout, refused), see CaptureSource. Once per process."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    if debug is None:
        debug = logging.getLogger("edgerun").isEnabledFor(logging.DEBUG)
    if _FFMPEG_LEVEL not in os.environ:
        os.environ[_FFMPEG_LEVEL] = "24" if debug else "-8"  # AV_LOG_WARNING / AV_LOG_QUIET
    if "OPENCV_LOG_LEVEL" not in os.environ and not debug:
        # lowered only, never raised: the OpenCV backend sets SILENT, and raising it to ERROR
        # let a profiling round write 12 `[ERROR:...] onnx_importer` lines naming no model
        lv = cv2.utils.logging
        lv.setLogLevel(min(lv.getLogLevel(), lv.LOG_LEVEL_ERROR))


class CaptureSource:
    """cv2.VideoCapture on a V4L2 device index, a video file or an RTSP/HTTP URL. A video file
    ends after its last frame (SourceEnded), or starts again with `loop`; a camera or stream
    that stops delivering raises SourceError (the pipeline re-opens it with backoff).

    A URL is opened through FFmpeg with `open_timeout_s` and `read_timeout_s` (OpenCV's
    CAP_PROP_OPEN/READ_TIMEOUT_MSEC) and, for RTSP, the `transport` (FFmpeg's
    `rtsp_transport` through OPENCV_FFMPEG_CAPTURE_OPTIONS; an operator's own value of that
    variable is kept and wins)."""

    def __init__(self, cfg: SourceConfig):
        self._cfg = cfg
        self._target: int | str = int(cfg.path) if cfg.path.isdigit() else cfg.path
        self._url = isinstance(self._target, str) and "://" in self._target
        self._shown = shown(cfg.path)
        self._shape = FrameShape(self._shown, cfg.frame_size)
        try:  # a path the filesystem refuses (too long) raised OSError: a dead thread
            self.live = not Path(str(self._target)).is_file()
        except (OSError, ValueError):
            self.live = True  # not a file: a camera or a stream (the open then says)
        self._loop = cfg.loop and not self.live
        quiet_ffmpeg()  # before FFmpeg's first use in this process: it reads its level once
        self._began = time.monotonic()  # (_open: once it may begin, past the other opens)
        self._cap = self._open()
        if not self._cap.isOpened():
            took = time.monotonic() - self._began
            if self._url and took >= cfg.open_timeout_s * 0.9:
                # held OpenCV's open lock all that time (multisource.retry_floor_s)
                raise OpenTimedOut(f"source.path {self._shown!r}: no stream within "
                                   f"{cfg.open_timeout_s:g} s (open_timeout_s): the server "
                                   "does not answer", lock_s=took)
            if self._url and (why := unresolved(cfg.path)):
                raise SourceError(f"source.path {self._shown!r}: {why}")
            if self._url and "@" in cfg.path.split("://", 1)[1].split("/", 1)[0]:
                # FFmpeg tells OpenCV no more than "failed"; the credentials are the usual
                # cause when a server that answers refuses (never shown: redacted)
                raise SourceError(f"source.path {self._shown!r}: the server refused the "
                                  "stream: check the user and password in the URL (or the "
                                  "stream's path)")
            raise SourceError(f"source.path {self._shown!r}: cannot open (no such camera, "
                              "file or stream, or the server refused)")
        self._n = 0
        self._pass_n = 0  # frames read since the file was (re)opened
        self.converted = 0  # frames retrieved (converted to BGR; a V4L2 camera's decoded)
        self._hint_hz = 0.0  # the rate frames are taken at (rate_hint)
        self._clock = CapClock()  # under a cap: when the next frame is due
        self._reader: LatestFrame | None = None
        if self.live:
            self._reader = LatestFrame(self._next, self._shown)

    def _open(self) -> cv2.VideoCapture:
        if not self._url:
            return cv2.VideoCapture(self._target)
        cfg = self._cfg
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(cfg.open_timeout_s * 1000),
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(cfg.read_timeout_s * 1000)]
        if self.live:
            # One decoder thread, the reader's own: its thread CPU clock is then the stream's
            # whole decode CPU (with FFmpeg's pool, 720p H.264 measured 1.6 ms a frame on the
            # reader and 4.2 ms in the process; with one thread 4.0 and 4.0), and several
            # streams on a small box do not each start a pool of threads per core.
            params += [cv2.CAP_PROP_N_THREADS, 1]
        with _env_lock:
            # timed from here: an open queued behind a camera whose open timed out, then
            # refused at once, was taken for a timeout of its own (retry_floor_s: ~24 s)
            self._began = time.monotonic()
            before = os.environ.get(_FFMPEG_OPTIONS)
            opts = before or ""
            if (str(self._target).lower().startswith("rtsp") and cfg.transport != "auto"
                    and "rtsp_transport" not in opts):
                opts = "|".join(x for x in (opts, f"rtsp_transport;{cfg.transport}") if x)
            if opts:
                os.environ[_FFMPEG_OPTIONS] = opts
            try:  # FFmpeg reads the variable during this call
                return cv2.VideoCapture(self._target, cv2.CAP_FFMPEG, params)
            finally:
                if before is None:
                    os.environ.pop(_FFMPEG_OPTIONS, None)
                else:
                    os.environ[_FFMPEG_OPTIONS] = before

    def rate_hint(self, hz: float) -> None:
        """The rate frames will be taken at (0 or inf: as they come; the pipeline's cap). A
        live source under a cap of at most 2/3 of its rate serves the first frame decoded
        after each due time (`paced`) and passes over, without retrieving, those decoded too
        early to be served: FFmpeg's conversion to BGR (a V4L2 camera's MJPG decode too) is
        spent on frames that are served only."""
        if hz == self._hint_hz:
            return
        self._hint_hz = hz
        self._clock.replan(self._spaced(), hz)

    def _spaced(self) -> float:
        return spaced(self._reader.interval, self._hint_hz) if self._reader else 0.0

    @property
    def paced(self) -> bool:
        """It serves at the hinted rate itself (the pipeline does not wait out the cap)."""
        return self._spaced() > 0

    def _grab(self) -> bool:
        """One grab, timed: a stream's grab that ran into its read timeout is a stall
        (SourceError) whatever it returned (see `stalled`)."""
        t0 = time.monotonic()
        ok = self._cap.grab()
        if self.live and self._url and stalled(time.monotonic() - t0,
                                               self._cfg.read_timeout_s):
            raise SourceError(f"{self._shown}: no frame for {self._cfg.read_timeout_s:g} s "
                              "(read_timeout_s): the stream stalled")
        return ok

    def _next(self) -> np.ndarray | None:
        while (ok := self._grab()) and self._reader is not None and \
                self._clock.never_served(time.monotonic(), self._spaced()):
            self._reader.passed()  # counted and numbered, never retrieved
            if self._reader.stopping.is_set():
                raise SourceError(f"{self._shown}: closing")
        img = self._cap.retrieve()[1] if ok else None
        if img is not None:
            self.converted += 1
            return self._sized(img)
        if self.live:  # (a stall was said by _grab)
            raise SourceError(f"{self._shown}: no frame (camera unplugged or stream down)")
        if not self._loop:
            raise SourceEnded(f"{self._target}: end of the video file after {self._n} frames; "
                              "the source has ended (set [source] loop = true to play it "
                              "again)")
        if self._pass_n == 0:  # a looped file that gives nothing would spin
            raise SourceError(f"{self._target}: no frame from the start of the video file")
        self._cap.release()  # rewind by re-opening: seeking is unreliable across containers
        self._cap, self._pass_n = self._open(), 0
        ok, img = self._cap.read()
        self.converted += bool(ok)
        if not ok or img is None:
            raise SourceError(f"{self._target}: no frame after re-opening the video file to "
                              "loop it")
        return self._sized(img)

    def _sized(self, img: np.ndarray) -> np.ndarray:
        """The frame at `[source] frame_size` where one is set (OpenCV's capture cannot
        scale as it converts: a resize after, INTER_AREA as PyAV's pass)."""
        if not self._cfg.frame_size:
            return img
        self._shape.check(img.shape[1], img.shape[0])
        return cv2.resize(img, tuple(self._cfg.frame_size), interpolation=cv2.INTER_AREA)

    def read(self, timeout_s: float) -> Frame | None:
        """The next decoded frame; SourceEnded after a video file's last frame (unless it
        loops), SourceError when the device or stream stops delivering."""
        if self._reader is not None:  # a live camera or stream: the newest frame decoded
            # (under a cap it paces itself at: the first decoded after its due time)
            got = self._reader.take(timeout_s, self._clock.due if self.paced else -math.inf)
            if got is None:
                return None
            img, t0, n, cpu, skipped = got
            self._n = n
            self._clock.served(time.monotonic(), self._spaced(), self._hint_hz)
            return Frame(_bgr(img), f"frame-{n}", t=t0, decode_cpu_s=cpu, decoded_apart=True,
                         skipped=skipped)
        t0 = time.time()
        img = self._next()
        self._n += 1
        self._pass_n += 1
        return Frame(_bgr(img), f"frame-{self._n}", t=t0)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the reader (it leaves within one read, at most read_timeout_s on a stalled
        stream), then release the capture: releasing it under a read crashes FFmpeg."""
        if self._reader is not None and not self._reader.stop():
            log.warning("%s: the reader is still inside a read after %.0f s; the capture is "
                        "left to it (released when it returns)", self._shown,
                        LatestFrame.JOIN_S)
            return
        self._cap.release()


STALL_MARGIN = 0.02  # of read_timeout_s: FFmpeg's interrupt and our clock are both monotonic


def stalled(took_s: float, read_timeout_s: float) -> bool:
    """Whether a grab of a stream that took `took_s` (monotonic) ran into its read timeout
    (OpenCV's CAP_PROP_READ_TIMEOUT_MSEC, timed from the grab's start): a stall, whatever the
    grab returned. After the timeout fires OpenCV's grab() may still return True with a frame
    the decoder held back (measured: 2.01 s True, 2.04 s True, 2.0 s False with 2000 ms), and
    counting the stall from that frame said it after twice read_timeout_s (field run,
    2026-12-07). An interrupted grab takes at least the timeout; the margin only keeps a
    rounding of the setting to whole milliseconds from hiding one."""
    return took_s >= read_timeout_s * (1 - STALL_MARGIN)


def _bgr(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if img.ndim == 2 else img
