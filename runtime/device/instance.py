"""One `edgerun serve` per outbox: an exclusive lock on `<outbox>.lock`, held for the process's
life (the kernel lets it go however the process ends, kill -9 included: no stale lock).

Two daemons on one outbox (a config tried by hand while the service runs, two units, two
configs that leave `[telemetry.outbox] path` at its default) each hand out the stream's seqs
from their own counter: the coordinator stores one result per (stream, seq) and the other is
lost without a word, and the two take over each other's broker session (one identity).
Found in a field run (2026-12-07, tests/device/test_serve_one_instance.py).

The lock file also says how the previous run ended: running (its pid and the kernel's boot
id) or stopped. A start that finds a run still recorded as running says so once (the
`unclean_stop` event): killed in this boot, or cut off by a power loss or reset in an earlier
one. Nothing else on the device tells the fleet that a daemon died without its stop (systemd's
journal stays on the device); found in an outside run (2026-12-07)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from runtime.config import ConfigError

log = logging.getLogger("edgerun.daemon")


def claim_outbox(outbox: Path) -> int | None:
    """Lock `<outbox>.lock` for this process (`take_over` then writes its record there); the
    file descriptor (kept open: closing it lets the lock go), or None where no lock file can
    be made (a read-only or full disk: the outbox says what it does there). ConfigError
    naming the other process when another `serve` holds it."""
    path = outbox.with_name(outbox.name + ".lock")
    try:
        outbox.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        log.debug("no instance lock at %s (%s)", path, e)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, RECORD, 0).decode("ascii", "replace").split(" ")[0].strip()
        os.close(fd)
        who = f"pid {holder}" if holder.isdigit() else "its pid unknown"
        raise ConfigError(
            f"another edgerun serve ({who}) is using the outbox {outbox} (it holds {path}): "
            "two would give the same seqs to different results, of which the coordinator "
            "keeps one, and take over each other's broker session; stop it first (or give "
            "this one its own [telemetry.outbox] path and [daemon] state_dir)") from None
    except OSError as e:  # a filesystem without locks: nothing to claim
        log.debug("no instance lock at %s (%s)", path, e)
        os.close(fd)
        return None
    return fd


def take_over(fd: int, boot_id: str) -> str | None:
    """Read how the previous run of this outbox ended from the lock file (see `previous_end`)
    and record this one as running: its pid (the next one's message names it) and boot id.
    One record of fixed width, written in place: a cut mid-write leaves the old record or
    the new one, never an empty file read as "no previous run". Synced before the run goes
    on: left to the kernel's writeback (up to ~35 s), a power cut early in the run (a supply
    sagging as the model loads) left the last clean stop on the disk, and said nothing."""
    try:
        before = os.pread(fd, RECORD, 0).decode("ascii", "replace")
        os.pwrite(fd, _record(f"{os.getpid()} {boot_id}"), 0)
        os.fdatasync(fd)
    except OSError as e:  # the disk refused: the outbox says what it does about that
        log.debug("instance record not read or written: %s", e)
        return None
    return previous_end(before, boot_id)


def put_back(fd: int | None, how: str, boot_id: str) -> None:
    """A start that failed before it said how the previous run ended: leave a record that
    says the same to the next start (`how` "killed": a run of this boot; "power": of an
    earlier one), synced, so the power cut that damaged the state is not forgotten by the
    start that found the damage."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.pwrite(fd, _record(f"0 {boot_id if how == 'killed' else 'earlier-boot'}"), 0)
        os.fdatasync(fd)


def mark_stopped(fd: int | None) -> None:
    """Record a clean stop (the next start then says nothing of this run). The lock stays
    held until the process ends: the outbox may still be closing."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.pwrite(fd, _record(STOPPED), 0)
        os.fdatasync(fd)  # a power cut right after a clean stop must not read as one during


SAID = {
    "killed": "the last run ended without its stop in this boot (kill -9, the OOM killer, "
              "a crash): what it stored is kept; frames in flight then were "
              "not inspected",
    "power": "the last run was cut off by a power loss or a reset (not a clean reboot, "
             "which stops the service first): what it stored is kept, up to the outbox's "
             "last sync (fsync = \"normal\" may lose the commits of the last second)",
}


def previous_end(record: str, boot_id: str) -> str | None:
    """How the run that wrote `record` ended, for an operator: None when it stopped cleanly,
    when there was none (an empty file), or when the record cannot tell (an older version's
    bare pid, a damaged record); "killed" when it was running in this same boot (kill -9,
    the OOM killer, a crash: nothing ran its stop); "power" when it was
    running in an earlier boot (a power cut, a watchdog or hard reset: a clean reboot stops
    the service first)."""
    words = record.split()
    if len(words) != 2 or not words[0].isdigit() or boot_id == "unknown":
        return None
    return "killed" if words[1] == boot_id else "power"


RECORD = 64  # bytes: one sector's part, written whole (a pid and a 12-digit boot id fit)
STOPPED = "stopped"


def _record(text: str) -> bytes:
    return text.encode("ascii").ljust(RECORD - 1)[:RECORD - 1] + b"\n"
