"""The one way a small file is replaced on disk, and the crash-test hook.

Every small state file (the model pointer, operator settings, the control state, the command
replay record, the Home Assistant topic record, download records, broker ACL and password
files, the profile cache, installed units) is written by `write_atomic`: a new temporary file
beside it, fsync, rename over the old name, fsync the directory. After a `kill -9` or a power
cut at any point the name holds the old content or the new, never a mix, and a rename that
returned stays done (without the directory fsync a power cut can bring the old name back).

The temporary file is made new (O_EXCL, O_NOFOLLOW) after removing any leftover of that name:
a symlink planted there is never followed, so root running `fleet acl` cannot be made to write
through it.

`EDGERUN_CRASH_AT=<step>` (tests only) makes `crash_point(step)` SIGKILL the process; the
steps are listed in runtime/ota/model_store.py and runtime/coordinator/bundles.py.

Imports nothing of the project: both sides (device and coordinator) and every package use it.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("edgerun.durable")


def crash_point(step: str) -> None:
    """Tests only: SIGKILL this process when $EDGERUN_CRASH_AT names `step`."""
    if os.environ.get("EDGERUN_CRASH_AT") == step:
        log.warning("EDGERUN_CRASH_AT=%s: killing this process (test hook)", step)
        os.kill(os.getpid(), signal.SIGKILL)


def make_dir(path: Path) -> str | None:
    """Make directory `path` and its parents; None when it is there, else why it cannot be
    (for the caller's error, which names the setting or file it was for): a file in its
    place or in a parent's was "[Errno 17] File exists" and no more."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        # FileExistsError: a file in its place (mkdir's exist_ok holds only for a directory)
        if isinstance(e, FileExistsError | NotADirectoryError):
            return "is not a directory"
        return f"cannot be made ({e.strerror or e})"
    return None


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in directory `path` durable (a power cut after a rename
    can otherwise bring back the old name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = None,
                 setup: Callable[[int], None] | None = None, tmp: Path | None = None,
                 crash_at: str | None = None) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file, never a mix:
    temp file, fsync, rename, fsync the directory. Raises OSError; no temp file is left.

    `mode`: the new file's permission bits (None: 0o666 less the umask, as `open` gives).
    `setup(fd)`: runs on the temp file's descriptor before the fsync (chown, a mode taken
    from the file it replaces). `tmp`: the temporary name (default `.<name>.tmp` beside it).
    `crash_at`: the `crash_point` step between the fsync and the rename (tests)."""
    path = Path(path)
    tmp = tmp if tmp is not None else path.with_name(f".{path.name}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    tmp.unlink(missing_ok=True)  # a leftover (or planted) one: removed, never opened
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o666 if mode is None and setup is None else 0o600)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
            if setup is not None:
                setup(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        if crash_at is not None:
            crash_point(crash_at)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


__all__ = ["crash_point", "fsync_dir", "write_atomic"]
