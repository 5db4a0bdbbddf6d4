"""A frame and what every source is: the Source protocol, its errors and the Frame it yields."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class SourceError(Exception):
    """The source failed; the message says what and where."""


class CredentialsRefused(SourceError):
    """The camera answered and refused the credentials (401): it is up, so it is retried
    slowly (runtime/frames/multisource.py AUTH_RETRY_S), not as a camera that is down."""


class OpenTimedOut(SourceError):
    """The open got no answer within open_timeout_s (a camera unplugged, an address behind
    a firewall that drops it). `lock_s`: how long the open held a process-wide lock (OpenCV's
    FFmpeg opens, one at a time in a process: every other OpenCV camera's open waited behind
    it); 0 where it held none (PyAV). runtime/frames/multisource.py retry_floor_s."""

    def __init__(self, message: str, lock_s: float = 0.0):
        super().__init__(message)
        self.lock_s = lock_s


class SourceEnded(SourceError):
    """The source has nothing more to give (a video file's last frame was read, no loop):
    not an error and not retried; the daemon keeps running and says so once."""


class BadFrame(Exception):
    """One input was refused (the source itself is fine): `kind` is one of
    runtime.frames.images.KINDS, `ref` names the file or trigger, the message says why. The pipeline
    counts it (`frames_bad`) and reports it as a rate-limited `frame_bad` event."""

    def __init__(self, ref: str, kind: str, why: str):
        super().__init__(f"{ref}: {why}")
        self.ref, self.kind, self.why = ref, kind, why


@dataclass
class Frame:
    """One image to inspect."""

    image: np.ndarray  # HxWx3 uint8 BGR
    ref: str  # where it came from: file name, frame number, trigger id
    t: float = field(default_factory=time.time)
    truth: str | None = None  # synthetic frames know their class (for live accuracy)
    done: object = None  # folder: callback key, marked done once the result is stored
    source: str = ""  # the name of the source it came from (set by the pipeline)
    # CPU seconds its decoding took in the reading thread, where the source can tell it
    # from the read (file and trigger sources); None: inside the capture (a camera's read)
    decode_cpu_s: float | None = None
    # the camera's own number for this frame (pylon: its block id), so a PLC-triggered
    # part's result names the exact image it was judged on; None: the source has none
    camera_frame: int | None = None
    # decode_cpu_s was spent on the source's own reader thread (a live stream's), not inside
    # `read`: it is not part of the capture thread's CPU
    decoded_apart: bool = False
    skipped: int = 0  # newer frames decoded and passed over before this one (latest wins)
    # damage the decoder met since the frame before (packets refused, frames concealed):
    # counted in health, the frame itself still served (PyAV's sources; OpenCV's capture
    # does not tell)
    damaged: int = 0
    # why it must not be judged, "" when it may: decoded from a picture FFmpeg concealed
    # damage in, or from one referencing such a picture up to the next clean key frame
    # (av_source.py). Counted as a bad frame (`decode_damaged`), never inferred
    not_judged: str = ""


class Source(Protocol):
    """What the pipeline needs from a source."""

    live: bool

    def read(self, timeout_s: float) -> Frame | None:
        """The next frame, or None when nothing arrived within the timeout."""
        ...

    def done(self, frames: list[Frame]) -> None:
        """These frames' results are durable (folder sources remember them then)."""
        ...

    def close(self) -> None:
        """Release the device, file or subscription."""
        ...
