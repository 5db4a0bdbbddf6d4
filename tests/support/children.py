"""Every process a test starts dies with the process that runs the test (an xdist worker, or
pytest itself): a worker that crashes or is killed must not leave a broker, a daemon, a
coordinator or a chromedriver running on the box (issue 32: a dead worker leaked servers).

`install()` (tests/conftest.py, in every pytest process) makes each `subprocess.Popen` started
from the main thread ask the kernel for a parent-death signal (prctl PR_SET_PDEATHSIG) in
the child before it execs. The kernel sends it when the *thread* that forked ends, not the
process: a child started from a short-lived thread would be killed when that thread returns,
so only the main thread's children get it (the main thread lives as long as the worker).
SIGTERM, not SIGKILL: the edgerun demo, daemons and coordinators stop their own children in
order on SIGTERM, which SIGKILL would orphan. A PostgreSQL server started with pg_ctl
daemonizes (its parent is not the worker): runtime/coordinator/pgserver.py reaps those by
the pid of the process that made them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGTERM

# Resolved once, here: the preexec function runs in the forked child, where nothing may be
# imported or looked up (another thread may have held the lock at the fork).
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None
_installed: list[Callable[..., None]] = []


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A Popen `preexec_fn`: the child gets DEATH_SIGNAL when its parent's forking thread
    ends; a parent already gone before the prctl (it would never be signalled) ends it."""

    def preexec() -> None:
        if _libc is not None and _libc.prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def install() -> None:
    """Make every later Popen on the main thread without a preexec_fn of its own die with
    this process (idempotent)."""
    if _installed or _libc is None or not hasattr(_libc, "prctl"):
        return
    original = subprocess.Popen.__init__

    def init(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        # preexec_fn is Popen's 7th parameter: given by position, leave it alone
        if (len(args) < 7 and kwargs.get("preexec_fn") is None
                and threading.current_thread() is threading.main_thread()):
            kwargs["preexec_fn"] = die_with_parent(os.getpid())
        original(self, *args, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    _installed.append(original)


def uninstall() -> None:
    """Undo `install()`."""
    if _installed:
        subprocess.Popen.__init__ = _installed.pop()  # type: ignore[method-assign]
