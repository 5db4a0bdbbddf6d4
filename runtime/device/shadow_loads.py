"""OTA probation's old sessions of other forms: where the governor moves a new version to a
form the shadow sample holds no old session of (runtime/frames/shadow.py `wanted`), the old
version's session of that form is loaded and warmed on a background thread (at a lower CPU
priority than inference; ONNX Runtime releases the GIL while it builds and runs a session) from
the old version's measurement (still on disk: a rollback installs it again), and handed to the
pipeline between two frames at the next control tick, so its frames are compared like with
like. A session that finishes loading after its probation ended is closed; at the daemon's
stop the loads are waited for and what they made is closed."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from runtime.device.served_model import old_session

log = logging.getLogger("edgerun.ota")

# Old sessions beyond the swap's, held and loading at once (across probations): the memory
# they take is bounded by this (a ladder may have many forms); frames on a form past it are
# compared with the swap's session, on every form.
MAX_FORMS = 3
STOP_WAIT_S = 30.0  # a load still running at the daemon's stop is waited for so long


class ShadowLoads:
    """Loads the old version's sessions a probation's shadow sample wants (module docstring).
    `tick` and `close` run on the main loop; each load on a thread of its own."""

    def __init__(self) -> None:
        self._ready: queue.SimpleQueue = queue.SimpleQueue()  # (probation, Active)
        self._tried: set[str] = set()  # forms loaded or being loaded in this probation
        self._said: set[str] = set()  # forms said to be past MAX_FORMS in this probation
        self._probation = 0  # which probation a finished load belongs to
        self._out = 0  # loads running or waiting to be handed over (any probation)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def reset(self) -> None:
        """A probation starts: nothing asked for yet; loads still running are for the last
        (they count against MAX_FORMS until they end)."""
        self._probation += 1
        self._tried, self._said = set(), set()

    def busy(self) -> bool:
        """A load is running, or waits for the next tick to be handed over."""
        with self._lock:
            return self._out > 0

    def tick(self, pipeline: Any, prev: Any, open_: bool) -> None:
        """Hand the sessions loaded to `pipeline`'s shadow (closed when the probation is no
        longer `open_`), then start a load for each form wanted and not asked for yet, from
        `prev` (runtime.choice.measure.Measured of the old version; None: nothing to load),
        while fewer than MAX_FORMS are held and loading."""
        for n, active in self._drain():
            if open_ and n == self._probation and pipeline.add_shadow(active):
                log.info("probation: the old version's %s loaded; frames on that form are "
                         "compared like with like", active.variant_id)
            else:
                active.session.close()
        self._threads = [t for t in self._threads if t.is_alive()]
        if not open_ or prev is None or self._closed:
            return
        held = len(pipeline.shadow.sessions()) - 1  # beside the swap's
        for f, vid in dict(pipeline.shadow.wanted).items():
            if f in self._tried:
                continue
            with self._lock:
                room = held + self._out < MAX_FORMS
                if room:
                    self._out += 1
            if not room:
                if f not in self._said:
                    self._said.add(f)
                    log.info("probation: no old session of %s yet (%d held or loading, the "
                             "most at once): its frames are compared with the swap's session",
                             f, MAX_FORMS)
                continue
            self._tried.add(f)
            t = threading.Thread(target=self._load, args=(self._probation, prev, vid, f),
                                 name="shadow-load", daemon=True)
            self._threads.append(t)
            t.start()

    def close(self) -> None:
        """No more loads; those running are waited for (STOP_WAIT_S at most) and every
        session loaded and not handed over is closed."""
        self._closed = True
        for t in self._threads:
            t.join(STOP_WAIT_S)
        for _n, active in self._drain():
            active.session.close()

    def _drain(self) -> Iterator[tuple[int, Any]]:
        """The sessions loaded since the last look, with their probation's number."""
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                return
            self._done()
            yield got

    def _load(self, n: int, prev: Any, vid: str, f: str) -> None:
        with contextlib.suppress(OSError, AttributeError):  # frames first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            active = old_session(prev, vid, f)
        except Exception as e:
            self._done()
            log.warning("probation: the old version's session of %s did not load (%s): its "
                        "frames are compared with the swap's session", f, e)
            return
        if active is None:
            self._done()
            log.info("probation: the old version has no %s variant: its frames are compared "
                     "with the swap's session", f)
            return
        self._ready.put((n, active))

    def _done(self) -> None:
        with self._lock:
            self._out -= 1
