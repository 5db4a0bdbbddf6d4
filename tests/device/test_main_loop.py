"""The daemon's main loop sleeps until its next duty (runtime/device/wakeup.py): a signal, a
queued command or install wakes it; an idle box wakes it about once a tick, not 20 times a
second."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.benches import load_bench
from support.daemon_harness import Serve, write_config
from support.under_test import child_env
from support.waiting import wait

from models import bundled
from runtime.device.wakeup import Wakeup, WakingQueue

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _woken_within(w: Wakeup, poke, limit_s: float = 30.0) -> float:
    """Seconds a `wait(limit_s)` took when `poke()` runs once the waiter sleeps."""
    took: list[float] = []
    t = threading.Thread(target=lambda: (t0 := time.monotonic(), w.wait(limit_s),
                                         took.append(time.monotonic() - t0)))
    t.start()
    time.sleep(0.05)  # (if the poke comes before the sleep, the pending byte ends it at once)
    poke()
    t.join(limit_s + 5)
    return took[0]


def test_a_set_from_another_thread_ends_the_sleep():
    w = Wakeup()
    assert _woken_within(w, w.set) < 10
    w.close()


def test_a_put_on_a_waking_queue_ends_the_sleep():
    w = Wakeup()
    q = WakingQueue(w.set, maxsize=2)
    assert _woken_within(w, lambda: q.put_nowait("cmd")) < 10
    assert q.get_nowait() == "cmd"
    w.close()


def test_pending_wake_ups_are_taken_by_one_wait():
    w = Wakeup()
    for _ in range(10_000):  # more than the buffer holds: the rest are dropped, not raised
        w.set()
    t0 = time.monotonic()
    w.wait(30.0)  # returns at once, and takes them all
    assert time.monotonic() - t0 < 10
    t0 = time.monotonic()
    w.wait(0.2)
    assert time.monotonic() - t0 >= 0.15  # nothing left pending: it slept
    w.close()
    w.set()  # closed: a no-op (a thread still holding the queue during the stop)
    w.wait(1.0)  # closed: returns


def test_a_signal_ends_the_sleep_and_its_handler_only_sets_a_flag():
    """In a process of its own (tests/support/signal_sleeper.py), signalled by its pid once
    its handler is in place: a test that signalled its own process could end the test runner
    (SIGUSR1's default action; issue 32)."""
    p = subprocess.Popen([sys.executable, str(SUPPORT / "signal_sleeper.py")], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    try:
        assert p.stdout.readline() == "ready\n", p.stderr.read()
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, f"exit {p.returncode}: {err}"
    got = json.loads(out)
    assert got["took_s"] < 10  # woken by the signal, not the 60 s limit
    assert got["seen"] == [signal.SIGUSR1]
    assert got["fd_given_back"]


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                    reason="bundled model not built")
def test_an_idle_daemon_wakes_its_main_loop_about_once_a_tick(tmp_path, profile_cache):
    """A quiet watched folder: the main thread slept 50 ms at a time (~20 wake-ups a
    second); now until its next tick (1 s) or health."""
    folder = tmp_path / "inbox"
    folder.mkdir()
    cfg = write_config(tmp_path, profile_cache,
                       source=f'kind = "folder"\npath = "{folder}"\nwatch = true')
    cfg.write_text(cfg.read_text().replace("tick_s = 0.2", "tick_s = 1.0")  # the defaults
                   .replace("health_interval_s = 0.3", "health_interval_s = 5.0"))
    d = Serve(tmp_path, cfg)
    try:
        wait(d.ready, 120, "ready", d)
        time.sleep(2.0)  # start-up's last work (first health, the first ticks) done
        switches = load_bench("overhead").voluntary_switches  # what the bench counts
        n0 = switches(d.proc.pid)
        time.sleep(4.0)
        woke = switches(d.proc.pid) - n0
        # ~1 a second for the tick, a few for health and the GIL; the old loop: >= 80
        assert woke <= 24, f"the main thread slept {woke} times in 4 s idle"
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("now, next_health, board_t, board_next, due", [
    (10.0, 10.0, None, 0.0, True),  # a real board: by the wall
    (9.9, 10.0, None, 0.0, False),
    (9.9, 10.0, 28875.0, 28875.0, True),  # a simulated board: by its own clock
    (10.0, 10.0, 28874.0, 28875.0, False),  # the wall's interval alone is not enough
    (50.0, 10.0, 28874.0, 28875.0, False),  # however slow the host
    (10.0, 10.0, 29089.0, 28875.0, True),  # a catch-up: due at once, not after the batch
])
def test_health_is_due_by_the_boards_own_clock(now, next_health, board_t, board_next, due):
    """Simulating, health comes every health_interval_s x speed of the board's time, so a
    report of it (on its clock) sees an even cadence, not the host's pace: a catch-up after
    a stall ran 214 simulated s between two healths and the report drew it as a gap."""
    from runtime.device.daemon import health_due

    assert health_due(now, next_health, board_t, board_next) is due
