"""An image folder in watch mode: each image inspected exactly once, even across restarts."""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import logging
import math
import os
import shutil
import sqlite3
import stat
import threading
import time
from pathlib import Path

from runtime.config.source import SourceConfig
from runtime.frames import images
from runtime.frames.dirwatch import DirWatch
from runtime.frames.frame import BadFrame, Frame, SourceError
from runtime.frames.images import BadImage

log = logging.getLogger("edgerun.source")


def _move(src: Path, dst: Path) -> None:
    """Move a file, also to another filesystem (a done_dir on a USB disk or a NAS mount: a
    rename fails there with EXDEV, and every file stayed where it was, with a warning each):
    copied to a hidden name beside `dst`, renamed into place, then the original removed.
    A file of that name already in `dst`'s directory (a camera that always writes
    `part.png`) is kept as `<stem>~<its mtime in ns><suffix>`: it was overwritten, and every
    inspected image but the last was lost."""
    if dst.exists():
        st = dst.stat()
        aside = dst.with_name(f"{dst.stem}~{st.st_mtime_ns}{dst.suffix}")
        n = 1
        while aside.exists():
            aside = dst.with_name(f"{dst.stem}~{st.st_mtime_ns}-{n}{dst.suffix}")
            n += 1
        dst.rename(aside)
    try:
        src.rename(dst)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    tmp = dst.with_name(f".{dst.name}.part")
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    src.unlink()


