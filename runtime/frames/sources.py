"""Frame sources: synthetic conveyor, image folder (watch mode), OpenCV capture, MQTT trigger,
a Basler camera through pypylon (runtime/frames/pylon_source.py), and a camera triggered by
the PLC's edges (`trigger = "opcua"` or `"modbus"`).

Every source yields `Frame`s from `read(timeout)` (None when nothing arrived in time) and
raises `SourceError` for a failure worth reporting (camera unplugged, stream down); the
pipeline's capture thread retries with backoff and reports an event, the rest of the daemon
keeps running. `live` sources may have stale frames dropped by the pipeline (latest wins);
folder and trigger sources are never dropped.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import hashlib
import logging
import math
import os
import queue
import re
import shutil
import sqlite3
import stat
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Protocol

import cv2
import numpy as np

from power.simclock import WallClock
from runtime.config.source import SourceConfig
from runtime.frames import images
from runtime.frames.dirwatch import DirWatch
from runtime.frames.edges import EdgeBoard, EdgeBoards
from runtime.frames.images import BadImage

log = logging.getLogger("edgerun.source")


class SourceError(Exception):
    """The source failed; the message says what and where."""


class SourceEnded(SourceError):
    """The source has nothing more to give (a video file's last frame was read, no loop):
    not an error and not retried; the daemon keeps running and says so once."""


class BadFrame(Exception):
    """One input was refused (the source itself is fine): `kind` is one of
    runtime.frames.images.KINDS, `ref` names the file or trigger, the message says why. The pipeline
    counts it (`frames_bad`) and reports it as a rate-limited `frame_bad` event."""

    def __init__(self, ref: str, kind: str, why: str):
        super().__init__(f"{ref}: {why}")
        self.ref, self.kind, self.why = ref, kind, why


@dataclass
class Frame:
    """One image to inspect."""

    image: np.ndarray  # HxWx3 uint8 BGR
    ref: str  # where it came from: file name, frame number, trigger id
    t: float = field(default_factory=time.time)
    truth: str | None = None  # synthetic frames know their class (for live accuracy)
    done: object = None  # folder: callback key, marked done once the result is stored
    source: str = ""  # the name of the source it came from (set by the pipeline)
    # CPU seconds its decoding took in the reading thread, where the source can tell it
    # from the read (file and trigger sources); None: inside the capture (a camera's read)
    decode_cpu_s: float | None = None
    # the camera's own number for this frame (pylon: its block id), so a PLC-triggered
    # part's result names the exact image it was judged on; None: the source has none
    camera_frame: int | None = None
    # decode_cpu_s was spent on the source's own reader thread (a live stream's), not inside
    # `read`: it is not part of the capture thread's CPU
    decoded_apart: bool = False
    skipped: int = 0  # newer frames decoded and passed over before this one (latest wins)
    # damage the decoder met since the frame before (packets refused, frames concealed):
    # counted in health, the frame itself still served (PyAV's sources; OpenCV's capture
    # does not tell)
    damaged: int = 0


class Source(Protocol):
    """What the pipeline needs from a source."""

    live: bool

    def read(self, timeout_s: float) -> Frame | None:
        """The next frame, or None when nothing arrived within the timeout."""
        ...

    def done(self, frames: list[Frame]) -> None:
        """These frames' results are durable (folder sources remember them then)."""
        ...

    def close(self) -> None:
        """Release the device, file or subscription."""
        ...


class _PartPool:
    """Rendered parts, shared by every synthetic source of the same seed, size and defect
    rate in the process, filled by one background thread.

    Rendering one part costs ~20 ms of CPU (~80 ms wall on a loaded two-core box), more than
    a fast line or several cameras allow, and it is the simulated camera's cost, not the
    inspection's: so the first part is rendered at once, the rest of the `n` parts in the
    background while sources already draw from what exists. One part is rendered per frame
    drawn (`drawn`), as the sources used to render their own: the CPU spent is the same,
    only no frame waits for it."""

    _pools: ClassVar[dict[tuple, _PartPool]] = {}
    _lock = threading.Lock()

    def __init__(self, seed: int, size: int, defect_rate: float, n: int):
        from models.synthetic import CLASSES, render

        self._render, self.classes = render, CLASSES
        self._rng = np.random.default_rng(seed)
        self._size, self._defect_rate, self._n = size, defect_rate, n
        self.parts: list[tuple[np.ndarray, str]] = [self._one()]
        self.ready = threading.Event()  # every part rendered
        self._users = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._credits = threading.Semaphore(0)  # frames drawn, not yet matched by a render

    @classmethod
    def acquire(cls, seed: int, size: int, defect_rate: float, n: int) -> _PartPool:
        """The pool for these settings (made on first use), filling while anyone uses it."""
        with cls._lock:
            key = (seed, size, defect_rate, n)
            pool = cls._pools.get(key)
            if pool is None:
                pool = cls._pools[key] = cls(seed, size, defect_rate, n)
            pool._users += 1
            if not pool.ready.is_set() and pool._thread is None:
                pool._stop.clear()
                pool._thread = threading.Thread(target=pool._fill, name="synthetic-render",
                                                daemon=True)
                pool._thread.start()
            return pool

    def release(self) -> None:
        """One user fewer; the last one stops the filling thread and waits for it (a thread
        still inside OpenCV when the interpreter exits aborts the process)."""
        with self._lock:
            self._users -= 1
            thread = self._thread if self._users == 0 else None
            if thread is not None:
                self._stop.set()
                self._thread = None
        if thread is not None:
            thread.join(10)

    @classmethod
    def stop_all(cls) -> None:
        """At exit: stop every filling thread, even of sources nobody closed."""
        with cls._lock:
            pools = list(cls._pools.values())
        for pool in pools:
            pool._stop.set()
            if pool._thread is not None:
                pool._thread.join(10)

    def _one(self) -> tuple[np.ndarray, str]:
        defect = self._rng.random() < self._defect_rate
        label = int(self._rng.integers(1, len(self.classes))) if defect else 0
        return self._render(self._rng, label, self._size), self.classes[label]

    def drawn(self) -> None:
        """A source drew a part: one more may be rendered."""
        if not self.ready.is_set():
            self._credits.release()

    def _fill(self) -> None:
        # The simulated camera's own work, never the inspection's: at the lowest priority,
        # so a render (one per part drawn) does not take a core from the part just drawn.
        # Before, a PLC-triggered synthetic camera's trigger-to-verdict p99 was 2-3x its p50
        # for its first 256 parts, and not once the pool was full (docs/plc.md).
        with contextlib.suppress(AttributeError, OSError):  # Linux: a thread is a task
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while len(self.parts) < self._n and not self._stop.is_set():
            if self._credits.acquire(timeout=0.2):
                self.parts.append(self._one())  # list.append is atomic; readers see a prefix
        if len(self.parts) >= self._n:
            self.ready.set()


atexit.register(_PartPool.stop_all)


class Clock(Protocol):
    """What paces a synthetic camera: power.simclock's SimClock (the simulated board's
    seconds, in lockstep with the daemon) or WallClock (this host's)."""

    def now(self) -> float: ...
    def wait_until(self, t: float, timeout_s: float) -> bool: ...


class SyntheticConveyor:
    """Parts from the bundled model's dataset generator at a steady rate (a simulated camera).

    Parts come from a pool of `POOL` rendered parts (see _PartPool), drawn at random by each
    source's own generator (seeded by `seed` and the source's name, so two cameras on the same
    line do not show the same sequence). `rate_hz` is per second of `clock`: with the
    simulator, per simulated second (a slowed simulation offers fewer frames a wall second)."""

    live = True
    POOL = 256

    def __init__(self, cfg: SourceConfig, clock: Clock | None = None):
        self._cfg = cfg
        self._clock: Clock = clock if clock is not None else WallClock()
        self.pool = _PartPool.acquire(cfg.seed, cfg.size, cfg.defect_rate, self.POOL)
        self._closed = False
        self._rng = np.random.default_rng([cfg.seed, zlib.crc32(cfg.name.encode())])
        self._n = 0
        self._next_t = self._clock.now()

    def read(self, timeout_s: float) -> Frame | None:
        """The next part; paced to `rate_hz` on its clock."""
        if self._cfg.rate_hz > 0:
            if not self._clock.wait_until(self._next_t, timeout_s):
                return None
            # a slot missed by over a second is dropped, not made up in a burst
            self._next_t = max(self._next_t + 1 / self._cfg.rate_hz, self._clock.now() - 1)
        self._n += 1
        parts = self.pool.parts
        img, truth = parts[int(self._rng.integers(len(parts)))]
        self.pool.drawn()
        return Frame(img.copy(), f"part-{self._n}", truth=truth)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Let go of the pool (its parts stay for the next source of the same settings)."""
        if not self._closed:
            self._closed = True
            self.pool.release()


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


_FFMPEG_OPTIONS = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_FFMPEG_LEVEL = "OPENCV_FFMPEG_LOGLEVEL"
# The capture options travel in the environment, read by FFmpeg during the open: one open
# at a time (OpenCV itself serialises FFmpeg opens in a process, with a lock of its own).
_env_lock = threading.Lock()
_quieted = False


def redact(url: str) -> str:
    """A URL fit for logs and events: `user:password@` becomes `***@`."""
    return re.sub(r"(?<=://)[^/@\s]*@", "***@", url)


def quiet_ffmpeg(debug: bool | None = None) -> None:
    """Keep FFmpeg's and OpenCV's own lines off the terminal and the journal.

    FFmpeg (inside OpenCV) writes from C straight to the process's stdout/stderr; OpenCV
    offers Python no per-message hook, so those lines cannot be turned into log records. What
    can be set is their level: FFmpeg's is read from OPENCV_FFMPEG_LOGLEVEL when OpenCV first
    uses FFmpeg, OpenCV's own (its VIDEOIO warnings) with cv2.utils.logging. Unless the
    operator set those variables, both are silenced, except with `-v` (debug logging), where
    FFmpeg's warnings appear on stdout prefixed `[OPENCV:FFMPEG:24]`. The daemon says itself
    what failed (open or read timeout, refused), see CaptureSource. Once per process."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    if debug is None:
        debug = logging.getLogger("edgerun").isEnabledFor(logging.DEBUG)
    if _FFMPEG_LEVEL not in os.environ:
        os.environ[_FFMPEG_LEVEL] = "24" if debug else "-8"  # AV_LOG_WARNING / AV_LOG_QUIET
    if "OPENCV_LOG_LEVEL" not in os.environ and not debug:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


class CaptureSource:
    """cv2.VideoCapture on a V4L2 device index, a video file or an RTSP/HTTP URL. A video file
    ends after its last frame (SourceEnded), or starts again with `loop`; a camera or stream
    that stops delivering raises SourceError (the pipeline re-opens it with backoff).

    A URL is opened through FFmpeg with `open_timeout_s` and `read_timeout_s` (OpenCV's
    CAP_PROP_OPEN/READ_TIMEOUT_MSEC) and, for RTSP, the `transport` (FFmpeg's
    `rtsp_transport` through OPENCV_FFMPEG_CAPTURE_OPTIONS; an operator's own value of that
    variable is kept and wins)."""

    def __init__(self, cfg: SourceConfig):
        self._cfg = cfg
        self._target: int | str = int(cfg.path) if cfg.path.isdigit() else cfg.path
        self._url = isinstance(self._target, str) and "://" in self._target
        self._shown = redact(cfg.path)
        try:  # a path the filesystem refuses (too long) raised OSError: a dead thread
            self.live = not Path(str(self._target)).is_file()
        except (OSError, ValueError):
            self.live = True  # not a file: a camera or a stream (the open then says)
        self._loop = cfg.loop and not self.live
        quiet_ffmpeg()  # before FFmpeg's first use in this process: it reads its level once
        t0 = time.monotonic()
        self._cap = self._open()
        if not self._cap.isOpened():
            took = time.monotonic() - t0
            if self._url and took >= cfg.open_timeout_s * 0.9:
                raise SourceError(f"source.path {self._shown!r}: no stream within "
                                  f"{cfg.open_timeout_s:g} s (open_timeout_s): the server "
                                  "does not answer")
            if self._url and "@" in cfg.path.split("://", 1)[1].split("/", 1)[0]:
                # FFmpeg tells OpenCV no more than "failed"; the credentials are the usual
                # cause when a server that answers refuses (never shown: redacted)
                raise SourceError(f"source.path {self._shown!r}: the server refused the "
                                  "stream: check the user and password in the URL (or the "
                                  "stream's path)")
            raise SourceError(f"source.path {self._shown!r}: cannot open (no such camera, "
                              "file or stream, or the server refused)")
        self._n = 0
        self._pass_n = 0  # frames read since the file was (re)opened
        self._reader: _LatestFrame | None = None
        if self.live:
            self._reader = _LatestFrame(self._next, self._shown)

    def _open(self) -> cv2.VideoCapture:
        if not self._url:
            return cv2.VideoCapture(self._target)
        cfg = self._cfg
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(cfg.open_timeout_s * 1000),
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(cfg.read_timeout_s * 1000)]
        if self.live:
            # One decoder thread, the reader's own: its thread CPU clock is then the stream's
            # whole decode CPU (with FFmpeg's pool, 720p H.264 measured 1.6 ms a frame on the
            # reader and 4.2 ms in the process; with one thread 4.0 and 4.0), and several
            # streams on a small box do not each start a pool of threads per core.
            params += [cv2.CAP_PROP_N_THREADS, 1]
        with _env_lock:
            before = os.environ.get(_FFMPEG_OPTIONS)
            opts = before or ""
            if (str(self._target).lower().startswith("rtsp") and cfg.transport != "auto"
                    and "rtsp_transport" not in opts):
                opts = "|".join(x for x in (opts, f"rtsp_transport;{cfg.transport}") if x)
            if opts:
                os.environ[_FFMPEG_OPTIONS] = opts
            try:  # FFmpeg reads the variable during this call
                return cv2.VideoCapture(self._target, cv2.CAP_FFMPEG, params)
            finally:
                if before is None:
                    os.environ.pop(_FFMPEG_OPTIONS, None)
                else:
                    os.environ[_FFMPEG_OPTIONS] = before

    def _next(self) -> np.ndarray | None:
        t0 = time.monotonic()
        ok, img = self._cap.read()
        if ok and img is not None:
            return img
        if self.live:
            if self._url and time.monotonic() - t0 >= self._cfg.read_timeout_s * 0.9:
                raise SourceError(f"{self._shown}: no frame for {self._cfg.read_timeout_s:g} s "
                                  "(read_timeout_s): the stream stalled")
            raise SourceError(f"{self._shown}: no frame (camera unplugged or stream down)")
        if not self._loop:
            raise SourceEnded(f"{self._target}: end of the video file after {self._n} frames; "
                              "the source has ended (set [source] loop = true to play it "
                              "again)")
        if self._pass_n == 0:  # a looped file that gives nothing would spin
            raise SourceError(f"{self._target}: no frame from the start of the video file")
        self._cap.release()  # rewind by re-opening: seeking is unreliable across containers
        self._cap, self._pass_n = self._open(), 0
        ok, img = self._cap.read()
        if not ok or img is None:
            raise SourceError(f"{self._target}: no frame after re-opening the video file to "
                              "loop it")
        return img

    def read(self, timeout_s: float) -> Frame | None:
        """The next decoded frame; SourceEnded after a video file's last frame (unless it
        loops), SourceError when the device or stream stops delivering."""
        if self._reader is not None:  # a live camera or stream: the newest frame decoded
            got = self._reader.take(timeout_s)
            if got is None:
                return None
            img, t0, n, cpu, skipped = got
            self._n = n
            return Frame(_bgr(img), f"frame-{n}", t=t0, decode_cpu_s=cpu, decoded_apart=True,
                         skipped=skipped)
        t0 = time.time()
        img = self._next()
        self._n += 1
        self._pass_n += 1
        return Frame(_bgr(img), f"frame-{self._n}", t=t0)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the reader (it leaves within one read, at most read_timeout_s on a stalled
        stream), then release the capture: releasing it under a read crashes FFmpeg."""
        if self._reader is not None and not self._reader.stop():
            log.warning("%s: the reader is still inside a read after %.0f s; the capture is "
                        "left to it (released when it returns)", self._shown,
                        _LatestFrame.JOIN_S)
            return
        self._cap.release()


def _bgr(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if img.ndim == 2 else img


class _LatestFrame:
    """A live source's reader thread: decodes every frame as it arrives (a stream that is not
    read falls behind live and its buffers fill, then fail: ultralytics#4211) and keeps only
    the newest; `take` hands that one over once, counting the frames decoded and passed over
    since the last one taken and the reader's thread CPU spent on them (the decode CPU per
    served frame). A read that fails ends the thread; `take` raises its SourceError."""

    JOIN_S = 15.0

    def __init__(self, read_one: Callable[[], np.ndarray | None], shown: str,
                 start: bool = True):
        self._read_one = read_one
        self._cond = threading.Condition()
        self._img: np.ndarray | None = None
        self._t = 0.0
        self._mono = -math.inf  # when the newest was decoded (monotonic)
        self.interval = 0.0  # between decoded frames, smoothed (0: not yet known)
        self._n = 0
        self._skipped = 0
        self._cpu = 0.0
        self._error: BaseException | None = None
        self.stopping = threading.Event()  # set by stop(); a reader skipping packets checks it
        self._thread = threading.Thread(target=self._run, name=f"reader-{shown}"[:60],
                                        daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start reading (made with start=False: once its owner can be read from)."""
        self._thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            c0 = time.thread_time()
            try:
                img = self._read_one()
            except BaseException as e:  # SourceError, or anything FFmpeg/OpenCV raised
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            t, mono = time.time(), time.monotonic()
            spent = time.thread_time() - c0
            with self._cond:
                self._cpu += spent
                self._n += 1
                if self._img is not None:
                    self._skipped += 1
                gap = mono - self._mono
                if 0 < gap < 5:
                    self.interval = gap if not self.interval else 0.9 * self.interval + 0.1 * gap
                self._img, self._t, self._mono = img, t, mono
                self._cond.notify_all()

    def take(self, timeout_s: float, not_before: float = -math.inf
             ) -> tuple[np.ndarray, float, int, float, int] | None:
        """(image, wall time decoded, its number, decode CPU since the last take, frames
        skipped since then), or None when no new frame came within `timeout_s`; with
        `not_before` (monotonic), the first frame decoded at or after it (one decoded before
        waits to be replaced: served as it is decoded, not up to a frame interval old)."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or (
                self._img is not None and self._mono >= not_before), timeout_s)
            if self._img is None or self._mono < not_before:
                if self._error is not None:
                    raise self._error
                return None
            out = (self._img, self._t, self._n, self._cpu, self._skipped)
            self._img, self._cpu, self._skipped = None, 0.0, 0
            return out

    def stop(self) -> bool:
        """Stop reading; True once the thread has left (the capture may be released)."""
        self.stopping.set()
        self._thread.join(self.JOIN_S)
        return not self._thread.is_alive()


def pyav_available() -> bool:
    """Whether PyAV (the `av` package: FFmpeg's libraries, its wheel's own FFmpeg) imports."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


