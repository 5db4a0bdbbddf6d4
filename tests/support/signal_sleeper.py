"""A process for tests/device/test_main_loop.py's signal test: the daemon's way of sleeping
(runtime/device/wakeup.py) with signals taken and a SIGUSR1 handler that only sets a flag.

The test signals this process, never its own: SIGUSR1's default action ends a process, so a
signal the test runner sent itself could end the runner (issue 32: an xdist worker died in
that test). Prints `ready` once the handler and the wake-up fd are in place, sleeps until
woken (60 s at most), then prints one JSON line: how long the sleep took, what the handler
saw, whether the wake-up fd before ours was given back.
"""

from __future__ import annotations

import json
import signal
import time

from runtime.device.wakeup import Wakeup


def main() -> None:
    before = signal.set_wakeup_fd(-1)  # whatever the process had (given back by close())
    signal.set_wakeup_fd(before)
    seen: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    w = Wakeup()
    w.take_signals()
    print("ready", flush=True)
    t0 = time.monotonic()
    w.wait(60.0)
    took = time.monotonic() - t0
    w.close()
    print(json.dumps({"took_s": took, "seen": seen,
                      "fd_given_back": signal.set_wakeup_fd(-1) == before}), flush=True)


if __name__ == "__main__":
    main()