def text_name(name: str) -> str:
    """A file name as valid text. A name that is not UTF-8 (a camera writing Latin-1) is
    listed with lone surrogates, which SQLite refuses to bind and the coordinator refuses in
    a result: its odd bytes are written as `\\xNN` escapes instead."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class FolderSource:
    """Images in a directory, each inspected exactly once, even across restarts.

    Seen files are remembered in a small SQLite table (path + size + mtime) after their result
    is durable; with `done_dir` they are moved there instead. A file that is refused
    (frames/images.py: too large, truncated, corrupt, not an image, unreadable) is remembered
    as bad with its kind, moved to `<done_dir>/rejected/` when there is a done_dir, and raised
    as BadFrame once; it is never retried (not even after a restart: the table knows it).
    """

    live = False
    SETTLE_S = 1.0
    RESCAN_S = 2.0  # an unchanged directory is listed again this often
    _EXT = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".tif", ".tiff", ".webp"})

    def __init__(self, cfg: SourceConfig, state_dir: Path):
        self._dir = Path(cfg.path).expanduser()
        self._cfg = cfg
        try:
            is_dir = self._dir.is_dir()
        except (OSError, ValueError) as e:  # too long a name: OSError ended the thread
            raise SourceError(f"source.path {str(self._dir)[:200]}: {e}"[:300]) from e
        if not is_dir:
            raise SourceError(f"source.path {self._dir}: not a directory")
        self._done_dir = Path(cfg.done_dir).expanduser() if cfg.done_dir else None
        # Anything raised here but a SourceError ended the capture thread: the daemon ran on,
        # inspecting nothing, without a word. A SourceError is reported and retried.
        try:
            if self._done_dir is not None:
                self._done_dir.mkdir(parents=True, exist_ok=True)
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SourceError(f"source.done_dir {self._done_dir} or the state directory "
                              f"{state_dir}: {e.strerror or e}") from e
        key = hashlib.sha256(str(self._dir.resolve()).encode()).hexdigest()[:12]
        self._db = self._open_seen(state_dir / f"folder-{key}.db")
        self._lock = threading.Lock()
        # Every key remembered on disk or queued by this process: checked in memory so a
        # file being finished by the infer thread is never queued a second time.
        self._known: set[str] = {k for (k,) in self._db.execute("SELECT key FROM seen")}
        self._other: set[str] = set()  # names in the folder that are not images
        self._names: set[str] = set()  # names seen by this process (a replaced file with the
        # same name is not inspected again until a restart; use done_dir for that workflow:
        # a name moved away is forgotten, so the next file of that name is inspected)
        self._backlog: collections.deque[tuple[Path, str]] = collections.deque()
        # Files stamped in the future: name -> ((size, mtime_ns), monotonic time first seen so)
        self._ahead: dict[str, tuple[tuple[int, int], float]] = {}
        self._ahead_warned = False
        # An idle folder is rescanned only when the directory changed (its mtime moves when a
        # name is added, removed or renamed), while a file seen last time is still settling,
        # or every RESCAN_S anyway (coarse directory times on FAT or NFS): a scan of 100,000
        # inspected files costs ~37 ms of CPU, and every 20 ms that was 55 % of a core, idle.
        self._dir_mtime_ns: int | None = None
        self._last_scan = -math.inf
        self._settling = False
        # With an inotify watch (runtime/frames/dirwatch.py) only the names it reports are
        # looked at between full listings (every RESCAN_S, and whenever it lost track); the
        # names still settling or stamped ahead are looked at again each scan.
        self._watch: DirWatch | None = None
        self._events: set[str] = set()
        self._recheck: set[str] = set()
        self._full_due = True  # the next scan lists the whole folder
        self._said_no_watch = False
        self._closed = False

    def _open_seen(self, path: Path) -> sqlite3.Connection:
        """The seen-files table. A damaged file (power loss on an SD card) is moved aside and
        the folder inspected again (a new result for each file still there: never skipped);
        one that cannot be opened now (locked, I/O error) is a SourceError, retried."""
        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                # NORMAL: survives a crash of the process; after a power loss the last few
                # files may be inspected again (a new result each), never skipped.
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, "
                           "status TEXT)")
                db.execute("SELECT COUNT(*) FROM seen").fetchone()
            except BaseException:
                db.close()
                raise
            return db

        try:
            return connect()
        except sqlite3.OperationalError as e:
            raise SourceError(f"folder state {path}: cannot open it ({e}); retrying") from e
        except sqlite3.DatabaseError as e:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
            log.error("folder state %s is damaged (%s); moved it to %s: every file in %s is "
                      "inspected again", path, e, aside, self._dir)
            try:
                return connect()
            except sqlite3.DatabaseError as e2:
                raise SourceError(f"folder state {path}: cannot make a new one: {e2}") from e2

    def _settled_ahead(self, name: str, st: os.stat_result, now: float) -> bool:
        """Whether a file stamped in the future has settled. Its mtime cannot say (it was
        copied with its times kept from a clock ahead of this box's, or this box's clock is
        behind: no RTC, before NTP), so it must be seen unchanged for SETTLE_S instead;
        otherwise it would wait, silently, until this box's clock passed its stamp."""
        sig = (st.st_size, st.st_mtime_ns)
        seen = self._ahead.get(name)
        mono = time.monotonic()
        if seen is None or seen[0] != sig:
            if seen is None and not self._ahead_warned:
                self._ahead_warned = True  # once per process: every file may be ahead
                log.warning("folder %s: %s is stamped %.0f s in the future (clock skew between "
                            "its writer and this box?); inspecting it once it has stayed "
                            "unchanged for %.1f s", self._dir, name.encode("unicode_escape")
                            .decode("ascii"), st.st_mtime - now, self.SETTLE_S)
            self._ahead[name] = (sig, mono)
            return False
        if mono - seen[1] < self.SETTLE_S:
            return False
        del self._ahead[name]
        return True

    def _note_subdir(self, name: str) -> None:
        """Say once that a sub-directory is not looked into (a labelled val set copied in,
        `inbox/dent/*.png`, was inspected by nobody, without a word)."""
        self._names.add(name)  # once per process, and no is_dir for it again
        if self._done_dir is not None and (self._dir / name).resolve() == \
                self._done_dir.resolve():
            return  # the done_dir kept inside the inbox: meant to be there
        log.warning("folder %s: %s/ is a sub-directory; the folder source inspects only the "
                    "files directly in %s (move its images up to have them inspected)",
                    self._dir, name.encode("unicode_escape").decode("ascii"), self._dir)

    def _changed(self) -> bool:
        """Whether a scan could find something new (see `_dir_mtime_ns`, `_watch`)."""
        if time.monotonic() - self._last_scan >= self.RESCAN_S:
            self._full_due = True
        if self._watch is not None and not self._full_due:
            got = self._watch.take()
            if got is None:  # the kernel dropped events: list to know
                self._watch = None
                self._full_due = True
                return True
            self._events |= got
            return bool(self._events or self._recheck)
        try:
            mtime = os.stat(self._dir).st_mtime_ns
        except OSError:
            return True  # the scan says what happened
        # a directory changed within RESCAN_S is listed every time: its mtime is coarse (a
        # name added in the same tick as the last listing would not move it)
        return (mtime != self._dir_mtime_ns or self._settling
                or time.time() - mtime / 1e9 < self.RESCAN_S
                or time.monotonic() - self._last_scan >= self.RESCAN_S)

    def _scan(self) -> None:
        now = time.time()
        fresh = []
        looked: set[str] = set()  # future-stamped names met in this scan
        settling = False
        # before listing: a name added while the listing runs moves the mtime past this
        with contextlib.suppress(OSError):
            self._dir_mtime_ns = os.stat(self._dir).st_mtime_ns
        full = self._full_due or self._watch is None
        if full:
            self._last_scan = time.monotonic()
            self._full_due = False
            self._arm_watch()  # before listing: no name falls between the two
            # The names in C (listdir), the ones already handled taken off as sets: a
            # Python loop over every entry cost ~1.5 ms of CPU (and the GIL) a listing.
            names = os.listdir(self._dir)
            self._other.intersection_update(names)  # forget names that are gone
            self._events.clear()
        else:  # what the watch reported, and what was still settling last time
            names = list(self._events | self._recheck)
            self._events.clear()
        self._recheck.clear()
        for name in set(names).difference(self._names, self._other):
            path = self._dir / name
            if os.path.splitext(name)[1].lower() not in self._EXT:
                try:
                    is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
                except FileNotFoundError:
                    continue
                if is_dir:
                    self._note_subdir(name)
                else:
                    self._other.add(name)  # not an image: not looked at again while it stays
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            # A file still being written changes size and mtime under us; wait until
            # it has settled (writers that rename into place keep their old mtime).
            if not stat.S_ISREG(st.st_mode):
                continue
            age = now - st.st_mtime
            if -self.SETTLE_S < age < self.SETTLE_S:
                settling = True
                self._recheck.add(name)
                continue  # written just now
            if age <= -self.SETTLE_S:  # stamped in the future: watch it settle
                looked.add(name)
                if not self._settled_ahead(name, st, now):
                    settling = True
                    self._recheck.add(name)
                    continue
            key = f"{text_name(name)}|{st.st_size}|{st.st_mtime_ns}"
            self._names.add(name)
            if key not in self._known:
                self._known.add(key)
                fresh.append((path, key))
        for name in self._ahead.keys() - looked:  # gone since the last scan: forget it
            del self._ahead[name]  # (a partial scan looks at every such name: _recheck)
        self._settling = settling
        self._backlog.extend(sorted(fresh, key=lambda f: f[0].name))  # str, not Path, order

    def read(self, timeout_s: float) -> Frame | None:
        """The next unseen file, oldest name first; None while the folder has nothing new."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._backlog and self._changed():
                try:
                    self._scan()
                except OSError as e:  # unmounted, removed, no permission: retried, reported
                    raise SourceError(f"source.path {self._dir}: cannot list it: "
                                      f"{e.strerror or e}") from e
            while self._backlog:
                p, key = self._backlog.popleft()
                t0 = time.time()  # before decoding: end-to-end latency includes it
                try:
                    data = images.read_file(p, self._cfg.max_pixels)
                    c0 = time.thread_time()
                    img = images.decode(data, self._cfg.max_pixels)
                except BadImage as e:
                    self._reject(p, key, e.kind)
                    raise BadFrame(text_name(p.name), e.kind, str(e)) from e
                return Frame(img, text_name(p.name), t=t0, done=(key, p),
                             decode_cpu_s=time.thread_time() - c0)
            if not self._cfg.watch or time.monotonic() >= deadline:
                return None
            self._idle(deadline)

    def _idle(self, deadline: float) -> None:
        """Wait for the folder to change: on the inotify watch until it reports something
        (a new file is read at once, and a quiet folder costs a wake-up per read timeout,
        not 50 a second), at most until the next full listing is due; polling every 20 ms
        without one, or while a file is still settling (nothing reports it settled)."""
        now = time.monotonic()
        left = max(0.0, deadline - now)
        watch = self._watch
        if watch is None or self._recheck or self._settling or self._full_due:
            time.sleep(min(0.02, left))
            return
        watch.wait(min(left, max(0.0, self._last_scan + self.RESCAN_S - now)))

    def _reject(self, path: Path, key: str, kind: str) -> None:
        """Remember a refused file first (so it is never retried, even if the move fails),
        then move it out of the way when there is a done_dir."""
        self._remember([key], kind)
        if self._done_dir is None:
            return
        rejected = self._done_dir / "rejected"
        try:
            rejected.mkdir(exist_ok=True)
            _move(path, rejected / path.name)
            self._names.discard(path.name)
        except OSError as e:
            log.warning("could not move refused %s to %s: %s; it stays, remembered as %s",
                        path, rejected, e, kind)

    def _remember(self, keys: list[str], status: str) -> None:
        try:
            with self._lock, self._db:  # one transaction
                self._db.executemany("INSERT OR REPLACE INTO seen VALUES (?,?)",
                                     [(k, status) for k in keys])
        except sqlite3.Error as e:
            # Disk full or an I/O error: this process still knows them (`_known`), so
            # nothing is inspected twice now; after a restart they are inspected again
            # (never skipped). Raising here ended the capture or the infer thread.
            log.error("folder state: could not record %d file(s) as %s (%s); they will be "
                      "inspected again after a restart", len(keys), status, e)

    def done(self, frames: list[Frame]) -> None:
        """Remember the files (or move them to done_dir) now that their results are stored."""
        for frame in frames:
            _, path = frame.done  # type: ignore[misc]
            if self._done_dir is not None:
                try:
                    _move(path, self._done_dir / path.name)
                    self._names.discard(path.name)
                except OSError as e:
                    log.warning("could not move %s to %s: %s; remembering it instead", path,
                                self._done_dir, e)
        self._remember([f.done[0] for f in frames], "done")  # type: ignore[index]

    def _arm_watch(self) -> None:
        """Watch the folder with inotify where this system has it (else: list on change)."""
        if self._watch is not None or self._closed:  # a read racing close(): no new fd
            return
        try:
            self._watch = DirWatch(self._dir)
        except OSError as e:
            if not self._said_no_watch:
                self._said_no_watch = True
                log.info("folder %s: no inotify watch (%s); listing it whenever it changes",
                         self._dir, e)

    def close(self) -> None:
        """Close the seen-files table and the watch."""
        self._closed = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        with self._lock:
            self._db.close()