_START4, _START3 = b"\x00\x00\x00\x01", b"\x00\x00\x01"


class NalAssembler:
    """Whole H.264 NAL units out of FFmpeg's RTSP packets read without its parser
    (`fflags noparse`): one packet per RTP packet, a NAL sent whole (or several, STAP-A) begins
    with a start code, a fragmented one (FU-A) begins with one on its first fragment only.

    Why: FFmpeg's H.264 parser, which its RTSP demuxer puts in front of every packet, hands a
    frame over only once the next frame's first bytes arrive: one frame interval (40 ms at
    25 fps) on every frame's age (docs/benchmarks.md). The end of a NAL is known at once from
    its size instead: payloaders (GStreamer's rtph264pay, live555, FFmpeg's) fill every
    fragment but the last to the same size, so a fragment shorter than the largest seen ends
    its NAL. A stream where that is found wrong (a fragment after a NAL taken as ended) is
    cut at the next start code from then on, as the parser does: never a worse age than it,
    and never a NAL cut short twice. `push(data)` returns the NALs it completes (each with
    its start code). A NAL past MAX_NAL_BYTES (a broken encoder, forged packets) is dropped,
    counted in `oversize`, and followed to the next start code: the camera's input never
    holds more memory than that."""

    MAX_NAL_BYTES = 8 << 20  # a 4K key frame in one slice is ~1-2 MB at camera bit rates

    def __init__(self) -> None:
        self._nal = bytearray()  # the NAL being gathered (starts with its start code)
        self._open = False  # a NAL has begun and not ended
        self._dropping = False  # the NAL begun is of a type in drop_types
        self.drop_types: frozenset[int] = frozenset()  # NAL types followed, never returned
        self._full = 0  # the largest continuation fragment seen: the payloader's size
        self.ended_early = False  # the last NAL returned was ended by its size alone
        self.early_ok = True  # ending by size is trusted on this stream
        self.misjudged = 0  # fragments that came after a NAL taken as ended
        self.oversize = 0  # NALs dropped past MAX_NAL_BYTES
        self.dropped_begun = 0  # NALs of drop_types begun: picture boundaries for AccessUnits

    def push(self, data: bytes | memoryview) -> list[bytes]:
        """The NALs completed by one packet's payload."""
        out: list[bytes] = []
        head = bytes(data[:5])
        if head.startswith(_START4) or head.startswith(_START3):
            if self._nal:  # a new NAL begins: the one gathered is whole
                out.append(bytes(self._nal))
            self._nal.clear()
            i = 4 if head.startswith(_START4) else 3
            # a NAL of a type not wanted is followed, not gathered (a P-frame's 10-100 kB
            # copied for nothing while key frames alone are decoded)
            self._dropping = len(head) > i and head[i] & 0x1F in self.drop_types
            if self._dropping:
                self.dropped_begun += 1
            else:
                self._gather(data)
            self._open = True
            self.ended_early = False
            # a NAL sent whole or a STAP-A is shorter than a first fragment (the payloader's
            # size + the start code and NAL header FFmpeg writes ahead of it)
            full_first = self._full + len(_START4) + 1
            if self.early_ok and self._full and len(data) < full_first:
                self._end(out)
            return out
        if not self._open:  # a fragment of a NAL already handed over (or never begun)
            if self.ended_early:
                self.misjudged += 1
                self.early_ok = False  # the size rule does not hold here: the next start
                self.ended_early = False  # code ends a NAL from now on
            return out
        if not self._dropping:
            self._gather(data)
        if len(data) > self._full:
            self._full = len(data)
        elif self.early_ok and len(data) < self._full:  # its last fragment
            self._end(out)
        return out

    def _gather(self, data: bytes | memoryview) -> None:
        self._nal += data
        if len(self._nal) > self.MAX_NAL_BYTES:
            log.warning("a NAL past %d bytes from the camera: dropped up to the next start "
                        "code (counted as damage)", self.MAX_NAL_BYTES)
            self._nal.clear()
            self._dropping = True
            self.oversize += 1

    def _end(self, out: list[bytes]) -> None:
        if self._nal:
            out.append(bytes(self._nal))
        self._nal.clear()
        self._open = False
        self.ended_early = True


