"""Counting and rate-limited logging of messages refused at the trust boundary.

A hostile or broken publisher can send thousands of bad messages a second; each one is
counted, but the log gets one line per kind per minute (with how many were suppressed), so the
log stays readable and the disk does not fill.
"""

from __future__ import annotations

import collections
import logging
import threading
import time


class RateLimitedLog:
    """`log(kind, fmt, *args)` writes at most one line per kind per `every_s`."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0):
        self._log = logger
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def log(self, kind: str, fmt: str, *args: object, level: int = logging.WARNING,
            exc_info: bool = False) -> bool:
        """Log unless `kind` was logged within `every_s`; True when a line was written.
        `exc_info`: with the traceback of the exception being handled."""
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -1e18) < self.every_s:
                self._suppressed[kind] += 1
                return False
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        more = f" ({suppressed} more like it since the last report)" if suppressed else ""
        self._log.log(level, fmt + "%s", *args, more, exc_info=exc_info)
        return True
