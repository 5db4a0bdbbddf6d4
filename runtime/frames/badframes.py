"""Count refused frames by kind and tell the operator, without flooding the outbox.

A camera that starts sending garbage, or a folder filled with cut files, can produce
hundreds of bad frames a second; each one is counted (`counts()` goes into health as
`pipeline.frames_bad`, every kind always present), logged and turned into an event at most
once per kind per `window_s`. The next event of that kind carries `suppressed`: how many of
that kind were counted but not reported since the last one. `flush()` reports those that
are still waiting once their window has passed, so the tail of a burst is not lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runtime.frames.images import KINDS
from runtime.wire.events import EventType

log = logging.getLogger("edgerun.pipeline")

# Image kinds (frames/images.py) plus frames that decoded but could not be preprocessed, and
# frames the source's region of interest does not fit (frames/roi.py), and frames whose model
# output was not of the declared detector form (runtime/engine/detection.py), and a stream's
# frames decoded from damaged data, not judged (frames/av_source.py, Frame.not_judged).
FRAME_KINDS = (*KINDS, "preprocess_failed", "roi_outside", "postprocess_failed",
               "decode_damaged")


class BadFrames:
    """Per-kind counters and a rate-limited `frame_bad` event (see module docstring)."""

    def __init__(self, on_event: Callable[[dict], None], window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._event = on_event
        self._window = window_s
        self._clock = clock
        self._lock = threading.Lock()  # capture and preprocess threads both record
        self._counts = dict.fromkeys(FRAME_KINDS, 0)
        self._last: dict[str, float] = {}  # kind -> when its last event went out
        # kind -> (suppressed, ref, why, source)
        self._held: dict[str, tuple[int, str, str, str]] = {}

    def record(self, kind: str, ref: str, why: str, source: str = "") -> None:
        """Count one refused frame; log and report it unless this kind was reported within
        the window (then it is held and reported later as `suppressed`). `source`: the
        [[sources]] name it came from, said with it ("" for none: one source, a stage after
        the sources): a camera's frame ref ("frame-N") names no camera."""
        if kind not in self._counts:
            kind = "corrupt"  # an unknown kind is still counted, never lost
        with self._lock:
            self._counts[kind] += 1
            now = self._clock()
            if now - self._last.get(kind, -float("inf")) < self._window:
                n = self._held.get(kind, (0, "", "", ""))[0]
                self._held[kind] = (n + 1, ref, why, source)
                return
            self._last[kind] = now
            suppressed = self._held.pop(kind, (0, "", "", ""))[0]
            total = self._counts[kind]
        self._report(kind, ref, why, suppressed, total, source)

    def flush(self) -> None:
        """Report held frames of every kind whose window has passed (cheap when none)."""
        if not self._held:
            return
        due = []
        with self._lock:
            now = self._clock()
            for kind in [k for k in self._held if now - self._last.get(k, 0) >= self._window]:
                n, ref, why, source = self._held.pop(kind)
                self._last[kind] = now
                due.append((kind, ref, why, n - 1, self._counts[kind], source))
        for kind, ref, why, suppressed, total, source in due:
            self._report(kind, ref, why, suppressed, total, source)

    def _report(self, kind: str, ref: str, why: str, suppressed: int, total: int,
                source: str = "") -> None:
        more = f" ({suppressed} more of this kind since the last report)" if suppressed else ""
        of = f" of source {printable(source)}" if source else ""
        log.warning("frame %s%s refused (%s): %s; skipped%s", printable(ref), of, kind, why,
                    more)
        try:
            self._event({"type": EventType.FRAME_BAD, "severity": "warning", "kind": kind,
                         "ref": str(ref)[:200], "error": str(why)[:300],
                         "suppressed": suppressed, "total": total,
                         **({"source": source} if source else {})})
        except Exception as e:  # reporting must never take the capture thread down
            log.error("could not report a bad frame: %s", e)

    def counts(self) -> dict[str, int]:
        """Every kind with its count (zeros included) and `total`."""
        with self._lock:
            out = dict(self._counts)
        out["total"] = sum(out.values())
        return out


def printable(ref: str) -> str:
    """A frame's ref (a file name: from outside) for a log line: control characters and
    whitespace other than a space escaped, so a name holding a newline cannot forge a
    log line of its own (journald files each line as a record)."""
    return "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}"
                   for c in str(ref))[:300]