class AccessUnits:
    """Pictures out of whole NALs (NalAssembler's), each handed to the decoder as one packet
    with the NALs ahead of it (AUD, SPS, PPS, SEI): a picture of one slice as soon as its
    slice is whole; where the stream is seen to cut pictures into several slices, a picture
    once the next one begins (as FFmpeg's parser does: one frame interval later, but whole).
    Which of the two a stream is cannot be read from its SPS/PPS or from a first slice's header
    (a slice does not say where it ends), only from what follows it: so the first picture of a
    connection is held until the next NAL that is not its own (`multi_slice` None until then),
    a later slice of it (several slices: gathered whole) or the next picture's (one slice:
    handed over, and every one after it at once). Handed over at its first slice instead, the
    first key frame of every connection to a several-slice camera was decoded from that slice
    alone, the rest concealed; the cost of holding it is one frame interval, once a connection.
    Fed NAL by NAL instead (flags2 chunks), FFmpeg's decoder stopped handing over pictures
    for good after the first damaged one (tests/frames/test_rtsp_camera.py's corrupt test).
    `push(nal)` returns the pictures it completes as (bytes, key frame or not)."""

    PREFIX_MAX = 16  # NALs kept ahead of a picture (a stream without AUDs: SEI piling up)
    MAX_SLICES = 256  # a picture past these (slices or bytes) is dropped, counted in oversize
    MAX_PICTURE_BYTES = 16 << 20

    def __init__(self) -> None:
        self._prefix: list[bytes] = []
        self._pic: list[bytes] = []  # slices of the picture being gathered (several-slice)
        self._pic_bytes = 0
        self._key = False
        # pictures of several slices seen on this stream (None: no picture seen whole yet)
        self.multi_slice: bool | None = None
        self.oversize = 0  # pictures dropped past MAX_SLICES / MAX_PICTURE_BYTES

    def push(self, nal: bytes) -> list[tuple[bytes, bool]]:
        """The pictures completed by one more NAL."""
        out: list[tuple[bytes, bool]] = []
        kind = nal_type(nal)
        if 1 <= kind <= 5:
            first = first_slice(nal)
            if not first and not self.multi_slice:
                log.info("the stream cuts pictures into several slices: each is decoded "
                         "once the next begins%s", "" if self.multi_slice is None else
                         " (one picture after one-slice ones was decoded from its first "
                         "slice alone)")
                self.multi_slice = True
            if first:
                self._flush(out)  # the picture held is whole (one slice: multi_slice False)
            if self.multi_slice is False:
                out.append((b"".join([*self._prefix, nal]), kind == 5))
                self._prefix.clear()
                return out
            if first:
                self._key = kind == 5
                self._pic = [*self._prefix, nal]
                self._pic_bytes = sum(map(len, self._pic))
                self._prefix.clear()
            elif self._pic:
                self._pic.append(nal)
                self._pic_bytes += len(nal)
                if len(self._pic) > self.MAX_SLICES or self._pic_bytes > self.MAX_PICTURE_BYTES:
                    log.warning("a picture past %d slices or %d bytes from the camera: dropped "
                                "(counted as damage)", self.MAX_SLICES, self.MAX_PICTURE_BYTES)
                    self._pic, self.oversize = [], self.oversize + 1
            return out  # a later slice of a picture never begun: dropped
        # an AUD begins a picture; an SPS, PPS or SEI does not end one: GStreamer's rtph264pay
        # (config-interval=-1) repeats SPS and PPS ahead of every slice of a key frame, and
        # ending the picture there cut each key frame of a several-slice stream to its first
        # slice (the rest concealed, and the damage carried through its GOP). Kept ahead of
        # the next picture instead, where the decoder reads them again (the same parameters)
        if kind == 9:
            self._flush(out)
            self._prefix.clear()
        self._prefix.append(nal)
        del self._prefix[:-self.PREFIX_MAX]
        return out

    def boundary(self) -> list[tuple[bytes, bool]]:
        """A NAL the assembler does not hand over began (key frames only: a P slice): the
        picture gathered is whole, and is handed over now rather than at the next AUD/SPS."""
        out: list[tuple[bytes, bool]] = []
        self._flush(out)
        return out

    def _flush(self, out: list[tuple[bytes, bool]]) -> None:
        if self._pic:
            if self.multi_slice is None:  # the first picture, whole in its one slice
                self.multi_slice = False
            out.append((b"".join(self._pic), self._key))
            self._pic = []


