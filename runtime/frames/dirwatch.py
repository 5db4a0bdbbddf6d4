"""The names that appear in one directory, from Linux inotify (through ctypes: no dependency).

The folder source lists its directory to find new files. While files keep arriving its mtime
moves on every poll, so a folder that keeps its inspected files (no `done_dir`) was listed in
full 50 times a second: 1.4 ms of CPU a listing at 3,300 files, more than a frame's inference
(docs/benchmarks.md). With a watch the source stats only the names the kernel reported and
lists the folder in full only at start, every `FolderSource.RESCAN_S` (inotify does not see
writes made on another NFS/SMB client) and when the kernel's queue overflowed.

`wait(timeout_s)` sleeps until the kernel reports something (or the timeout): the source's
idle poll was a 20 ms sleep, 50 wake-ups a second on a quiet folder and up to 20 ms between a
file's arrival and its read.

`DirWatch(path)` raises OSError where inotify is missing or refused (not Linux, no instances
left: `fs.inotify.max_user_instances`); the source then lists on every change, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
import time

# <sys/inotify.h>
IN_ATTRIB = 0x004  # a touch: a file's mtime set after it was written
IN_CLOSE_WRITE = 0x008  # written and closed
IN_MOVED_TO = 0x080  # renamed into the directory (the usual atomic hand-over)
IN_CREATE = 0x100  # a new name (also a hard link, which has no close_write)
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000  # the kernel dropped events: what changed is unknown
IN_IGNORED = 0x8000  # the watch is gone (the directory was removed or unmounted)
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_WATCH = IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF
_LOST = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of NUL-padded name)
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            raise OSError("no C library to call inotify through")
        lib = ctypes.CDLL(name, use_errno=True)
        if not hasattr(lib, "inotify_init1"):
            raise OSError("this C library has no inotify")
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc = lib
    return _libc


class DirWatch:
    """Names created, written, renamed in or touched in one directory since the last `take`."""

    def __init__(self, path: str | os.PathLike[str]):
        lib = _lib()
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        if lib.inotify_add_watch(fd, os.fsencode(path), _WATCH) < 0:
            e = ctypes.get_errno()
            os.close(fd)
            raise OSError(e, f"inotify_add_watch {os.fspath(path)}: {os.strerror(e)}")
        self._fd: int | None = fd
        # the descriptor is closed by whoever is last: a close() from another thread while
        # `wait` selects on it leaves it to the waiter (closed under select, its number could
        # be reused by another file and read as events)
        self._lock = threading.Lock()
        self._waiting = False
        self._close_due = False

    def wait(self, timeout_s: float) -> None:
        """Until the kernel has something to report, or `timeout_s` passed (at once when
        closed)."""
        with self._lock:
            fd = self._fd
            if fd is None or self._close_due:
                return
            self._waiting = True
        try:  # poll, not select: select refuses a descriptor numbered 1024 or more
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0.0, timeout_s) * 1e3)
        except (OSError, ValueError):  # `take` says what happened
            time.sleep(min(0.02, max(0.0, timeout_s)))  # never a spin
        finally:
            with self._lock:
                self._waiting = False
                if self._close_due:
                    self._close_now()

    def take(self) -> set[str] | None:
        """The names reported since the last call (empty: nothing happened); None when
        track was lost (the kernel's queue overflowed, the directory went away): list the
        directory to know."""
        with self._lock:
            if self._fd is None or self._close_due:
                return None
            return self._take(self._fd)

    def _take(self, fd: int) -> set[str] | None:
        names: set[str] = set()
        lost = False
        for _ in range(16):  # at most 1 MiB a call: a writer flooding the folder with names
            # cannot keep this loop (and the capture thread) from returning
            try:
                buf = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                lost = True
                break
            if not buf:
                break
            at = 0
            while at + _HEADER.size <= len(buf):
                _wd, mask, _cookie, size = _HEADER.unpack_from(buf, at)
                raw = buf[at + _HEADER.size: at + _HEADER.size + size]
                at += _HEADER.size + size
                if mask & _LOST:
                    lost = True
                if raw:
                    names.add(os.fsdecode(raw.rstrip(b"\0")))
        if lost:
            self._close_now()  # re-armed by the caller's next DirWatch, if it wants one
            return None
        return names

    def close(self) -> None:
        """Stop watching (from any thread: during a `wait`, the waiter closes it)."""
        with self._lock:
            if self._waiting:
                self._close_due = True
            else:
                self._close_now()

    def _close_now(self) -> None:
        """Close the descriptor (the caller holds the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
