"""Whether the wall clock can be believed, and the stamp that lets a time be corrected later.

A box without a real-time-clock battery (every Raspberry Pi before the 5) boots at the last
saved time, or 1970, and jumps at its first NTP sync, by days either way. Wall time is then a
claim, not a fact (docs/clocks.md): every result, health and event carries a `clk` stamp
saying whether the clock was synced when it was made, the kernel's boot id and CLOCK_BOOTTIME
then. Within one kernel boot, wall minus boottime is one number once the clock is synced;
any synced message of that boot gives it, and the coordinator places the unsynced ones with it
(runtime/coordinator/clock_place.py).

CLOCK_BOOTTIME rather than CLOCK_MONOTONIC: it keeps counting through a suspend (a
duty-cycling device suspends, runtime/device/sleep.py), so the offset stays one number across
sleeps. Both restart at a reboot, hence the boot id beside it.

The decision (`judge`) is pure and table-tested; the reads (`read`: systemd-timesyncd's flag
file under a configurable root, the kernel's `adjtimex`, the boot id) are at the edge.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("edgerun.clock")

# timesyncd touches this once the clock is synchronised (systemd-timesyncd.service(8))
TIMESYNC_FLAG = "run/systemd/timesync/synchronized"
BOOT_ID = "proc/sys/kernel/random/boot_id"
# No time this software stamped can be earlier than its own making: a clock reading before
# 2025-01-01 is a box that booted at 1970 or at a long-stale saved time.
FLOOR_T = 1_735_689_600.0
# Nor later than 2100-01-01 (a corrupt RTC, a bad NTP answer); the payload schemas refuse
# times past 2286 (payloads.T_MAX) outright.
CEILING_T = 4_102_444_800.0

# adjtimex(2): the return value TIME_ERROR and the status bit STA_UNSYNC mean "not synced"
TIME_ERROR = 5
STA_UNSYNC = 0x0040


@dataclass(frozen=True)
class Reading:
    """What the edge read: the wall clock, CLOCK_BOOTTIME, the kernel boot id, timesyncd's
    flag (None: no timesyncd on this box) and the kernel's view (None: adjtimex failed)."""

    wall: float
    boottime: float
    boot_id: str
    timesync: bool | None
    kernel: bool | None


@dataclass(frozen=True)
class Status:
    """The judgement: `state` is "synced", "unsynced" or "implausible" (the wall clock reads
    before FLOOR_T or after CEILING_T); `synced` is True only for the first."""

    state: str
    reason: str

    @property
    def synced(self) -> bool:
        """Whether wall time can be believed."""
        return self.state == "synced"


def judge(r: Reading) -> Status:
    """Whether the wall clock of `r` can be believed (pure). An implausible reading is never
    synced whatever a flag says: a flag left behind from before a reboot, or a kernel that
    thinks it is disciplined to a server that answered nonsense."""
    if r.wall < FLOOR_T:
        return Status("implausible", f"the clock reads {_iso(r.wall)}, before this software "
                      "existed (a box without an RTC battery that booted at 1970 or a stale "
                      "saved time)")
    if r.wall > CEILING_T:
        return Status("implausible", f"the clock reads {_iso(r.wall)}, after 2100 (a corrupt "
                      "RTC or a bad time server)")
    if r.timesync:
        return Status("synced", "systemd-timesyncd has synchronised the clock")
    if r.kernel:
        return Status("synced", "the kernel reports the clock synchronised (adjtimex)")
    said = ["systemd-timesyncd has not synchronised it" if r.timesync is False else
            "no systemd-timesyncd", "adjtimex reports TIME_ERROR/STA_UNSYNC" if r.kernel is False
            else "adjtimex cannot be asked"]
    return Status("unsynced", f"not synchronised ({'; '.join(said)})")


def _iso(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f} s since the epoch"


class _Timex(ctypes.Structure):
    # struct timex of <sys/timex.h> on Linux (x86_64 and aarch64 share this layout): the
    # fields up to `status` matter; the tail is padding the kernel may write.
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
                ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


_libc: Any = None


