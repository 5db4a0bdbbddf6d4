"""The main loop's sleep, cut short by whatever has work for it.

The loop used to nap 50 ms at a time to notice signals, commands and installs: 20 wake-ups a
second on an idle box, half of its idle CPU. It now sleeps until its next deadline (the
control tick, health, the watchdog) on one socket pair that is written to by:
- a signal: the interpreter's C-level handler writes the signal number to it
  (`signal.set_wakeup_fd`), so the Python handler still only sets a flag;
- a command or an install queued by another thread (`WakingQueue`);
- a reload asked from another thread (`Wakeup.set`).

`Signals` holds what the handlers ask for (a stop, a reload) as flags the loop reads.
"""

from __future__ import annotations

import contextlib
import queue
import select
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any


class Wakeup:
    """A socket pair one thread sleeps on and any thread (or a signal) wakes."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._lock = threading.Lock()  # a late set() never sends on a number closed under it
        self._closed = False
        self._old_fd: int | None = None  # the signal wake-up fd before ours (None: not ours)

    def set(self) -> None:
        """Wake the sleeper (any thread, never a signal handler; a no-op once closed). A
        full buffer already holds a wake-up."""
        with self._lock, contextlib.suppress(OSError):  # BlockingIOError: one is pending
            if not self._closed:
                self._w.send(b"\0")

    def wait(self, timeout_s: float) -> None:
        """Sleep until woken or `timeout_s` passed; take every pending wake-up."""
        try:
            poller = select.poll()
            poller.register(self._r, select.POLLIN)
            if poller.poll(max(0.0, timeout_s) * 1e3):
                while self._r.recv(4096):
                    pass
        except (BlockingIOError, InterruptedError):
            pass  # drained
        except (OSError, ValueError):  # closed: the loop is stopping
            pass

    def take_signals(self) -> None:
        """Let signals wake the sleeper (main thread only, like signal.signal)."""
        if threading.current_thread() is threading.main_thread():
            old = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
            if self._old_fd is None:
                self._old_fd = old

    def close(self) -> None:
        """Give the signal wake-up back (the one before ours) and close the pair. Off the
        main thread with signals taken, the pair stays open: the process's wake-up fd
        still names it, and a closed number could be reused by another file."""
        on_main = threading.current_thread() is threading.main_thread()
        if self._old_fd is not None:
            if not on_main:
                return
            signal.set_wakeup_fd(self._old_fd)  # before the close
            self._old_fd = None
        with self._lock:
            self._closed = True
            self._r.close()
            self._w.close()


class WakingQueue(queue.Queue):
    """A queue whose every put wakes a sleeper (the main loop's commands and installs)."""

    def __init__(self, wake: Callable[[], None], maxsize: int = 0):
        super().__init__(maxsize)
        self._wake = wake

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """queue.Queue.put, then wake (put_nowait comes here too)."""
        super().put(item, block, timeout)
        self._wake()


class Signals:
    """SIGTERM/SIGINT ask for a stop, SIGHUP for a reload: flags the main loop reads. Plain
    attributes on purpose: a handler that takes a lock (Event.set) can deadlock against the
    main thread's own wait; the signal wakes the loop through `wakeup`'s fd."""

    def __init__(self, wakeup: Wakeup):
        self.wakeup = wakeup
        self.stop = False
        self.reload = False

    def install(self) -> None:
        """Take the signals (main thread; before start-up, so one during a long cold-start
        profiling is honoured, not fatal)."""
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        self.wakeup.take_signals()  # a signal also ends the main loop's sleep

    def _on_stop(self, *_: Any) -> None:
        self.stop = True  # only a flag: no locks, no I/O in a signal handler

    def _on_reload(self, *_: Any) -> None:
        self.reload = True  # only a flag (the wake-up fd woke the loop)

    def request_reload(self) -> None:
        """A reload at the main loop's next turn (any thread but a signal handler, which
        sets the flag alone): the flag, then a wake-up."""
        self.reload = True
        self.wakeup.set()

    def take_reload(self) -> bool:
        """Whether a reload was asked since the last call (main loop)."""
        asked, self.reload = self.reload, False
        return asked
