"""OTA probation's old sessions of other forms: where the governor moves a new version to a
form the shadow sample holds no old session of (runtime/frames/shadow.py `wanted`), the old
version's session of that form is loaded on a background thread, below the inference threads,
from the old version's measurement (still on disk: a rollback installs it again), and handed to
the pipeline between two frames at the next control tick, so its frames are compared like with
like. A session that finishes loading after its probation ended is closed."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from typing import Any

from runtime.device.served_model import old_session

log = logging.getLogger("edgerun.ota")

# Old sessions loaded beyond the swap's, a probation: the memory they hold is bounded by this
# (a ladder may have many forms); frames on a form past it are judged on every form only.
MAX_FORMS = 3


class ShadowLoads:
    """Loads the old version's sessions a probation's shadow sample wants (module docstring).
    `tick` runs on the main loop; each load on a thread of its own."""

    def __init__(self) -> None:
        self._ready: queue.SimpleQueue = queue.SimpleQueue()  # (probation, Active)
        self._tried: set[str] = set()  # forms asked for in this probation
        self._started = 0  # loads started in this probation
        self._probation = 0  # which probation a finished load belongs to
        self._out = 0  # loads started and not yet handed over or closed
        self._lock = threading.Lock()

    def reset(self) -> None:
        """A probation starts: nothing asked for yet; loads still running are for the last."""
        self._probation += 1
        self._tried, self._started = set(), 0

    def busy(self) -> bool:
        """A load is running, or waits for the next tick to be handed over."""
        with self._lock:
            return self._out > 0

    def tick(self, pipeline: Any, prev: Any, open_: bool) -> None:
        """Hand the sessions loaded to `pipeline`'s shadow (closed when the probation is no
        longer `open_`), then start a load for each form wanted and not asked for yet, from
        `prev` (runtime.choice.measure.Measured of the old version; None: nothing to load)."""
        while True:
            try:
                n, active = self._ready.get_nowait()
            except queue.Empty:
                break
            self._done()
            if open_ and n == self._probation and pipeline.add_shadow(active):
                log.info("probation: the old version's %s loaded; frames on that form are "
                         "compared like with like", active.variant_id)
            else:
                active.session.close()
        if not open_ or prev is None:
            return
        for f, vid in dict(pipeline.shadow.wanted).items():
            if f in self._tried:
                continue
            self._tried.add(f)
            if self._started >= MAX_FORMS:
                log.info("probation: no old session of %s (%d loaded already, the most a "
                         "probation holds): its frames are judged on every form only", f,
                         MAX_FORMS)
                continue
            self._started += 1
            with self._lock:
                self._out += 1
            threading.Thread(target=self._load, args=(self._probation, prev, vid, f),
                             name="shadow-load", daemon=True).start()

    def _load(self, n: int, prev: Any, vid: str, f: str) -> None:
        with contextlib.suppress(OSError, AttributeError):  # frames first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            active = old_session(prev, vid, f)
        except Exception as e:
            self._done()
            log.warning("probation: the old version's session of %s did not load (%s): its "
                        "frames are judged on every form only", f, e)
            return
        if active is None:
            self._done()
            log.info("probation: the old version has no %s variant: frames on it are judged "
                     "on every form only", f)
            return
        self._ready.put((n, active))

    def _done(self) -> None:
        with self._lock:
            self._out -= 1
