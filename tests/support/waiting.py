"""Polling a condition with a deadline: the one way tests wait for another process or thread
(never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class _Child(Protocol):
    """A child process whose log explains a failed wait (daemon_harness.Serve)."""

    proc: object

    def text(self) -> str: ...


def wait(cond: Callable[[], object], timeout_s: float, what: str,
         proc: _Child | None = None) -> None:
    """Poll `cond` until true; fail naming `what` (with the log tail of `proc`, when given) on
    timeout or when `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"daemon exited ({proc.proc.returncode}) waiting for {what}:\n"
                                 + proc.text()[-3000:])
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}"
                         + (f"\n{proc.text()[-3000:]}" if proc else ""))


def until(cond: Callable[[], object], timeout_s: float) -> bool:
    """Poll `cond` until true or `timeout_s` passes; whether it became true (for checks that
    something does *not* happen, and for callers that assert themselves)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False
