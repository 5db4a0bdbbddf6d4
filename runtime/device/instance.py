"""One `edgerun serve` per outbox: an exclusive lock on `<outbox>.lock`, held for the process's
life (the kernel lets it go however the process ends, kill -9 included: no stale lock).

Two daemons on one outbox (a config tried by hand while the service runs, two units, two
configs that leave `[telemetry.outbox] path` at its default) each hand out the stream's seqs
from their own counter: the coordinator stores one result per (stream, seq) and the other is
lost without a word, and the two take over each other's broker session (one identity).
Found in a field run (2026-12-07, tests/device/test_serve_one_instance.py)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from runtime.config import ConfigError

log = logging.getLogger("edgerun.daemon")


def claim_outbox(outbox: Path) -> int | None:
    """Lock `<outbox>.lock` for this process and write its pid there; the file descriptor
    (kept open: closing it lets the lock go), or None where no lock file can be made (a
    read-only or full disk: the outbox says what it does there). ConfigError naming the
    other process when another `serve` holds it."""
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
            holder = os.pread(fd, 32, 0).decode().strip()
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
    with contextlib.suppress(OSError):  # who holds it, for the next one's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
