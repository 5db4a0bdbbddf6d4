"""The hardware boundary of a sleep: arm the RTC wake alarm, suspend to RAM, return on wake.

Real board (`SysfsSuspend`), under a configurable sysfs root (as every other sensor):

    <root>/sys/class/rtc/rtc0/wakealarm   "0" clears an armed alarm (a second alarm is
                                          refused with EBUSY), "+N" arms it N s from now
    <root>/sys/power/state                "mem": suspend to RAM; the write returns after
                                          the resume

Privileges (docs/sleep.md): write access to exactly those two files. The shipped unit stays
hardened (ProtectKernelTunables=yes makes /sys read-only); it needs `ReadWritePaths=` for the
two files and no capability: the files are root-owned 0644, so either the service runs as
root or a udev rule/tmpfiles.d entry gives the service's group write access to them.

Simulator (`SimulatedSuspend`): the plant bills the profile's suspended power until the wake
time, and the daemon process is really stopped: a helper process sends it SIGSTOP, waits the
sleep's wall-clock length (simulated seconds / speed) and sends SIGCONT. Every thread stops,
the broker's keepalive runs out, and on SIGCONT the simulated clock moves on by exactly the
sleep asked for (lockstep: `advance`, the simulated board's, steps the suspended plant through
it; how long the host took to stop and continue the process changes nothing simulated).

    python -m power.suspend PID DEADLINE   (the helper: CLOCK_MONOTONIC; not for operators)
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

WAKEALARM = "sys/class/rtc/{rtc}/wakealarm"
POWER_STATE = "sys/power/state"


class SuspendError(Exception):
    """The board could not be suspended; the text says which file and why."""


@dataclass(frozen=True)
class Woke:
    """How a sleep went: asked for `asked_s`, away `slept_s` (by the board's clock: the wall
    clock on a real board, the simulated clock in the simulator)."""

    asked_s: float
    slept_s: float

    @property
    def early(self) -> bool:
        """Woke more than 2 s before the alarm (another wake source, or the suspend failed
        to stick): the plan's next wake is recomputed from the clock."""
        return self.slept_s < self.asked_s - 2.0


class Suspender(Protocol):
    """What the daemon's sleep handling calls."""

    def problems(self) -> list[str]:
        """Why a suspend would fail now (empty: it can)."""
        ...

    def suspend_for(self, seconds: float) -> Woke:
        """Sleep about `seconds` and return after the wake."""
        ...


class SysfsSuspend:
    """RTC wake alarm + /sys/power/state under `root` (see module doc)."""

    def __init__(self, root: Path, rtc: str = "rtc0", state: str = "mem",
                 clock: Callable[[], float] = time.time, resume_s: float = 0.0):
        self.root, self.state, self._clock = Path(root), state, clock
        self.resume_s = resume_s  # the alarm fires this much earlier: resumed by the deadline
        self.alarm_path = self.root / WAKEALARM.format(rtc=rtc)
        self.state_path = self.root / POWER_STATE

    def problems(self) -> list[str]:
        """Missing files, files this process may not write, a kernel without `state`."""
        out = []
        for p in (self.alarm_path, self.state_path):
            if not p.exists():
                out.append(f"{p} does not exist (no RTC wake alarm or no system sleep in "
                           "this kernel)")
            elif not os.access(p, os.W_OK):
                out.append(f"{p} is not writable by this process (see docs/sleep.md: "
                           "ReadWritePaths= and group write access)")
        if self.state_path.exists():
            try:
                offered = self.state_path.read_text().split()
            except OSError as e:
                out.append(f"{self.state_path}: cannot read: {e.strerror}")
            else:
                if self.state not in offered:
                    out.append(f"{self.state_path} offers {offered or 'nothing'}, not "
                               f"{self.state!r}")
        return out

    def arm(self, seconds: float) -> None:
        """Clear any armed alarm and arm one `seconds` from now (rounded up)."""
        n = max(1, math.ceil(seconds))
        try:
            self.alarm_path.write_text("0\n")
            self.alarm_path.write_text(f"+{n}\n")
        except OSError as e:
            raise SuspendError(f"cannot arm the wake alarm {self.alarm_path}: "
                               f"{e.strerror or e}; not suspending") from e

    def suspend_for(self, seconds: float) -> Woke:
        """Be away `seconds` (until running again): arm the alarm `resume_s` before that,
        write the state (returns after the resume), report the sleep."""
        problems = self.problems()
        if problems:
            raise SuspendError("; ".join(problems))
        self.arm(seconds - self.resume_s)
        start = self._clock()
        try:
            self.state_path.write_text(f"{self.state}\n")
        except OSError as e:  # EBUSY: a driver refused to suspend; the alarm stays harmless
            raise SuspendError(f"the kernel refused to suspend ({self.state_path}: "
                               f"{e.strerror or e}); staying awake") from e
        return Woke(seconds, self._clock() - start)


class SimulatedSuspend:
    """The simulator's board: the plant sleeps, the process is stopped (module doc)."""

    def __init__(self, plant, speed: float, pid: int | None = None,
                 advance: Callable[[float], None] | None = None):
        self.plant, self.speed = plant, speed
        self.pid = os.getpid() if pid is None else pid
        # what moves simulated time through the sleep: the daemon's simulated board
        # (runtime/device/simdevice.py), or the bare plant
        self.advance = advance if advance is not None else (lambda dt: plant.step(dt, 0.0))

    def problems(self) -> list[str]:
        """The simulated profile must be able to suspend."""
        st = self.plant.device.states
        return [] if st is not None and st.can_suspend else [
            f"device profile {self.plant.device.name} cannot suspend ([states] can_suspend)"]

    def suspend_for(self, seconds: float) -> Woke:
        """Stop this process for `seconds / speed` of wall time; the plant sleeps `seconds`
        of simulated time (slept_s is simulated)."""
        problems = self.problems()
        if problems:
            raise SuspendError("; ".join(problems))
        t0 = self.plant.s.t
        self.plant.suspend(t0 + seconds)
        start = time.monotonic()
        # The helper wakes us at an absolute CLOCK_MONOTONIC deadline (one clock for every
        # process), so its own start-up (tenths of a second: minutes at 300x) is part of the
        # sleep instead of being added to it.
        helper = subprocess.Popen([sys.executable, "-m", "power.suspend", str(self.pid),
                                   f"{start + seconds / self.speed:.6f}"],
                                  stdin=subprocess.DEVNULL)
        helper.wait()  # it stops us, waits, continues us, exits: returns after the "resume"
        self.advance(seconds)  # the board slept exactly that long in simulated time
        return Woke(seconds, self.plant.s.t - t0)


def _helper(argv: list[str]) -> int:
    pid, deadline = int(argv[0]), float(argv[1])
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(max(0.0, deadline - time.monotonic()))
    finally:  # whatever happens here, the stopped process must run again
        os.kill(pid, signal.SIGCONT)
    return 0


if __name__ == "__main__":
    sys.exit(_helper(sys.argv[1:]))
