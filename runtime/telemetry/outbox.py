"""Durable outbox: every result is on disk (its result log, or SQLite) before `append` returns.

Three classes of message, each with its own retention:

- results: a per-device `seq` (monotonic, never reused, survives restarts: the highest given is
  kept by the result log's `S` record and SQLite's AUTOINCREMENT counter) and kept until the
  coordinator's ack covers it. A result is first appended to the result log
  (`<outbox>.log`, resultlog.py): one line, the bytes of the result and no more, where it stays
  while the coordinator acks it promptly; only results left unacked for `spill_after_s` (or
  past `spill_bytes`) move into the database, in one transaction. The database's per-page
  writes (WAL frame, checkpoint, delete) wrote ~60x a result's size when each result went
  there (docs/telemetry.md, "Disk writes"). Past `max_bytes` the oldest are evicted, with an
  `outbox_evicting` event and a persistent counter: losing old results is a decision the operator
  must see, never a silent one.
- health: only the latest `health_keep` wait for the broker (older health is stale anyway).
- events: the latest `event_keep` wait for the broker.

`stream` is a random id made when the database is created; the coordinator de-duplicates by
(device, stream, seq), so a device whose outbox was wiped and restarted at seq 1 is a new stream,
not a flood of duplicates. `boot` is new on every open (one per process start).

One connection guarded by a lock: the pipeline appends, the publisher thread reads and deletes.
SQLite's WAL gives atomic commits, so kill -9 at any point leaves either the whole append or none.

A disk that refuses writes (full, I/O error: held.py `unwritable`) does not end the device:
writes wait in memory, bounded (held.py), with an `outbox_disk_full` critical event and
`backlog.disk_full` in health; every `retry_s` the next write tries to flush them, and when it
succeeds an `outbox_disk_recovered` event says how long it lasted. Only results past the memory
bound are lost (refused with OutboxFull, counted); the process keeps inferring throughout.
A disk that can make no file at start (read-only, out of inodes) gets an outbox in memory under
the boot's memory stream (`memory_only`, _in_memory, memory_stream), not a restart loop.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.schema import ConfigError
from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.held import Held, OutboxFull, unwritable
from runtime.telemetry.resultlog import ResultLog
from runtime.telemetry.sidecar import Sidecar
from runtime.wire.events import EventType
from runtime.wire.payloads import T_MAX
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.outbox")
_rlog = RateLimitedLog(log)  # a bug writing NaN would write it every message

# A memory-only outbox's stream id begins so; the coordinator leaves such streams out of its
# per-device cap (runtime/coordinator/ingest.py MEMORY_STREAM_PREFIX, the same string).
MEMORY_STREAM_PREFIX = "mem-"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the kernel's, new at every boot


def memory_stream(path: Path, boot_id: Path | None = None) -> tuple[str, int]:
    """The stream id and first seq of a memory-only outbox at `path`: one stream per kernel
    boot (and outbox path), its seqs from CLOCK_BOOTTIME in microseconds. A start in the
    same boot carries on the stream above every seq an earlier one gave (a process gives
    far fewer than one result a microsecond), so a daemon restarted in memory every 5 s is
    one stream a boot, not one a start; the coordinator's ack starts a new verified run at
    the jump (docs/telemetry.md, "An outbox in memory"). Without a boot id (not Linux): a
    random stream, one a start."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    try:
        kb = (boot_id or BOOT_ID).read_text().strip() if boottime is not None else ""
    except OSError:
        kb = ""
    if not kb or boottime is None:
        return MEMORY_STREAM_PREFIX + uuid.uuid4().hex[:12], 1
    key = f"{kb}\0{path.absolute()}"
    first = max(1, time.clock_gettime_ns(boottime) // 1000)
    return MEMORY_STREAM_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:12], first

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS other (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
                                  body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS other_kind ON other (kind, id);
CREATE TABLE IF NOT EXISTS seen_commands (id TEXT PRIMARY KEY, expires REAL NOT NULL);
"""


class OutboxUnavailable(ConfigError):
    """The outbox exists but cannot be opened now (locked, I/O error, not writable); it is
    kept as it is. A ConfigError so `edgerun serve` exits with this one line."""


@dataclass(frozen=True)
class Pending:
    """A result waiting for the coordinator: its seq and its JSON text (seq included)."""

    seq: int
    json: str


SHORT_MAX = 256  # the wire schema's cap on a result's model, variant and label (_SHORT)


def _deliverable(r: dict) -> dict:
    """`r` as the coordinator's result schema admits it: a `t` outside [0, T_MAX] clamped
    into it (a clock stepped to 1970 stamped t = -7.9e-05; its `clk` stamp, unsynced, is what
    places it), a model, variant or label longer than SHORT_MAX cut to it (a custom model's
    labels file). The coordinator quarantines a results message with one item it refuses and
    acks only up to the first missing seq, so one such result, re-sent for ever, stopped the
    whole stream. Each change is logged (an ERROR, once a minute)."""
    fixed: dict[str, Any] = {}
    t = r.get("t")
    if isinstance(t, int | float) and not isinstance(t, bool) and not 0 <= t <= T_MAX:
        fixed["t"] = min(max(float(t), 0.0), T_MAX)  # NaN: max() keeps 0.0 (_dumps: null)
    for k in ("model", "variant", "label"):
        v = r.get(k)
        if isinstance(v, str) and len(v) > SHORT_MAX:
            fixed[k] = v[:SHORT_MAX]
    if not fixed:
        return r
    _rlog.log("undeliverable", "a result the coordinator would refuse (and stop acking its "
              "stream at): %s; sent as %s", ", ".join(f"/{k} {str(r[k])[:80]!r}" for k in fixed),
              ", ".join(f"/{k} {str(v)[:80]!r}" for k, v in fixed.items()), level=logging.ERROR)
    return {**r, **fixed}


def _dumps(obj: Any) -> str:
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: JSON has neither
        bad: list[str] = []
        obj = _finite(obj, "", bad)
        _rlog.log("nonfinite", "a message held a non-finite number at %s (a bug: a figure that "
                  "cannot be measured is null); stored with null there", ", ".join(bad[:5]),
                  level=logging.ERROR)
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    if "\\ud" in text:  # a surrogate escape: a pair (valid) or a lone one; rare, so walk then
        text = json.dumps(_valid_text(obj), separators=(",", ":"), allow_nan=False)
    return text


def _finite(obj: Any, path: str, bad: list[str]) -> Any:
    """`obj` with every NaN or infinite float replaced by None, their paths in `bad`. Health
    or a result dying in json.dumps ended the thread that wrote it (a daemon stopped on
    health after its power meter went away)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        bad.append(path or "/")
        return None
    if isinstance(obj, dict):
        return {k: _finite(v, f"{path}/{k}", bad) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v, f"{path}/{i}", bad) for i, v in enumerate(obj)]
    return obj