def nal_type(nal: bytes) -> int:
    """An H.264 NAL's type (5: a key frame's slice, 1: another slice, 7/8: SPS/PPS)."""
    i = 4 if nal.startswith(_START4) else 3
    return nal[i] & 0x1F if len(nal) > i else 0


def first_slice(nal: bytes) -> bool:
    """Whether a slice NAL is its picture's first (first_mb_in_slice = 0: the slice header's
    first Exp-Golomb code is the single bit 1)."""
    i = 4 if nal.startswith(_START4) else 3
    return len(nal) > i + 1 and bool(nal[i + 1] & 0x80)


class AvStreamSource:
    """A live RTSP/HTTP stream decoded by PyAV (`decoder = "pyav"`, or "auto" where PyAV is
    installed): measured cheaper than OpenCV's capture per frame (0.8x), with each frame's
    PTS, and able to decode key frames only (docs/benchmarks.md). Read by a reader thread
    that keeps the newest frame (as CaptureSource's). `rate_hint(hz)`: the rate frames are
    taken at (the pipeline's cap); at or below the stream's measured key-frame rate only key
    frames are decoded (FFmpeg's skip_frame NONKEY: P-frames need their references, so a
    reader that serves 1 frame a second from 25 still decodes 25 otherwise), and of those only
    the first after each frame's due time (a stream with 2.5 key frames a second read at
    1 fps decodes 1 a second), served as it is decoded (`paced`). Decoding resumes at every
    frame from the next key frame."""

    live = True

    def __init__(self, cfg: SourceConfig):
        import av

        # every SourceError below is raised `from None`: PyAV's messages carry the URL,
        # credentials and all, and a chained cause would print them in a traceback
        self._av = av
        self._cfg, self._shown = cfg, redact(cfg.path)
        opts = {}
        rtsp = cfg.path.lower().startswith("rtsp")
        if rtsp and cfg.transport != "auto":
            opts["rtsp_transport"] = cfg.transport
        self._c = None  # the container: closed on every way out of here but success
        try:
            self._connect(cfg, opts, rtsp)
            try:
                self._dec = self._decoder(False)
            except av.error.FFmpegError as e:
                raise SourceError(f"source.path {self._shown!r}: cannot set up its decoder "
                                  f"({_why(e)})") from None
            self._packets = self._c.demux(self._stream)
            self._bgr = av.video.reformatter.VideoReformatter()  # decoded frames to BGR
            # PyAV 17 gave reformatting threads (sws_scale_frame); before, it ran on the
            # caller's thread and took no `threads`
            self._bgr_kw = {"threads": 1} if _av_major(av) >= 17 else {}
            self._params: dict[int, bytes] = {}  # last SPS and PPS: a new decoder's first NALs
            self._units: collections.deque = collections.deque()  # NALs (or packets) to decode
            self._ready: collections.deque[np.ndarray] = collections.deque()  # decoded, unread
            self._take_key = True  # key frames only: the key frame being read is decoded
            self.damaged = 0  # packets the decoder refused and frames it concealed damage in
            self._damaged_told = 0  # of those, already handed over with a frame
            self._keys: collections.deque[float] = collections.deque(maxlen=8)  # key frames seen
            self._hint_hz = 0.0
            self._skip = False  # decoding key frames only
            self._due = -math.inf  # key frames only: none is decoded before this (monotonic)
            self.keyframes_only = False  # what the reader does now (said in the log)
            self._reader = _LatestFrame(self._read_one, self._shown, start=False)
            self._reader.start()  # _read_one reads self._reader
        except BaseException:
            # the connection is open (its RTSP socket, its session on the camera): left to the
            # garbage collector, each failed open held one until a collection ran
            self._close_container()
            raise

    def _connect(self, cfg: SourceConfig, opts: dict, rtsp: bool) -> None:
        """Open the stream: self._c, its video stream, and for H.264 over RTSP the NAL and
        picture assemblers (SourceError when it cannot be opened)."""
        av = self._av
        t0 = time.monotonic()
        try:
            # H.264 over RTSP is read without FFmpeg's parser (NalAssembler: a frame is
            # decoded as its last packet arrives, not one frame interval later); another
            # codec is opened again with the parser
            self._c = self._open(cfg, dict(opts, fflags="noparse+nofillin") if rtsp else opts)
            self._stream = self._c.streams.video[0]
            self._asm: NalAssembler | None = None
            if rtsp and self._stream.codec_context.name == "h264":
                self._asm = NalAssembler()
                self._aus = AccessUnits()
            elif rtsp:
                self._close_container()
                self._c = self._open(cfg, opts)
                self._stream = self._c.streams.video[0]
        except av.error.HTTPUnauthorizedError:
            raise SourceError(f"source.path {self._shown!r}: the server refused the "
                              "credentials (401 Unauthorized): check the user and password "
                              "in the URL") from None
        except (av.error.FFmpegError, OSError, IndexError) as e:
            if time.monotonic() - t0 >= cfg.open_timeout_s * 0.9:
                raise SourceError(f"source.path {self._shown!r}: no stream within "
                                  f"{cfg.open_timeout_s:g} s (open_timeout_s): the server "
                                  "does not answer") from None
            why = "no video stream" if isinstance(e, IndexError) else _why(e)
            raise SourceError(f"source.path {self._shown!r}: cannot open ({why})") \
                from None

    def _close_container(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    @staticmethod
    def _open(cfg: SourceConfig, opts: dict):
        import av

        c = av.open(cfg.path, options=opts, timeout=(cfg.open_timeout_s, cfg.read_timeout_s))
        if not c.streams.video:
            c.close()
            raise IndexError("no video stream")
        return c

    def _decoder(self, keys_only: bool):
        """A decoder for this stream; `keys_only`: key frames only (skip_frame NONKEY) and
        without the deblocking filter: a key frame decoded alone is no frame's reference, and
        the filter was 17 % of its decode at 720p (docs/benchmarks.md)."""
        if self._asm is None and not keys_only:
            cc = self._stream.codec_context
        else:
            cc = self._av.CodecContext.create("h264", "r")
            cc.extradata = self._stream.codec_context.extradata
            opts = {}
            if keys_only:
                opts["skip_loop_filter"] = "all"
                cc.skip_frame = "NONKEY"
            cc.options = opts
        cc.thread_count = 1  # the reader's thread: its CPU clock is the decode's
        return cc

    def key_frame_hz(self) -> float:
        """Key frames a second, measured over the last few (0: fewer than three seen)."""
        keys = list(self._keys)
        if len(keys) < 3 or keys[-1] <= keys[0]:
            return 0.0
        return (len(keys) - 1) / (keys[-1] - keys[0])

    def rate_hint(self, hz: float) -> None:
        """The rate frames will be taken at (0 or inf: as they come)."""
        self._hint_hz = hz

    @property
    def paced(self) -> bool:
        """It serves at the hinted rate itself, the first frame decoded after each frame's due
        time, handed over as it is decoded (key frames only: the first key frame after it;
        every frame: where the rate is at most 2/3 of the stream's, so that a frame comes
        between two due times): the pipeline does not wait out the rate cap after its frames,
        or each would be served a wait late. Measured at 720p: decode to inference p50
        17-22 ms at 5 and 12.5 Hz caps when the newest frame waited for the cap's tick, one
        frame interval at worst (docs/sources.md)."""
        return self.keyframes_only or self._spaced() > 0

    def _spaced(self) -> float:
        """Every frame decoded under a rate cap: the stream's frame interval, else 0."""
        iv, hint = self._reader.interval, self._hint_hz
        return iv if hint > 0 and iv > 0 and 1 / hint >= 1.5 * iv else 0.0

    def _next_unit(self, t0: float) -> tuple[object, str]:
        """The next picture to decode (a packet, or bytes from AccessUnits) and whether it is
        a key frame ("key") or not ("slice")."""
        av = self._av
        while not self._units:
            try:
                packet = next(self._packets)
            except StopIteration:
                raise SourceError(f"{self._shown}: the stream ended") from None
            except (av.error.FFmpegError, OSError) as e:
                if time.monotonic() - t0 >= self._cfg.read_timeout_s * 0.9:
                    raise SourceError(f"{self._shown}: no frame for "
                                      f"{self._cfg.read_timeout_s:g} s (read_timeout_s): the "
                                      "stream stalled") from None
                raise SourceError(f"{self._shown}: the stream failed ({_why(e)})") \
                    from None
            if packet.size == 0:
                continue
            if self._asm is None:
                self._units.append((packet, "key" if packet.is_keyframe else "slice"))
                continue
            asm, aus = self._asm, self._aus
            begun, oversize = asm.dropped_begun, asm.oversize + aus.oversize
            for nal in asm.push(memoryview(packet)):
                kind = nal_type(nal)
                if kind in (7, 8):  # a new decoder's first NALs (key frames only)
                    self._params[kind] = nal
                for pic, key in aus.push(nal):
                    self._units.append((pic, "key" if key else "slice"))
            if asm.dropped_begun != begun:  # the key picture before it is whole
                self._units.extend((pic, "key" if key else "slice")
                                   for pic, key in aus.boundary())
            self.damaged += asm.oversize + aus.oversize - oversize
        return self._units.popleft()

    def _read_one(self) -> np.ndarray:
        """On the reader thread: the next decoded frame (a key frame alone when skipping)."""
        t0 = time.monotonic()
        av = self._av
        while not self._ready:
            unit, what = self._next_unit(t0)
            if what == "key":
                self._keys.append(time.monotonic())
                kf = self.key_frame_hz()
                # 10 % slack: a 1 s GOP read at a 1 fps cap measures 0.95-1.05 key frames/s;
                # back to every frame only past 25 % (no flapping at the edge)
                want = 0 < self._hint_hz <= kf * (1.25 if self._skip else 1.1)
                if want != self._skip:  # switched at a key frame: no P-frame misses its
                    self._skip = want   # references when every frame is decoded again
                    if self._asm is not None:  # a decoder of its own, given the last SPS/PPS
                        self._dec = self._decoder(want)
                        self._asm.drop_types = frozenset({1, 2, 3, 4} if want else ())
                        for nal in self._params.values():
                            with contextlib.suppress(av.error.FFmpegError):
                                self._dec.decode(av.Packet(nal))
                    else:
                        self._dec.skip_frame = "NONKEY" if want else "DEFAULT"
                    self.keyframes_only = want
                    log.info("%s: %s (frames taken at %.3g/s, %.3g key frames/s)",
                             self._shown, "decoding key frames only" if want else
                             "decoding every frame again", self._hint_hz, kf)
                self._take_key = not (want and time.monotonic() < self._due)
                if self._reader.stopping.is_set():
                    raise SourceError(f"{self._shown}: closing")
            if what == "key" and not self._take_key:
                continue  # before the next frame is due: not decoded either
            if what == "slice" and self._skip:
                if self._reader.stopping.is_set():
                    raise SourceError(f"{self._shown}: closing")
                continue  # not even handed to the decoder
            try:
                frames = self._dec.decode(
                    unit if isinstance(unit, av.Packet) else av.Packet(unit))
            except av.error.FFmpegError:
                self.damaged += 1  # the decoder resynchronises at the next one
                continue
            for f in frames:
                if f.is_corrupt:
                    self.damaged += 1  # concealed: served, counted
                # one converter for the stream, on this thread: `to_ndarray(format=...)` made
                # a swscale context per frame with a thread pool of its own (PyAV 17+), two
                # threads started and ended each frame, their CPU on no stage's clock
                # (~0.4 ms a 720p frame beside the reader's own, docs/sources.md)
                self._ready.append(self._bgr.reformat(f, format="bgr24", **self._bgr_kw)
                                   .to_ndarray())
        return self._ready.popleft()

    def read(self, timeout_s: float) -> Frame | None:
        """The newest decoded frame (a key frame just decoded, when skipping; under a rate
        cap, the first decoded after its due time)."""
        got = self._reader.take(timeout_s, self._due if self.paced else -math.inf)
        if got is None:
            return None
        img, t0, n, cpu, skipped = got
        d = self.damaged  # read once: the reader thread adds to it
        damaged, self._damaged_told = d - self._damaged_told, d
        kf, hint, iv = self.key_frame_hz(), self._hint_hz, self._spaced()
        # the next frame served is the first decoded after its due time: half a frame (key
        # frame) interval early, so that on average frames are served at the hinted rate
        if self.keyframes_only and kf > 0 and hint > 0:
            self._due = time.monotonic() + 1 / hint - 0.5 / kf
        elif iv > 0:
            self._due = time.monotonic() + 1 / hint - 0.5 * iv
        else:
            self._due = -math.inf
        return Frame(img, f"frame-{n}", t=t0, decode_cpu_s=cpu, decoded_apart=True,
                     skipped=skipped, damaged=damaged)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the reader, then close the connection."""
        if not self._reader.stop():
            log.warning("%s: the reader is still inside a read after %.0f s; the stream is "
                        "left to it", self._shown, _LatestFrame.JOIN_S)
            return
        self._close_container()


def _av_major(av) -> int:
    """PyAV's major version (0 where it cannot be read)."""
    try:
        return int(str(av.__version__).split(".")[0])
    except ValueError:
        return 0


def _why(e: BaseException) -> str:
    """An FFmpeg/OS error's reason without the URL it names (credentials)."""
    return redact(str(getattr(e, "strerror", None) or type(e).__name__))[:200]


class TriggerSource:
    """Inspect on an MQTT message (e.g. from a PLC bridge). The payload is the image itself
    (PNG/JPEG bytes) or a path to one. The subscription is a persistent QoS 1 session so
    triggers sent while the daemon restarts still arrive. Messages are queued up to
    MAX_QUEUED of them and MAX_QUEUED_BYTES: past either (a publisher faster than the
    device, for longer than the queue covers) a new one is dropped, counted and logged, so
    a flood from the publisher's identity costs its own triggers, not the daemon's memory."""

    live = False
    MAX_QUEUED = 20_000  # a broker's replay of a weekend's triggers (persistent session)
    MAX_QUEUED_BYTES = 256 << 20

    def __init__(self, cfg: SourceConfig, broker, client_id: str):
        from runtime.wire.brokerauth import for_connection
        from runtime.wire.mqtt import Connection
        from runtime.wire.quarantine import RateLimitedLog

        self._q: queue.Queue = queue.Queue()
        self._cfg = cfg
        self._topic = cfg.topic
        self.received = self.dropped = 0  # counts (read by tests and the log)
        self._bytes = 0  # payload bytes queued
        self._bytes_lock = threading.Lock()
        self._said = RateLimitedLog(log)
        # The shared connection thread (backoff, protocol probe, exception containment); a
        # fixed client id with a persistent session, so triggers sent while the daemon
        # restarts are queued by the broker.
        self._conn = Connection(  # its own broker identity (client ids bound to usernames)
            for_connection(broker, "trigger"), client_id, name="trigger-mqtt",
            subscriptions=[(self._topic, 1)],
            on_message=lambda c, m: self._queue(m.payload), clean=False,
            session_expiry_s=7 * 24 * 3600,
            on_takeover=lambda why: log.error("trigger source: %s", why)).start()
        self._n = 0

    def _queue(self, payload: bytes) -> None:
        """On the connection's thread: queue a message, or drop it past the bounds."""
        self.received += 1
        with self._bytes_lock:
            full = self._q.qsize() >= self.MAX_QUEUED or \
                self._bytes + len(payload) > self.MAX_QUEUED_BYTES
            if not full:
                self._bytes += len(payload)
                self._q.put(payload)
                return
        self.dropped += 1
        self._said.log("full", "trigger source: %d messages (%d MB) queued on %s, its bound; "
                       "dropped a trigger (%d dropped so far): they arrive faster than this "
                       "device inspects them", self._q.qsize(), self._bytes >> 20,
                       self._topic, self.dropped)

    def read(self, timeout_s: float) -> Frame | None:
        """The next triggered image; a refused payload raises BadFrame (counted, skipped)."""
        try:
            payload = self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None
        with self._bytes_lock:
            self._bytes -= len(payload)
        self._n += 1
        ref = f"trigger-{self._n}"
        c0 = time.thread_time()
        try:
            img = decode_payload(bytes(payload), self._cfg.max_pixels)
        except BadImage as e:
            raise BadFrame(ref, e.kind, f"on {self._topic}: {e}") from e
        return Frame(img, ref, decode_cpu_s=time.thread_time() - c0)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the trigger's MQTT connection."""
        self._conn.stop()


class EdgeTriggered:
    """One frame of a camera (or the synthetic conveyor) per PLC edge (runtime/frames/edges.py):
    the capture thread waits for the next edge of this source, reads one frame and hands it
    over as `plc-<n>`, stamped with the edge's time (so its e2e is trigger to verdict).
    Never dropped (not live); an edge whose capture failed is put back first and the failure
    raised as a SourceError (the pipeline reopens the camera and the edge is captured then)."""

    live = False
    CAPTURE_TIMEOUT_S = 5.0  # a camera that gives no frame this long after an edge failed

    def __init__(self, camera: Source, edges: EdgeBoard | EdgeBoards, name: str):
        self._camera, self._edges, self._name = camera, edges, name

    def read(self, timeout_s: float) -> Frame | None:
        """The frame of the next edge, or None when no edge came within the timeout."""
        edge = self._edges.take(self._name, timeout_s)
        if edge is None:
            return None
        try:
            frame = self._camera.read(self.CAPTURE_TIMEOUT_S)
        except BaseException:
            self._edges.put_back(self._name, edge)
            raise
        if frame is None:
            self._edges.put_back(self._name, edge)
            raise SourceError(f"no frame from the camera within {self.CAPTURE_TIMEOUT_S:g} s "
                              f"of PLC edge {edge.n} (kept; captured once the camera is back)")
        frame.ref, frame.t = edge.ref, edge.t
        return frame

    def done(self, frames: list[Frame]) -> None:
        """The camera's own bookkeeping."""
        self._camera.done(frames)

    def close(self) -> None:
        """Close the camera (the pending edges stay on the board)."""
        self._camera.close()


class PylonSource:
    """A Basler camera through pypylon (runtime/frames/pylon_source.py, imported only here:
    pypylon is an optional extra) as a source: free-running (live, the newest frame) or,
    `triggered`, one frame per read by its software trigger (under EdgeTriggered). Frames
    carry the camera's frame number (`camera_frame`)."""

    def __init__(self, cfg: SourceConfig, triggered: bool = False):
        from runtime.frames import pylon_source

        self._m = pylon_source
        self.live = not triggered  # free-running: latest wins; triggered: never dropped
        try:
            self.camera = pylon_source.PylonCamera(cfg, triggered)
        except pylon_source.CameraError as e:
            raise SourceError(str(e)) from e

    def read(self, timeout_s: float) -> Frame | None:
        """The camera's next frame (PylonCamera.read); an incomplete one is a bad frame."""
        try:
            got = self.camera.read(timeout_s)
        except self._m.GrabFailed as e:
            raise BadFrame(e.ref, "truncated", e.why) from e
        except self._m.CameraError as e:
            raise SourceError(str(e)) from e
        if got is None:
            return None
        return Frame(got.image, f"frame-{got.number}", t=got.t, decode_cpu_s=got.convert_cpu_s,
                     camera_frame=got.number)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Let the camera go."""
        self.camera.close()


def decode_payload(payload: bytes, max_pixels: int) -> np.ndarray:
    """A trigger payload: image bytes (any format frames/images.py checks) or, when it is not
    one, a short UTF-8 path to an image file. BadImage when it is neither."""
    if images.sniff(payload) is None and 0 < len(payload) < 4096:
        try:
            path = Path(payload.decode("utf-8").strip())
        except UnicodeDecodeError:
            path = None
        try:  # a name the filesystem refuses (ENAMETOOLONG: any 256 bytes of text) raised
            # OSError out of the trigger source, which ended its capture thread
            is_file = path is not None and str(path) not in ("", ".") and path.is_file()
        except (OSError, ValueError):
            is_file = False
        if is_file:
            return images.decode(images.read_file(path, max_pixels), max_pixels)
    return images.decode(payload, max_pixels)


def use_pyav(cfg: SourceConfig) -> bool:
    """Whether a capture source is read through PyAV: `decoder = "pyav"` (SourceError when
    PyAV is missing), or "auto" for an RTSP URL where PyAV is installed."""
    if cfg.decoder == "opencv":
        return False
    if cfg.decoder == "pyav":
        if not pyav_available():
            raise SourceError("source.decoder = 'pyav' but PyAV is not installed (pip "
                              "install 'edgerun[streams]')")
        return True
    return cfg.path.lower().startswith("rtsp://") and pyav_available()


def open_source(cfg: SourceConfig, state_dir: Path, broker=None, client_id: str = "",
                clock: Clock | None = None, edges: EdgeBoard | EdgeBoards | None = None
                ) -> Source:
    """The configured source; SourceError when it cannot be opened right now. `clock` paces
    a synthetic camera (default: this host's); `edges`: the PLC's, for `trigger = "opcua"` or
    `"modbus"`."""
    if cfg.trigger:
        name = cfg.name or "main"
        if edges is None or name not in edges.sources:
            raise SourceError(f"source {name}: trigger = {cfg.trigger!r} but no PLC server "
                              f"hands it edges ([{cfg.trigger}] enabled)")
        if cfg.kind == "pylon":  # the camera's own software trigger, fired on each edge
            return EdgeTriggered(PylonSource(replace(cfg, trigger=""), triggered=True),
                                 edges, name)
        # captured on the edge, at once: a synthetic camera is not paced to its rate_hz
        camera = open_source(replace(cfg, trigger="", rate_hz=0.0 if cfg.kind == "synthetic"
                                     else cfg.rate_hz), state_dir, clock=clock)
        return EdgeTriggered(camera, edges, name)
    if cfg.kind == "synthetic":
        return SyntheticConveyor(cfg, clock)
    if cfg.kind == "folder":
        return FolderSource(cfg, state_dir)
    if cfg.kind == "capture":
        if use_pyav(cfg):
            return AvStreamSource(cfg)
        return CaptureSource(cfg)
    if cfg.kind == "pylon":
        return PylonSource(cfg)
    if broker is None or not broker.host:
        raise SourceError("source kind 'trigger' needs telemetry.broker.host")
    return TriggerSource(cfg, broker, f"{client_id}-trigger")
