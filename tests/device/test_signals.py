"""Review R3: signals while `edgerun serve` starts."""

from __future__ import annotations

import os
import signal
import time

from support.daemon_harness import Serve, events, write_config
from support.waiting import wait


def _loading_engines(pid: int) -> bool:
    """True once the process has mapped numpy: it is importing the daemon (runtime.cli
    itself imports no numpy), the window before the daemon's own handlers exist."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "numpy" in f.read()
    except OSError:
        return False


def test_sighup_storm_while_importing_and_starting_neither_kills_nor_is_lost(tmp_path):
    """`systemctl reload` (SIGHUP) sent while the daemon was still importing its engines
    ended it (SIGHUP's default action; exit -1, nothing logged). It must survive any number
    of them, reload once it can, and stop cleanly."""
    cfg = write_config(tmp_path, tmp_path / "cache")
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: _loading_engines(d.proc.pid), 30, "the engines' import", d)
        sent = 0
        deadline = time.monotonic() + 60
        while not d.ready() and time.monotonic() < deadline and d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGHUP)
            sent += 1
            time.sleep(0.01)
        assert sent > 0
        assert d.proc.poll() is None, f"killed by SIGHUP {sent} during start-up:\n{d.text()}"
        wait(lambda: events(d.outbox, "config_reloaded"), 30, "the reload", d)
    finally:
        code = d.stop()
    assert code == 0, d.text()[-3000:]
