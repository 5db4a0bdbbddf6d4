"""Small durable facts that must outlive the outbox database: seen command ids and
`evicted_total`.

A corrupt outbox is moved aside and restarted empty (the device keeps working); if replay
protection and the eviction counter lived only inside it, a captured command would be accepted
again and the operator's record of lost results would restart at 0. So they live in their own
small JSON file next to the outbox (`<outbox>.keep.json`), rewritten atomically (temp file,
fsync, rename) on the rare occasions they change: an accepted command, an eviction.

The record is bounded twice: by count (MAX_IDS) and by time. A device refuses a command whose
lifetime is over its cap (runtime/wire/commands.py verify), so no accepted id needs keeping
past `now + keep_s` (`bound(keep_s)`: the cap plus the allowed clock skew); an id claiming to
expire later (written by an older version, which capped nothing) is dropped at that bound and
never written again: the command it names is refused on its lifetime anyway.

While the clock is not synced (runtime/wire/clock.py) ids are pruned only against the latest
time known to have passed (`floor`, kept here too: docs/clocks.md), never against a wall
clock that may read 1970 or 2100, so an id leaves the record only once its command is refused
as expired by that same time: no replay, and no refusal of every command until the sync.

When the file itself is unreadable or missing while an older outbox existed, the ids seen
before are unknown: every command issued before this moment is refused (`not_before`), so a
captured one can no longer be replayed. "This moment" is taken from a synced clock only: a
clock reading 2100 would refuse every command for good, one reading 1970 would let a captured
one through. So the reset is noted as pending with the kernel boot and boottime at which the
publisher first saw it (`settle_not_before`), every command is refused while it is pending,
and the first synced reading sets `not_before` to the moment of the reset (that reading less
the boottime elapsed since, within the same kernel boot; the reading itself after a reboot).
A `not_before` outside clock.FLOOR_T..CEILING_T is never written, and one read back from an
older version is taken as pending.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from runtime.durable import write_atomic
from runtime.wire.clock import CEILING_T, FLOOR_T
from runtime.wire.commands import FLOOR_SOURCES, Floor, floor_blame

log = logging.getLogger("edgerun.outbox")

MAX_IDS = 10_000  # commands are rare; a flood of valid signed ids is the coordinator's bug


class Sidecar:
    """The `<outbox>.keep.json` file (see module docstring)."""

    def __init__(self, path: Path, lost_history: bool):
        self.path = path
        self._lock = threading.Lock()
        self.evicted_total = 0
        self._not_before = 0.0
        # a reset waiting for a synced clock: None, or {"kb", "bt"} where it was first seen
        # (kb "" until the publisher has seen it)
        self.pending: dict[str, Any] | None = None
        self.seen: dict[str, float] = {}
        self.floor = Floor()  # the latest time known to have passed (commands.Floor)
        self.problem = ""  # why the history was reset, for an event
        # how far ahead an id is remembered; set by the publisher (bound), which knows the
        # device's lifetime cap. Not guessed before: a guess below a sleeper's cap would drop
        # ids of commands it still accepts.
        self.keep_s = float("inf")
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.evicted_total = int(data["evicted_total"])
                self._not_before = float(data.get("not_before", 0.0))
                if isinstance(p := data.get("not_before_pending"), dict):
                    self.pending = {"kb": str(p["kb"]), "bt": float(p["bt"])}
                elif self._not_before and not FLOOR_T <= self._not_before <= CEILING_T:
                    # written by an older version from an unsynced clock: unknown
                    log.warning("%s: not_before %.0f is outside the plausible years; "
                                "commands are refused until the clock is synced", path,
                                self._not_before)
                    self._not_before, self.pending = 0.0, {"kb": "", "bt": 0.0}
                if isinstance(f := data.get("floor"), dict):
                    by = f.get("by", "")  # one of ours, else not known (a damaged record)
                    self.floor = Floor(float(f["t"]), str(f["kb"]), float(f["bt"]),
                                       by if by in FLOOR_SOURCES else "")
                # pruned against the floor, not the wall clock: at boot it may read 1970 or
                # 2100, and an id dropped by a clock that steps back could be replayed
                self.seen = prune({str(k): float(v) for k, v in data["seen_commands"].items()},
                                  self.floor.t, self.keep_s)
            except (OSError, ValueError, KeyError, TypeError, AttributeError,
                    RecursionError) as e:  # deep nesting too: it stopped every start
                aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
                try:
                    path.rename(aside)
                    self.problem = f"{path} was unreadable ({e}); moved to {aside}"
                except OSError as moving:  # a read-only disk: read as lost all the same
                    self.problem = f"{path} was unreadable ({e}); left there ({moving})"
                self._reset_history()
        elif lost_history:
            self.problem = f"{path} is missing while an older outbox existed"
            self._reset_history()
        if self.problem:
            log.error("command replay record lost: %s; commands are refused until the clock "
                      "is synced, then those issued before the loss", self.problem)
        try:
            self._write()
        except OSError as e:  # a full disk at start: written with the next change
            log.error("cannot write %s (%s); the replay record is kept in memory", path, e)

    def _reset_history(self) -> None:
        self.seen = {}
        self.pending = {"kb": "", "bt": 0.0}  # not_before is set by a synced clock only

    @property
    def not_before(self) -> float:
        """Commands issued before this are refused: the moment the replay record was reset
        (0: never); infinite while that moment waits for a synced clock."""
        return float("inf") if self.pending is not None else self._not_before

    def settle_not_before(self, synced: bool, wall: float, kb: str, bt: float) -> None:
        """Turn a pending reset into `not_before` (module docstring): the first call notes
        the kernel boot and boottime; the first synced, plausible reading sets `not_before` to
        the reset's moment by it (the reading less the boottime elapsed since, in the same
        kernel boot; after a reboot the reading itself) and writes it."""
        with self._lock:
            if self.pending is None:
                return
            changed = False
            if not self.pending["kb"]:
                self.pending, changed = {"kb": kb, "bt": bt}, True
            if synced and FLOOR_T <= wall <= CEILING_T:
                same = kb == self.pending["kb"] and bt >= self.pending["bt"]
                at = wall - (bt - self.pending["bt"]) if same else wall
                self._not_before = min(max(at, FLOOR_T, self._not_before), CEILING_T)
                self.pending, changed = None, True
                log.warning("replay record reset: commands issued before %s (by the synced "
                            "clock) are refused", _iso(self._not_before))
            if changed:
                with contextlib.suppress(OSError):  # kept in memory, written with the next
                    self._write()

    def lower_floor(self, wall: float, kb: str, bt: float) -> None:
        """The synced clock `wall` shows the floor to be wrong (commands.floor_wrong): lower
        it to `wall`. Ids may have been dropped against the wrong floor, so commands issued
        before `wall` are refused from now on (not_before), as after a lost record."""
        with self._lock:
            log.error("the latest time known to have passed was %s, ahead of the synced "
                      "clock (%s): %s; lowered to the synced clock, and commands issued before "
                      "now are refused (ids may have been dropped against it)",
                      _iso(self.floor.t), _iso(wall), floor_blame(self.floor.by))
            self.floor = Floor(wall, kb, bt, "clock")
            if FLOOR_T <= wall <= CEILING_T:
                self._not_before = max(self._not_before, wall)
            with contextlib.suppress(OSError):  # written again with the next id
                self._write()

    def bound(self, keep_s: float) -> None:
        """Remember ids at most `keep_s` from now (commands.memory_bound of the device's
        lifetime cap and clock skew). Ids past it are dropped by the next `remember`, which
        knows whether the clock is synced: dropped against an unsynced clock reading 1970,
        every live id would go."""
        with self._lock:
            self.keep_s = keep_s

    def raise_floor(self, t: float, kb: str, bt: float, write: bool = False,
                    by: str = "") -> None:
        """The latest time known to have passed is at least `t` (recorded at kernel boot
        `kb`, boottime `bt`, shown by `by`: commands.floor_source); written now with `write`,
        else with the next id."""
        with self._lock:
            floor = self.floor.raised(t, kb, bt, by)
            if floor != self.floor:
                self.floor = floor
                if write:
                    with contextlib.suppress(OSError):  # written again with the next id
                        self._write()

    def remember(self, command_id: str, expires: float, now: float | None = None,
                 synced: bool = True) -> bool:
        """Record an accepted command id until it expires; False when already seen. An id
        claiming to expire past the bound is refused (verify caps lifetimes first). `now` is
        the time the command was judged at (commands.judged_now; default the wall clock);
        with `synced` False it is a lower bound only, so nothing is dropped or refused as too
        far ahead of it (MAX_IDS still bounds the record)."""
        with self._lock:
            now = time.time() if now is None else now
            keep_s = self.keep_s if synced else float("inf")
            before = len(self.seen)
            self.seen = prune(self.seen, now, keep_s)
            if synced and len(self.seen) < before:
                log.info("dropped %d remembered command ids expired or expiring more than "
                         "%.0f s ahead (commands living that long are refused)",
                         before - len(self.seen), keep_s)
            if command_id in self.seen:
                return False
            if not expires <= now + keep_s:
                from runtime.wire.commands import CommandRefused

                raise CommandRefused(f"expires {expires - now:.0f} s from now, past the "
                                     f"{self.keep_s:.0f} s this device remembers ids for")
            if len(self.seen) >= MAX_IDS:  # refuse rather than forget: forgetting allows replays
                from runtime.wire.commands import CommandRefused

                raise CommandRefused(f"{MAX_IDS} unexpired command ids are remembered already; "
                                     "refused rather than forgetting one (send shorter TTLs)")
            self.seen[command_id] = expires
            try:
                self._write()
            except OSError as e:  # refused, not forgotten: a restart would allow a replay
                del self.seen[command_id]
                from runtime.wire.commands import CommandRefused

                raise CommandRefused(f"cannot record the command id in {self.path} ({e}); "
                                     "send it again when the device's disk takes writes") from e
            return True

    def set_evicted_total(self, value: int) -> None:
        """Persist the eviction counter (monotonic)."""
        with self._lock:
            self.evicted_total = max(self.evicted_total, value)
            try:
                self._write()
            except OSError as e:  # the outbox's meta row has it too; written at the next one
                log.error("cannot write %s (%s): evicted_total %d kept in memory", self.path,
                          e, self.evicted_total)

    def _write(self) -> None:
        data = {"evicted_total": self.evicted_total, "not_before": self._not_before,
                "floor": {"t": self.floor.t, "kb": self.floor.kb, "bt": self.floor.bt,
                          "by": self.floor.by},
                "seen_commands": self.seen}
        if self.pending is not None:
            data["not_before_pending"] = self.pending
        write_atomic(self.path, json.dumps(data), mode=0o600)


def _iso(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}"


def prune(seen: dict[str, float], now: float, keep_s: float) -> dict[str, float]:
    """The ids of `seen` still to remember at `now`: not yet expired, and not claiming to
    expire more than `keep_s` ahead (see the module docstring)."""
    return {k: v for k, v in seen.items() if now <= v <= now + keep_s}