def _valid_text(obj: Any) -> Any:
    """`obj` with every lone surrogate written as a `\\udcff` escape. The coordinator refuses
    text that is not valid Unicode (runtime/wire/safejson.py): stored as it was, such a
    result was refused at every retry and the stream stalled behind it."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {_valid_text(k): _valid_text(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_valid_text(v) for v in obj]
    return obj


def _space(path: Path) -> str:
    """What the filesystem holding `path` has free, for a failure to open it: SQLite says
    `disk I/O error` when a full disk refuses its -shm file, which reads as a failing card."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:  # less than SQLite's WAL and -shm files need to grow
        return f"; its filesystem is full: {free} bytes free in {path.parent}"
    if st.f_files and not st.f_favail:  # bytes free but no inode: no -wal or -shm file
        return (f"; its filesystem has no free inodes ({st.f_files} files) in {path.parent}: "
                "delete files there (snapshots, old logs)")
    return ""


def no_new_files(path: Path) -> str:
    """Why no file can be made beside `path` ("" when one can, or for another reason): a
    read-only filesystem (a card's ext4 gone read-only after errors: `errors=remount-ro`,
    which statvfs does not show), no free inodes, a used-up quota. SQLite needs its -wal
    and -shm files to open the outbox, so there it cannot, and a retry cannot either until
    someone repairs or cleans the disk. Found by making one (and removing it)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".edgerun-probe-", dir=path.parent)
    except OSError as e:
        if e.errno == errno.EROFS:
            return "its filesystem is read-only"
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return (_space(path).removeprefix("; ") or "no file can be made there "
                    f"({e.strerror})")
        return ""
    os.close(fd)
    os.unlink(probe)
    return ""


def _blocking(path: Path) -> str:
    """Which of the database's files (it, its -wal, its -shm) this process cannot write: a
    killed `sudo edgerun serve` leaves root-owned -wal and -shm files, and SQLite's error
    names neither."""
    said = []
    if not path.exists() and not os.access(path.parent, os.W_OK):  # read-only mount, modes
        said.append(f"{path.parent} cannot be written (the outbox cannot be made there)")
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.is_dir():
            said.append(f"{p} is a directory")
            continue
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_NOFOLLOW))  # opens, writes nothing
        except FileNotFoundError:
            pass
        except OSError as e:
            said.append(f"{p} cannot be written ({e.strerror})")
    return "; " + "; ".join(said) if said else ""


def _size(p: Path) -> int:
    """A file's size, 0 when it is absent or unreadable."""
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _emptied(path: Path) -> bool:
    """Whether the database at `path` is a zero-byte file where an outbox was: a WAL beside
    it, its result log has records or its replay record exists. A power cut can leave a file
    at zero bytes, and SQLite opens one as a new database: the results only in it were gone
    without a word. A WAL beside it does not save them: SQLite deletes the WAL of a
    zero-page database on any open, read-only too, and opens the file empty. (A first start
    creates the log and the record only after the database's tables.)"""
    if not path.is_file() or _size(path):
        return False
    return (_size(Path(f"{path}-wal")) > 0 or _size(path.with_name(path.name + ".log")) > 0
            or path.with_name(path.name + ".keep.json").exists())


def _connect_wal(path: Path) -> sqlite3.Connection:
    """A connection in WAL mode. On a full disk after a clean stop (no -shm file left)
    SQLite cannot make its shared-memory file and says `disk I/O error`: the database is
    then opened for this process alone, its WAL index in memory (SQLite's exclusive
    locking mode needs no -shm), so the daemon starts degraded instead of exiting into a
    restart loop for as long as the disk stays full."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                         timeout=30)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        return db
    except sqlite3.OperationalError as e:
        db.close()
        if not (unwritable(e) and _space(path)):
            raise
        first = e
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                         timeout=30)
    try:
        db.execute("PRAGMA locking_mode=EXCLUSIVE")  # before the first read: no -shm
        db.execute("PRAGMA journal_mode=WAL")
    except BaseException:
        db.close()
        raise
    log.warning("outbox %s: cannot make SQLite's shared-memory file (%s%s); opened the "
                "outbox for this process alone until the daemon restarts (other programs "
                "reading it, `edgerun report`, see it locked)", path, first,
                _space(path))
    return db


def last_seq(db: Path) -> int:
    """The highest seq the outbox at `db` has given (its result log's and its database's),
    read-only while a daemon writes it: the results made, acked or not."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = con.execute("SELECT seq FROM sqlite_sequence WHERE name='results'").fetchone()
    except sqlite3.OperationalError:  # no result table yet
        row = None
    finally:
        con.close()
    return max(row[0] if row else 0, resultlog.read(db.with_name(db.name + ".log")).last_seq)