def kernel_synced() -> bool | None:
    """The kernel's view through adjtimex(2) with no modes set (read only, no privilege):
    False when it returns TIME_ERROR or sets STA_UNSYNC; None when it cannot be asked."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        tx = _Timex()
        rc = _libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return None
    if rc < 0:
        return None
    return rc != TIME_ERROR and not tx.status & STA_UNSYNC


def read(root: str | Path = "/", kernel: bool = True,
         wall: Callable[[], float] = time.time) -> Reading:
    """Read the clock's state (the edge): `root` is where `run/` and `proc/` are found
    (tests and the simulator point it at a folder, as the sysfs reads are); `kernel` False
    leaves adjtimex out (a simulated root says everything itself)."""
    base = Path(root)
    flag = base / TIMESYNC_FLAG
    if flag.exists():
        timesync: bool | None = True
    else:  # no flag: timesyncd runs but has not synced (its folder exists), or is absent
        timesync = False if flag.parent.is_dir() else None
    boot_id = "unknown"
    for where in (base, Path("/")):  # a fake root without one: this kernel's own
        try:
            # 12 hex digits of the UUID: unique among one device's boots, and 24 bytes less
            # on every stamped result than the whole UUID
            boot_id = (where / BOOT_ID).read_text().strip().replace("-", "")[:12] or "unknown"
            break
        except OSError:
            continue
    return Reading(wall=wall(), boottime=time.clock_gettime(time.CLOCK_BOOTTIME),
                   boot_id=boot_id, timesync=timesync,
                   kernel=kernel_synced() if kernel else None)


def stamp(status: Status, r: Reading) -> dict[str, Any]:
    """The `clk` member of a message made at reading `r`: synced or not, the kernel boot id
    and CLOCK_BOOTTIME (seconds, ms precision)."""
    return {"sync": status.synced, "kb": r.boot_id, "bt": round(r.boottime, 3)}


def offset_of(t: float, clk: Any) -> float | None:
    """Wall minus boottime from a message stamped synced at `t`, or None when its stamp
    gives none (unsynced, missing, malformed)."""
    if not isinstance(clk, dict) or clk.get("sync") is not True:
        return None
    bt = clk.get("bt")
    if isinstance(bt, bool) or not isinstance(bt, int | float) or not FLOOR_T <= t <= CEILING_T:
        return None
    return float(t) - float(bt)


def placed(t: float, clk: Any, offset: float | None) -> float | None:
    """Where an unsynced message made at boottime `clk["bt"]` really belongs, given its boot's
    offset (wall minus boottime); None when it needs no placing (synced, no stamp) or cannot
    be placed yet (no offset known)."""
    if offset is None or not isinstance(clk, dict) or clk.get("sync") is not False:
        return None
    bt = clk.get("bt")
    if isinstance(bt, bool) or not isinstance(bt, int | float) or bt < 0:
        return None
    return round(offset + float(bt), 3)


class Clock:
    """The device's clock status, read at most every `every_s` (monotonic) and shared by the
    threads that stamp messages. Logs each change of state once; counts implausible
    readings (`implausible_total`) and jumps of the wall clock against boottime
    (`jumps_total`, over JUMP_S), so an operator sees a box that booted at 1970 and what
    happened at its sync."""

    JUMP_S = 2.0  # wall minus boottime moving more than this between reads: a step, not a slew

    def __init__(self, root: str | Path = "/", every_s: float = 5.0, kernel: bool = True,
                 wall: Callable[[], float] = time.time):
        # `wall`: the wall clock read (tests give one that jumps)
        self.root, self.every_s, self.kernel, self.wall = root, every_s, kernel, wall
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._reading: Reading | None = None
        self.status = Status("unsynced", "not read yet")
        self.implausible_total = 0
        self.jumps_total = 0
        self.last_jump_s = 0.0

    def now(self) -> tuple[Status, Reading]:
        """The status and a fresh reading (the reading is always fresh: its wall time is the
        message's; the status is at most `every_s` old)."""
        # only the two clocks each time (a stamp per stored batch): the files at most every
        # `every_s`
        wall, boottime = self.wall(), time.clock_gettime(time.CLOCK_BOOTTIME)
        with self._lock:
            mono = time.monotonic()
            if mono - self._at >= self.every_s or self._reading is None:
                self._at = mono
                self._update(read(self.root, kernel=self.kernel, wall=self.wall))
            last = self._reading
        assert last is not None
        # the flags as last read, the wall clock as it is now: a jump since is judged at once
        r = Reading(wall, boottime, last.boot_id, last.timesync, last.kernel)
        return judge(r), r

    def stamp(self) -> dict[str, Any]:
        """The `clk` stamp of a message made now."""
        status, r = self.now()
        return stamp(status, r)

    def _update(self, r: Reading) -> None:
        prev = self._reading
        status = judge(r)
        if prev is not None:
            step = (r.wall - r.boottime) - (prev.wall - prev.boottime)
            if abs(step) > self.JUMP_S:
                self.jumps_total += 1
                self.last_jump_s = step
                log.warning("the wall clock jumped %+.1f s (now %s, %s); intervals run on the "
                            "monotonic clock and are unaffected", step, _iso(r.wall),
                            status.state)
        if status.state != self.status.state:
            if status.state == "implausible":
                self.implausible_total += 1
                log.error("clock: %s; results, health and events are stamped unsynced with the "
                          "boot id and boottime, and placed once the clock is synced",
                          status.reason)
            elif status.synced:
                log.info("clock: %s (reads %s)", status.reason, _iso(r.wall))
            else:
                log.warning("clock: %s; messages are stamped unsynced until it is", status.reason)
        self._reading, self.status = r, status

    def health(self) -> dict[str, Any]:
        """The health message's `clock` section."""
        with self._lock:
            return {"state": self.status.state, "reason": self.status.reason,
                    "implausible_total": self.implausible_total,
                    "jumps_total": self.jumps_total, "last_jump_s": round(self.last_jump_s, 3)}


def stamp_each(items: list[dict[str, Any]], clk: dict[str, Any], wall: float) -> None:
    """Give each item (a result, carrying its own `t`) the stamp `clk` taken at wall time
    `wall`, its boottime moved back by the item's age so `bt` is the moment of its `t` (a
    frame captured 40 ms before it was stored). An age out of [0, 1 h] (the clock stepped
    in between) keeps the stamp's own boottime: off by the latency, never by the step."""
    for it in items:
        age = wall - it["t"] if isinstance(it.get("t"), int | float) else 0.0
        bt = clk["bt"] - age if 0.0 <= age <= 3600.0 and clk["bt"] - age >= 0 else clk["bt"]
        it["clk"] = {**clk, "bt": round(bt, 3)}


class SteadyWall:
    """Wall time for judging ages (retention, pruning): it follows the wall clock, and a step
    back at once (keeping data longer is safe), but never a step forward past what the
    monotonic clock has counted since the last reading (a clock jumping 7 days ahead must
    not delete a week of data). A forward step is logged once and counted (`jumps_total`);
    the time it held back stays held back until the process restarts (data kept longer)."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic, slack_s: float = 60.0,
                 what: str = "retention"):
        self.wall, self.mono, self.slack_s, self.what = wall, mono, slack_s, what
        self._w0, self._m0 = wall(), mono()
        self._ahead = False
        self.jumps_total = 0

    def now(self) -> float:
        """The wall time to judge ages by (see the class docstring)."""
        w, m = self.wall(), self.mono()
        steady = self._w0 + (m - self._m0)
        if w > steady + self.slack_s:  # stepped forward: hold to what monotonic counted
            if not self._ahead:
                self._ahead = True
                self.jumps_total += 1
                log.warning("the wall clock reads %s, %.0f s ahead of what the monotonic clock "
                            "counted; %s judges ages by the monotonic clock (data is kept "
                            "longer, never deleted early)", _iso(w), w - steady, self.what)
            return steady
        if self._ahead:
            log.info("the wall clock is back in step for %s", self.what)
        self._ahead = False
        self._w0, self._m0 = w, m  # in step, or stepped back: follow it
        return w


class StepClock:
    """The wall clock read as two numbers: `steady`, which follows its slews but none of its
    steps (across a step it advances only as the monotonic clock does), and `step`, the sum
    of the steps since the start (wall = steady + step). A step is the wall clock moving more
    than `slack_s` away from what the monotonic clock counted since the last reading (an NTP
    step, a 1970 boot's first sync, `date -s`); each is logged and counted. Unlike
    SteadyWall (retention: a step back followed, one forward held until the wall clock comes
    back to it) it holds both ways and for good, and says by how much: elapsed-time
    judgments that compare wall times stamped before a step with the clock after it (the
    coordinator's device silence, its alerts' delays) run on `steady`, each time moved by
    the `step` in force when it was stamped. Thread-safe; `decide` is its pure decision."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic, slack_s: float = Clock.JUMP_S,
                 what: str = "the fleet view"):
        self.wall, self.mono, self.slack_s, self.what = wall, mono, slack_s, what
        self._lock = threading.Lock()
        self._last = (wall(), mono())
        self.step = 0.0
        self.jumps_total = 0

    def read(self) -> tuple[float, float]:
        """(steady, wall) now."""
        with self._lock:
            w, m = self.wall(), self.mono()
            step = decide(self._last, (w, m), self.step, self.slack_s)
            if step != self.step:
                self.jumps_total += 1
                log.warning("the wall clock stepped %+.1f s (it reads %s); %s judges elapsed "
                            "time by the monotonic clock across it", step - self.step,
                            _iso(w), self.what)
                self.step = step
            self._last = (w, m)
            return w - step, w


def decide(last: tuple[float, float], now: tuple[float, float], step: float,
           slack_s: float) -> float:
    """The steps' sum after the (wall, monotonic) reading `now` that follows `last` (pure):
    `step` plus how far the wall clock moved from what the monotonic clock counted, when
    that is more than `slack_s` (a step); `step` unchanged otherwise (a slew, followed)."""
    moved = (now[0] - last[0]) - (now[1] - last[1])
    return step + moved if abs(moved) > slack_s else step


def steady(wall: Callable[[], float] = time.time,
           mono: Callable[[], float] = time.monotonic) -> Callable[[], float]:
    """A clock that reads the wall time at its making and then advances only with the
    monotonic clock: never a step. The control loop's readings carry it (power/: holds,
    dwells, the governor's integral and the energy budget's hours), so an NTP step of days
    neither fires a hold early, nor freezes one for an hour, nor feeds the integral a week.
    Its time of day stays what the wall clock read at the start (docs/clocks.md says what
    that costs a box that starts at 1970)."""
    w0, m0 = wall(), mono()
    return lambda: w0 + (mono() - m0)


# OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID and X509_V_ERR_CERT_HAS_EXPIRED
CERT_NOT_YET_VALID, CERT_HAS_EXPIRED = 9, 10


def tls_time_cause(verify_code: int, status: Status, wall: float) -> str | None:
    """Why a certificate failed on time, when the clock is the likely cause (pure): a
    certificate "not yet valid" or "expired" judged by a clock that is not synced, or reads
    1970 or past 2100, is this clock's fault more likely than the certificate's. None when
    the failure is not about time, or the clock is synced (then the certificate is)."""
    if verify_code not in (CERT_NOT_YET_VALID, CERT_HAS_EXPIRED) or status.synced:
        return None
    what = "not yet valid" if verify_code == CERT_NOT_YET_VALID else "expired"
    return (f"the broker's certificate is {what} by this clock, which reads {_iso(wall)} and "
            f"is {status.state} ({status.reason}): the clock, not the certificate, is the "
            "likely cause; the connection is retried and succeeds once the clock is synced")


def made_after(a_t: float, a_clk: Any, b_t: float, b_clk: Any) -> bool | None:
    """Whether message a was made after message b (pure): by boottime within one kernel
    boot (it never steps), by wall time when both clocks were synced or neither message has
    a stamp (an older device: as before), else None: nothing can tell, the later arrival
    should win (a box rebooted a week behind must not have its new health ranked older than
    what it sent before the reboot)."""
    if not isinstance(a_clk, dict) or not isinstance(b_clk, dict):
        return a_t > b_t if a_clk is None and b_clk is None else None
    if a_clk.get("kb") == b_clk.get("kb") and all(
            isinstance(c.get("bt"), int | float) and not isinstance(c.get("bt"), bool)
            for c in (a_clk, b_clk)):
        return a_clk["bt"] > b_clk["bt"]
    if a_clk.get("sync") is True and b_clk.get("sync") is True:
        return a_t > b_t
    return None