def _salvage(db: Path) -> tuple[str, int] | None:
    """A damaged database's stream id and the highest seq it gave, where both can still be
    read (a failed quick_check often leaves these small tables whole); None otherwise."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            stream = con.execute("SELECT v FROM meta WHERE k='stream'").fetchone()
            seq = con.execute("SELECT seq FROM sqlite_sequence WHERE name='results'").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if not stream or not isinstance(stream[0], str) or not stream[0]:
        return None
    if seq is not None and not isinstance(seq[0], int):
        return None
    return stream[0], seq[0] if seq else 0


class Outbox:
    """The device's durable queue (see module docstring)."""

    def __init__(self, cfg: OutboxConfig, on_event: Callable[[dict], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """Open (or create) the outbox at `cfg.path`; `clock` (monotonic seconds) times how
        long results and health wait unsent before they spill, one clock a test can drive."""
        self.cfg = cfg
        self._clock = clock
        self.path = Path(cfg.path).expanduser()
        with contextlib.suppress(OSError):  # a read-only disk: _open says so (memory only)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._on_event = on_event or (lambda e: None)
        self._startup_event: dict | None = None
        self._damage_event: dict | None = None  # result-log lines lost (told after the above)
        self.changes = 0  # bumped on every append/put: readers skip queries when unchanged
        self._listeners: list[Callable[[], None]] = []
        self._held = Held(cfg.memory_max_bytes, cfg.retry_s)  # while the disk refuses writes
        existed = self.path.exists()
        self._salvaged: tuple[str, int] | None = None  # a corrupt database's stream, last seq
        self._corrupt: tuple[Path, BaseException] | None = None  # where it went, and why
        # why this outbox lives in memory only ("": on disk): a state disk that can make no
        # file at start (_in_memory)
        self.memory_only = ""
        self._db = self._open()
        self._max_bytes = cfg.memory_max_bytes if self.memory_only else cfg.max_bytes
        self.boot = uuid.uuid4().hex[:12]
        self.stream = self._meta("stream") or self._new_stream(self._salvaged)
        keep = self.path.with_name(self.path.name + ".keep.json")
        self.sidecar = Sidecar(keep, lost_history=existed and not keep.exists()
                               and self._startup_event is not None)
        if not self.sidecar.problem:
            self._migrate_seen_commands()
        self.evicted_total = max(int(self._meta("evicted_total") or 0),
                                 self.sidecar.evicted_total)
        if self.evicted_total != self.sidecar.evicted_total:
            self.sidecar.set_evicted_total(self.evicted_total)
        if self.sidecar.problem and self._startup_event is None:
            self._startup_event = {"type": EventType.REPLAY_RECORD_LOST,
                                   "error": self.sidecar.problem}
        self._bytes = self._db.execute("SELECT COALESCE(SUM(LENGTH(body)),0) FROM results"
                                       ).fetchone()[0]
        self._db_results = self._db.execute("SELECT 1 FROM results LIMIT 1").fetchone() is not None
        self._fresh: list[tuple[int, str, str, float]] = []  # health not on disk (_put_fresh)
        self._other_last = 0
        self._last = self._last_seq_db()
        # results in the log only (seq, json), oldest first; every seq here is above the
        # database's, and when they were appended (monotonic) for spilling
        self._recent: list[tuple[int, str]] = []
        self._recent_bytes = 0
        self._recent_t: list[float] = []  # when each was appended (monotonic), for spilling
        self._log = ResultLog(self.path.with_name(self.path.name + ".log"),
                              sync=cfg.fsync == "full")
        self._log_damaged = 0
        if not self.memory_only:  # the log on disk holds the disk's stream: left there
            self._recover_log()
        if self._corrupt:
            self._report_corrupt(*self._corrupt)

    def _report_corrupt(self, aside: Path, e: BaseException) -> None:
        """Say what a corrupt database cost and what was done about it."""
        n = len(self._recent)
        if self._salvaged:
            how = (f"the {n} unacked results of its result log are sent again under the same "
                   f"stream {self.stream} (its id and last seq {self._salvaged[1]} were read "
                   "from the damaged file), so the coordinator stores each once; results "
                   "only in the database are lost")
        else:
            how = (f"its stream id could not be read: the {n} unacked results of its result "
                   f"log are sent again under a new stream {self.stream} with seqs above "
                   "theirs, and any the coordinator stored but had not acked yet are stored "
                   "twice; results only in the database are lost")
        log.error("outbox %s is corrupt (%s); moved it to %s and started an empty outbox; %s",
                  self.path, e, aside, how)
        assert self._startup_event is not None
        self._startup_event.update({"results_kept": n,
                                    "stream": "kept" if self._salvaged else "new"})

    def _recover_log(self) -> None:
        """Take back the results the log holds that are neither acked nor in the database."""
        try:
            rec = self._log.recover()
        except OSError as e:
            raise OutboxUnavailable(f"telemetry.outbox.path {self.path}: cannot open the "
                                    f"outbox's result log {self._log.path} ({e}); exiting so "
                                    "it is retried") from e
        self._log_damaged = rec.skipped_bytes  # lost results: health shows it (stats)
        if rec.skipped_bytes:  # durable: the log is rewritten without them, so said once
            self._damage_event = {"type": EventType.OUTBOX_LOG_DAMAGED, "severity": "warning",
                                  "path": str(self._log.path), "lines": rec.skipped_lines,
                                  "bytes": rec.skipped_bytes, "results_kept": len(rec.results)}
        # after a corrupt database, the log's results are all that is left of it: take back
        # every unacked one, even those the lost database held too
        floor = max(0 if self._corrupt else self._last, rec.acked)
        self._recent = [(q, b) for q, b in rec.results if q > floor]
        self._recent_bytes = sum(len(b) for _, b in self._recent)
        self._bytes += self._recent_bytes
        self._recent_t = [self._clock()] * len(self._recent)
        self._last = max(self._last, rec.last_seq)
        if rec.acked and self._db_results:  # an ack the log recorded before a crash
            with contextlib.suppress(sqlite3.OperationalError):  # a full disk: sent again
                self._db.execute("DELETE FROM results WHERE seq <= ?", (rec.acked,))
            self._recount()

    def _migrate_seen_commands(self) -> None:
        """Ids remembered by an older version inside the database move to the sidecar."""
        now = time.time()
        for cid, expires in self._db.execute("SELECT id, expires FROM seen_commands"
                                             ).fetchall():
            if expires >= now and cid not in self.sidecar.seen:
                self.sidecar.remember(cid, expires)
        try:
            self._db.execute("DELETE FROM seen_commands")
        except sqlite3.OperationalError as e:  # a full disk: moved at a later start
            if not unwritable(e):
                raise

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.OperationalError as e:
            # where an outbox ran before (a first start there is a mount or a path to fix)
            if self.path.exists() and (why := no_new_files(self.path)):
                return self._in_memory(e, why)
            # Locked by another process past the busy timeout, an I/O error, cannot be opened
            # or written: none says the file is damaged, and moving a whole outbox aside
            # stranded its unacked results in a .corrupt file no one sends (a lock held 30 s
            # did that). Stop, keep it, say why; systemd starts the daemon again to retry.
            raise OutboxUnavailable(
                f"telemetry.outbox.path {self.path}: cannot open the outbox ({e}{_space(self.path)}"
                f"{_blocking(self.path)}"
                "); it was left as it is (not moved aside: this is not corruption); exiting so "
                "it is retried"
            ) from e
        except sqlite3.DatabaseError as e:  # not a database, malformed, failed quick_check
            # A corrupt outbox must not keep the device from running: keep the file for
            # forensics, start an empty one, and say so loudly (in __init__, once the result
            # log has been read). The result log is not moved with it: it is a file of its
            # own, every line checked, and most unacked results live only there; moved aside
            # they were stranded. A copy goes beside the database for forensics.
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            # never opened when empty: even a read-only open deletes a zero-page
            # database's WAL (_emptied), which goes aside with it
            self._salvaged = _salvage(self.path) if _size(self.path) else None
            try:
                for suffix in ("", "-wal", "-shm"):
                    src = Path(str(self.path) + suffix)
                    if src.exists():
                        src.rename(str(aside) + suffix)
            except OSError:  # a card gone read-only as it failed: left as it is, for a start
                # that can write it (raised, this was a traceback every restart)
                if why := no_new_files(self.path):
                    return self._in_memory(e, why)
                raise
            with contextlib.suppress(OSError):  # a full disk: the log itself is kept anyway
                shutil.copyfile(str(self.path) + ".log", str(aside) + ".log")
            try:
                db = self._connect()
            except sqlite3.OperationalError as again:  # no inode for the empty one (a rename
                # needs none): raised, the next start found no outbox and exited as a first
                if why := no_new_files(self.path):
                    return self._in_memory(again, f"{why}; the damaged outbox ({e}) was "
                                           f"moved to {aside}")
                raise
            self._corrupt = (aside, e)
            self._startup_event = {"type": EventType.OUTBOX_CORRUPT, "path": str(aside),
                                   "error": str(e)}
            return db

    def _in_memory(self, e: BaseException, why: str) -> sqlite3.Connection:
        """An outbox in memory, under the boot's memory stream, for a state disk that can
        make no file (no_new_files): the device goes on inspecting, serving its PLC and
        publishing, as it does when the disk refuses writes while it runs (held.py), instead
        of exiting into a restart loop that nothing ends until someone repairs the disk. Not
        the disk's stream: it may have given seqs this process cannot read back (its log,
        its WAL), and one given twice is taken for a re-delivery and dropped; the boot's
        memory stream (memory_stream), which a restart in the same boot carries on. The
        disk's unacked results stay there for a start that can write it."""
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        db.executescript(_SCHEMA)
        stream, first = memory_stream(self.path)
        db.execute("INSERT INTO meta VALUES ('stream', ?)", (stream,))
        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('results', ?)", (first - 1,))
        self.memory_only = f"{e}; {why}"
        self._salvaged = None  # a damaged database's stream: its log's seqs are not read here
        log.critical("outbox %s cannot be opened (%s): results are kept in memory only, up to "
                     "%d bytes ([telemetry.outbox] memory_max_bytes), under this boot's memory "
                     "stream %s from seq %d; those not acked when the daemon stops are lost. "
                     "Results the outbox on disk holds stay there for a start that can write "
                     "it: repair or clean the disk, then restart", self.path, self.memory_only,
                     self.cfg.memory_max_bytes, stream, first)
        self._startup_event = {"type": EventType.OUTBOX_DISK_FULL, "severity": "critical",
                               "path": str(self.path), "error": self.memory_only[:300],
                               "memory_max_bytes": self.cfg.memory_max_bytes,
                               "memory_only": True}
        return db

    def _connect(self) -> sqlite3.Connection:
        if _emptied(self.path):
            raise sqlite3.DatabaseError("the file is empty (0 bytes) though its result log "
                                        "or replay record shows it held an outbox")
        db = _connect_wal(self.path)
        db.execute(f"PRAGMA synchronous={'FULL' if self.cfg.fsync == 'full' else 'NORMAL'}")
        ok = db.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            db.close()
            raise sqlite3.DatabaseError(f"quick_check: {ok}")
        db.executescript(_SCHEMA)
        try:  # writable? (files left root-owned by a `sudo edgerun serve` open read-only, and
            # the first write, later in __init__, raised a traceback instead of this)
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('opened', ?)", (str(time.time()),))
            db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            if not unwritable(e):  # read-only, locked: OutboxUnavailable (see _open)
                db.close()
                raise
            # a full disk at start: serve from memory until it takes writes (held.py), not a
            # restart loop for as long as it stays full
            with contextlib.suppress(sqlite3.OperationalError):
                db.execute("ROLLBACK")
            events: list[dict] = []
            self._disk_refused(e, events)
            self._startup_event = self._startup_event or events[0]
        except BaseException:
            db.close()
            raise
        return db

    def _new_stream(self, salvaged: tuple[str, int] | None = None) -> str:
        """A new outbox's stream id, stored; a disk too full to create it is one line.
        `salvaged` (a corrupt database's stream and last seq) keeps that stream, with its
        seqs never given again: the results re-sent from the log are then de-duplicated."""
        try:
            if salvaged is None:
                return self._set_meta("stream", uuid.uuid4().hex[:12])
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM sqlite_sequence WHERE name='results'")
                self._db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('results', ?)",
                                 (salvaged[1],))
                self._set_meta("stream", salvaged[0])
                self._db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.OperationalError):
                    self._db.execute("ROLLBACK")
                raise
            return salvaged[0]
        except sqlite3.OperationalError as e:
            if not unwritable(e):
                raise
            self._db.close()
            raise OutboxUnavailable(f"telemetry.outbox.path {self.path}: cannot create the "
                                    f"outbox ({e}); free space in {self.path.parent}") from e

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT v FROM meta WHERE k=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> str:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))
        return value

    # -- results -------------------------------------------------------------------------------

    def listen(self, fn: Callable[[], None]) -> None:
        """Call `fn()` after every append and put, on the writer's thread, once its rows
        can be read (the publisher's connection wakes on it instead of polling; `fn` must be
        quick and never raise)."""
        self._listeners.append(fn)

    def _tell(self) -> None:
        for fn in self._listeners:  # outside the lock: a listener may read the outbox
            fn()

    def append(self, result: dict) -> int:
        """Store one result durably; returns its seq."""
        return self.append_many([result])[0]

    def append_many(self, results: Sequence[dict]) -> list[int]:
        """Store results in one transaction (one fsync); returns their seqs in order.

        Each result is labelled with this process's `boot` (unless it has one), so a result
        re-sent by a later process is still stored with the boot that produced it."""
        bodies = [_dumps(_deliverable(r if "boot" in r else {**r, "boot": self.boot}))
                  for r in results]
        events: list[dict] = []
        try:
            with self._lock:
                if self._held.active and not self._flush(events):
                    return self._hold_results(bodies)
                try:
                    seqs = (self._log_results(bodies, events)
                        if self.cfg.spill_after_s > 0 and not self.memory_only
                        else self._insert_results(bodies, events))
                except (sqlite3.OperationalError, OSError) as e:
                    if not unwritable(e):
                        raise
                    self._disk_refused(e, events)
                    return self._hold_results(bodies)
                self.changes += 1
                return seqs
        finally:
            for ev in events:  # outside the lock: the handler queues an event (put)
                self._on_event(ev)
            self._tell()

    def _log_results(self, bodies: list[str], events: list[dict]) -> list[int]:
        """Append results to the log (caller holds the lock); spill to the database when they
        wait too long or too many wait. Raises OSError when the disk refuses the append."""
        seqs = list(range(self._last + 1, self._last + 1 + len(bodies)))
        rows = list(zip(seqs, bodies, strict=True))
        self._log.append(rows)
        now = self._clock()
        self._last = seqs[-1]
        self._recent += rows
        self._recent_t += [now] * len(rows)
        added = sum(len(b) for b in bodies)
        self._recent_bytes += added
        self._bytes += added
        if (self._recent_bytes > min(self.cfg.spill_bytes, self._max_bytes // 2)
                or self._bytes > self._max_bytes
                or now - self._recent_t[0] >= self.cfg.spill_after_s):  # the oldest unacked
            self._spill(events)
        return seqs

    def _spill(self, events: list[dict]) -> None:
        """Move the log's unacked results into the database in one transaction, then start
        the log again. A disk that refuses it leaves them in the log (durable there) and
        the next append tries again."""
        rows, self._recent = self._recent, []
        times, self._recent_t = self._recent_t, []
        self._bytes -= self._recent_bytes
        try:
            self._insert_results([b for _, b in rows], events, [q for q, _ in rows])
        except (sqlite3.OperationalError, OSError) as e:
            self._recent = rows + self._recent
            self._recent_t = times + self._recent_t
            self._recount()  # (adding _recent_bytes after the rollback's recount: twice)
            if not unwritable(e):
                raise
            _rlog.log("spill", "outbox %s: cannot move %d unacked results from the log into "
                      "the database (%s); they stay in the log", self.path, len(rows), e)
            return
        self._recent_bytes = 0
        self._db_results = True
        self._restart_log()

    def _restart_log(self) -> None:
        """Start the log again once nothing in it is needed (all acked or in the database)."""
        try:
            self._log.restart(self._last)
        except OSError as e:  # the old log stays: still correct, only longer
            if not unwritable(e):
                raise
            _rlog.log("restart", "outbox %s: cannot start the result log again (%s)",
                      self.path, e)

    def _insert_results(self, bodies: list[str], events: list[dict],
                        seqs: list[int] | None = None) -> list[int]:
        """Insert result bodies (with the given seqs, else new ones) in one transaction,
        evicting past max_bytes; rolled back whole on any error."""
        done: list[dict] = []  # an eviction rolled back with the rest says nothing
        self._db.execute("BEGIN IMMEDIATE")
        try:
            out = self._insert_rows(bodies, done, seqs)
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._last = max([self._last, *out])
        self._evicted(done)
        events.extend(done)
        return out

    def _insert_rows(self, bodies: list[str], events: list[dict],
                     seqs: list[int] | None = None) -> list[int]:
        """The inserts of _insert_results, inside the caller's transaction."""
        if seqs is None:  # after the highest given: the log's results may be above the table's
            seqs = list(range(self._last + 1, self._last + 1 + len(bodies)))
        self._db.executemany("INSERT INTO results (seq, body) VALUES (?,?)",
                             zip(seqs, bodies, strict=True))
        # pending() and floor() read the table only when this is set: without it results
        # written straight here (spill_after_s = 0) were never published
        self._db_results = True
        out = list(seqs)
        self._bytes += sum(len(b) for b in bodies)
        if self._bytes > self._max_bytes and (evicted := self._evict()):
            count, first, last = evicted
            events.append({"type": EventType.OUTBOX_EVICTING, "count": count, "first_seq": first,
                           "last_seq": last, "evicted_total": self.evicted_total})
        return out  # type: ignore[return-value]

    def _rollback(self) -> None:
        """Undo the open transaction (an I/O error may have ended it already) and recount,
        evictions undone with it (_evicted records only those committed)."""
        # "no transaction is active": SQLite rolled back itself (it does on some I/O errors)
        with contextlib.suppress(sqlite3.OperationalError):
            self._db.execute("ROLLBACK")
        self._recount()
        self.evicted_total = max(int(self._meta("evicted_total") or 0),
                                 self.sidecar.evicted_total)

    def _evicted(self, done: list[dict]) -> None:
        """Say and record the evictions of a committed transaction (in `done`, its events):
        one rolled back (a full disk refused it) evicted nothing and is not said."""
        for ev in done:
            if ev["type"] != EventType.OUTBOX_EVICTING:
                continue
            log.warning("outbox over %d bytes: evicted %d oldest unacked results (seq %d-%d); "
                        "the coordinator has not acked them",
                        self._max_bytes, ev["count"], ev["first_seq"], ev["last_seq"])
            if not self.memory_only:  # (the disk refuses it: said once at start)
                self.sidecar.set_evicted_total(self.evicted_total)

    def _recount(self) -> None:
        """Bytes of results held: the database's and the log's."""
        self._bytes = self._db.execute(
            "SELECT COALESCE(SUM(LENGTH(body)),0) FROM results").fetchone()[0] + self._recent_bytes

    # -- a disk that refuses writes (held.py) ------------------------------------------------

    def _disk_refused(self, e: BaseException, events: list[dict]) -> None:
        """The disk refused a write: hold in memory from now on (caller holds the lock)."""
        if self._held.start(e, time.time()):
            log.critical("outbox %s: the disk refuses writes (%s); results wait in memory (up "
                         "to %d bytes), health and events are sent from memory; retrying "
                         "every %.1f s", self.path, e, self.cfg.memory_max_bytes,
                         self.cfg.retry_s)
            events.append({"type": EventType.OUTBOX_DISK_FULL, "severity": "critical",
                           "path": str(self.path), "error": str(e)[:300],
                           "memory_max_bytes": self.cfg.memory_max_bytes})

    def _hold_results(self, bodies: list[str]) -> list[int]:
        """Keep results in memory with their seqs, or refuse them past the bound."""
        if not self._held.room(bodies):
            self._held.refused_total += len(bodies)
            raise OutboxFull(f"outbox {self.path}: the disk refuses writes "
                             f"({self._held.error}) and {self._held.bytes} bytes of results "
                             "already wait in memory ([telemetry.outbox] memory_max_bytes = "
                             f"{self.cfg.memory_max_bytes}): {len(bodies)} results not kept")
        first = max(self._held.last_seq(), self._last) + 1
        return self._held.add_results(first, bodies)

    def _flush(self, events: list[dict]) -> bool:
        """Try to write what waits in memory (caller holds the lock); True when the disk took
        it all and the outbox is back to normal."""
        if not self._held.due():
            return False
        h = self._held
        if not self._recent and self._log.size > self.cfg.log_restart_bytes / 16:
            # every result in the log is acked (acks the disk refused included): give its
            # bytes back first; the disk may be full of nothing but this log
            try:
                self._log.restart_in_place(self._last)
            except OSError as e:
                if not unwritable(e):
                    raise
                _rlog.log("restart", "outbox %s: cannot start the acked result log again in "
                          "place (%s)", self.path, e)
        done: list[dict] = []
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if h.acked_upto:
                    self._db.execute("DELETE FROM results WHERE seq <= ?", (h.acked_upto,))
                if h.removed:
                    self._db.executemany("DELETE FROM other WHERE id=?",
                                         [(i,) for i in sorted(h.removed)])
                # the table's bytes (the acks just applied freed some), the log's counted as
                # they move in: counted twice, they evicted results under the cap
                self._recount()
                self._bytes -= self._recent_bytes
                if self._recent:  # below the held results' seqs: into the table first
                    self._insert_rows([b for _, b in self._recent], done,
                                      [q for q, _ in self._recent])
                if h.results:
                    self._insert_rows([b for _, b in h.results], done,
                                      [q for q, _ in h.results])
                for rowid, kind, body in h.other_rows():
                    self._db.execute("INSERT INTO other (id, kind, body) VALUES (?,?,?)",
                                     (rowid, kind, body))
                for kind in h.others:
                    keep = self.cfg.health_keep if kind == "health" else self.cfg.event_keep
                    self._db.execute("DELETE FROM other WHERE kind=? AND id NOT IN (SELECT id "
                                     "FROM other WHERE kind=? ORDER BY id DESC LIMIT ?)",
                                     (kind, kind, keep))
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        except (sqlite3.OperationalError, OSError) as e:
            if not unwritable(e):
                raise
            h.failed_again(e)
            return False
        self._evicted(done)
        events.extend(done)
        if h.results:
            self._last = max(self._last, h.results[-1][0])
        if self._recent or h.acked_upto:  # the log's unacked results are in the table now,
            # and acks it could not record are applied: nothing in it is needed
            self._recent, self._recent_t, self._recent_bytes = [], [], 0
            self._restart_log()
        self._db_results = True
        self._recount()  # the acks applied here freed bytes too
        cleared = h.clear()
        self.changes += 1
        log.warning("outbox %s: the disk takes writes again; %d results held in memory are "
                    "stored (%.0f s unwritable, %d results refused past the memory bound)",
                    self.path, cleared["results"], cleared["down_s"], cleared["refused_total"])
        events.append({"type": EventType.OUTBOX_DISK_RECOVERED, "severity": "info", **cleared})
        return True

    def retry(self) -> bool:
        """Try the disk again now if a retry is due; True when nothing waits in memory."""
        events: list[dict] = []
        try:
            with self._lock:
                return not self._held.active or self._flush(events)
        finally:
            for ev in events:
                self._on_event(ev)

    def _evict(self) -> tuple[int, int, int] | None:
        """Delete oldest results down to 90% of the cap (inside the caller's transaction);
        returns how many and their first and last seq, None when none is older than the
        result just written (one over the cap alone: kept, it was deleted as it was written
        and its bytes stayed counted, so every later result went the same way)."""
        target = self._max_bytes * 0.9
        rows = self._db.execute("SELECT seq, LENGTH(body) FROM results ORDER BY seq").fetchall()
        count, first, last = 0, rows[0][0], rows[0][0]
        for seq, size in rows[:-1]:  # never evict the result just written
            if self._bytes <= target:
                break
            self._bytes -= size
            count, last = count + 1, seq
        if not count:
            return None
        self._db.execute("DELETE FROM results WHERE seq <= ?", (last,))
        self.evicted_total += count
        self._set_meta("evicted_total", str(self.evicted_total))
        return count, first, last

    def pending(self, after_seq: int, limit: int) -> list[Pending]:
        """Up to `limit` held results with seq > `after_seq`, in seq order."""
        with self._lock:
            rows = (self._db.execute("SELECT seq, body FROM results WHERE seq > ? ORDER BY seq "
                                     "LIMIT ?", (after_seq, limit)).fetchall()
                    if self._db_results else [])
            # _recent is in seq order: start after `after_seq`, not at its head (slicing the
            # head first returned nothing once more than `limit` results waited unacked)
            start = bisect.bisect_right(self._recent, after_seq, key=lambda r: r[0])
            rows = sorted(rows + self._recent[start:start + limit])[:limit]
        return [Pending(seq, f'{{"seq":{seq},{body[1:]}' if body != "{}" else f'{{"seq":{seq}}}')
                for seq, body in rows]

    def floor(self) -> int:
        """Lowest seq still held; every seq below it was acked or evicted."""
        with self._lock:
            row = (self._db.execute("SELECT MIN(seq) FROM results").fetchone()[0]
                   if self._db_results else None)
            if self._recent:
                row = self._recent[0][0] if row is None else min(row, self._recent[0][0])
            return row if row is not None else self._last + 1

    def last_seq(self) -> int:
        """The highest seq ever stored on disk (0 for a new outbox); results held in memory
        (a full disk) come after it and are not published yet."""
        with self._lock:
            return self._last

    def _last_seq_db(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name='results'"
                               ).fetchone()
        return row[0] if row else 0

    def ack(self, seq: int) -> int:
        """The coordinator stored everything up to `seq`: drop those; returns how many."""
        events: list[dict] = []
        with self._lock:
            n = self._ack_log(seq, events)
            sizes: list[tuple[int]] = []
            try:
                if self._db_results:  # only after a spill: acks are usually the log's alone
                    sizes = self._db.execute("DELETE FROM results WHERE seq <= ? "
                                             "RETURNING LENGTH(body)", (seq,)).fetchall()
                    self._db_results = self._db.execute(
                        "SELECT 1 FROM results LIMIT 1").fetchone() is not None
            except sqlite3.OperationalError as e:  # a delete needs journal space too
                if not unwritable(e):
                    raise
                self._disk_refused(e, events)
                self._held.acked_upto = max(self._held.acked_upto, seq)
                sizes = []
            else:
                self._bytes -= sum(s for (s,) in sizes)
        for ev in events:
            self._on_event(ev)
        return n + len(sizes)

    def _ack_log(self, seq: int, events: list[dict]) -> int:
        """Drop the log's results up to `seq` (caller holds the lock); returns how many. The
        ack is recorded in the log, unsynced; an emptied log past `restart_bytes` starts
        again. A disk that refuses the ack record puts the outbox in its full-disk state (the
        next results wait in memory, counted) as a refused database write does."""
        n = 0
        while n < len(self._recent) and self._recent[n][0] <= seq:
            n += 1
        if not n:
            return 0
        freed = sum(len(b) for _, b in self._recent[:n])
        del self._recent[:n]
        del self._recent_t[:n]
        self._recent_bytes -= freed
        self._bytes -= freed
        if self._held.active:  # the disk refuses writes: the flush starts the log again
            self._held.acked_upto = max(self._held.acked_upto, seq)
            return n
        try:
            if not self._recent and self._log.size > self.cfg.log_restart_bytes:
                self._restart_log()
            else:
                self._log.ack(seq)
        except OSError as e:  # not recorded: those results are sent again after a restart
            if not unwritable(e):
                raise
            self._disk_refused(e, events)
            self._held.acked_upto = max(self._held.acked_upto, seq)
        return n

    # -- health and events ---------------------------------------------------------------------

    def put(self, kind: str, message: dict) -> int:
        """Queue a health or event message (bounded per kind); returns its id."""
        keep = self.cfg.health_keep if kind == "health" else self.cfg.event_keep
        body = _dumps(message)
        events: list[dict] = []
        try:
            with self._lock:
                if self._held.active and kind == "health":
                    # an idle source makes no result to retry with: without this, an outage
                    # outlived its cause, held results unpublished, for as long as none came
                    self._flush(events)
                if kind == "health" and self.cfg.spill_after_s > 0:
                    return self._put_fresh(kind, body, keep)
                if not self._held.active or self._flush(events):
                    try:
                        return self._insert_other(kind, body, keep)
                    except sqlite3.OperationalError as e:
                        if not unwritable(e):
                            raise
                        self._disk_refused(e, events)
                rowid = self._next_other()
                self._held.add_other(rowid, kind, body, keep)
                self.changes += 1
                return rowid
        finally:
            for ev in events:
                self._on_event(ev)
            self._tell()

    def _next_other(self) -> int:
        """A new message id, above every id in the database, in memory and fresh."""
        self._other_last = max(self._other_last, self._held.last_other(),
                               self._last_other_db()) + 1
        return self._other_last

    def _put_fresh(self, kind: str, body: str, keep: int) -> int:
        """Health waits in memory first (caller holds the lock): it is published within
        moments while the broker is there, and writing it to disk only to delete it again
        cost more than the results themselves. Health still unsent after `spill_after_s`
        (no broker) is written to the database with the next one."""
        rowid = self._next_other()
        self._fresh.append((rowid, kind, body, self._clock()))
        mine = [r for r in self._fresh if r[1] == kind]
        if len(mine) > keep:  # only the latest `keep` wait, as on disk
            gone = {r[0] for r in mine[:len(mine) - keep]}
            self._fresh = [r for r in self._fresh if r[0] not in gone]
        if self._clock() - self._fresh[0][3] >= self.cfg.spill_after_s:
            rows, self._fresh = self._fresh, []
            try:
                for rid, k, b, _ in rows:
                    self._insert_other(k, b, keep, rid)
            except (sqlite3.OperationalError, OSError) as e:
                if not unwritable(e):
                    raise
                self._fresh = [r for r in rows if r[0] >= rid] + self._fresh
        self.changes += 1
        return rowid

    def _insert_other(self, kind: str, body: str, keep: int, rowid: int | None = None) -> int:
        rowid = rowid if rowid is not None else self._next_other()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("INSERT INTO other (id, kind, body) VALUES (?,?,?)",
                             (rowid, kind, body))
            self._db.execute("DELETE FROM other WHERE kind=? AND id NOT IN (SELECT id FROM "
                             "other WHERE kind=? ORDER BY id DESC LIMIT ?)", (kind, kind, keep))
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self.changes += 1
        return rowid

    def _last_other_db(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name='other'").fetchone()
        return row[0] if row else 0

    def others(self, limit: int) -> list[tuple[int, str, str]]:
        """Queued (id, kind, json) health/event messages, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT id, kind, body FROM other ORDER BY id LIMIT ?",
                                    (limit,)).fetchall()
            if self._held.removed:  # sent, but the disk refused the delete
                rows = [r for r in rows if r[0] not in self._held.removed]
            fresh = [(rid, k, b) for rid, k, b, _ in self._fresh]
            return sorted(rows + self._held.other_rows() + fresh)[:limit]

    def remove(self, ids: Sequence[int]) -> None:
        """The broker accepted these health/event messages."""
        events: list[dict] = []
        with self._lock:
            gone, fresh = set(ids), {r[0] for r in self._fresh}
            rest = self._held.drop_others(gone - fresh)
            self._fresh = [r for r in self._fresh if r[0] not in gone]
            try:
                self._db.executemany("DELETE FROM other WHERE id=?", [(i,) for i in rest])
            except sqlite3.OperationalError as e:
                if not unwritable(e):
                    raise
                self._disk_refused(e, events)
                self._held.removed |= rest
        for ev in events:
            self._on_event(ev)

    # -- command replay protection (sidecar file, see sidecar.py) ----------------------------

    def remember_command(self, command_id: str, expires: float) -> bool:
        """Record a command id until it expires; False when it was already seen (a replay).
        Kept in the sidecar file, so it survives the outbox being reset."""
        return self.sidecar.remember(command_id, expires)

    def bound_command_memory(self, keep_s: float) -> None:
        """Remember command ids at most `keep_s` ahead (runtime.wire.commands.memory_bound)."""
        self.sidecar.bound(keep_s)

    @property
    def commands_not_before(self) -> float:
        """Commands issued before this time are refused (the replay record was lost then)."""
        return self.sidecar.not_before

    # -- status --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Backlog figures for health: held results, bytes, evictions, next seq."""
        with self._lock:
            held, oldest = self._db.execute("SELECT COUNT(*), MIN(seq) FROM results").fetchone()
            if self._recent:
                held += len(self._recent)
                oldest = self._recent[0][0] if oldest is None else min(oldest, self._recent[0][0])
            memory = self._held.status()
            if self.memory_only:  # all of it in memory: the disk refuses, as health says
                memory.update(disk_full=True, held_in_memory=held, held_bytes=self._bytes)
                held = 0
        return {"results_held": held + memory["held_in_memory"], "bytes": self._bytes,
                "oldest_seq": oldest, "evicted_total": self.evicted_total,
                "log_damaged_bytes": self._log_damaged, **memory}

    def take_startup_event(self) -> dict | None:
        """The next event about what happened while opening (a corrupt file moved aside, then
        result-log lines lost to damage); None once all were taken."""
        if self._startup_event is not None:
            event, self._startup_event = self._startup_event, None
        else:
            event, self._damage_event = self._damage_event, None
        return event

    def close(self) -> int:
        """Checkpoint and close. What waits in memory while the disk refused writes gets one
        last try; where the disk still refuses, its loss is logged (results with their seqs).
        Returns how many results were lost so (0 when none waited or they were stored)."""
        lost = 0
        with self._lock:
            if self.memory_only:
                return self._close_memory()
            try:
                h = self._held
                if h.active:
                    h.next_try = 0.0  # due now, whenever the last try was
                    if not self._flush([]) and (h.results or h.other_rows()):  # (a
                        # recovery event would have no sender now)
                        lost = len(h.results)
                        first, last = (h.results[0][0], h.results[-1][0]) if h.results \
                            else (0, 0)
                        log.critical("outbox %s: closing while the disk refuses writes (%s): "
                                     "%d results held in memory are lost (seq %d-%d, never "
                                     "published), with %d health/event messages", self.path,
                                     h.error, len(h.results), first, last,
                                     len(h.other_rows()))
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except (sqlite3.OperationalError, OSError) as e:
                if not unwritable(e):
                    raise  # a full disk keeps the WAL, which the next open replays
            finally:
                self._db.close()
                self._log.close()
        return lost

    def _close_memory(self) -> int:
        """Close an outbox in memory (caller holds the lock): its unacked results are lost,
        said with their seqs and stream; returns how many."""
        n, first, last = self._db.execute("SELECT COUNT(*), MIN(seq), MAX(seq) FROM results"
                                          ).fetchone()
        if n:
            log.critical("outbox %s: closing an outbox kept in memory only (%s): %d results "
                         "the coordinator has not acked are lost (seq %d-%d of stream %s)",
                         self.path, self.memory_only, n, first, last, self.stream)
        self._db.close()
        return n
