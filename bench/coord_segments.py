"""What a segment-file result store would write on the coordinator, before anyone builds it.

Issue 42 asks the coordinator to write <= 3x the results' payload at 10 results/s; the SQLite
store writes ~10x (docs/telemetry.md, "Writes sized to the payload"): every 2 s ingest
transaction rewrites whole 4 KiB pages, and the WAL's copy into the file writes them again.
This bench simulates only the coordinator's writes of results, in real time, for variants of
the store side by side (one process each, all in the same window, so the host's moment and the
kernel's writeback are the same for all):

- a-rows: today's shape: the store's real schema (runtime/coordinator/sqlite_schema.py's
  migrations), each 2 s window one `BEGIN IMMEDIATE` transaction: the results rows
  (`INSERT ... ON CONFLICT DO NOTHING`, one statement a row as dialect.py), `pool_usage`,
  `result_counts` and the `streams` ack row, as ingest.py writes them;
- b-seg: the window's results appended to a per-day segment file (one write + fdatasync),
  then in SQLite an index row a result (device, stream, seq, t, segment, offset, length) with
  the ack row and the counters in one transaction;
- c-seg-mincount: as b, the counters kept in memory and written once a minute (with the
  window's transaction that crosses the minute);
- d-seg-fold: the segment alone each window (the durable record the ack is sent from); the
  index rows, the ack rows and the counters folded into SQLite once a minute;
- e1-c-truncate: c with SQLite's journal_mode=TRUNCATE (a rollback journal: no checkpoint);
- e2-c-5s: c with 5 s windows (acks 5 s late: half the device's ack_timeout_s);
- e3-d-pad: d with each window's append padded to a 4 KiB boundary (no page written twice);
- e4-d-chunk: d with one index row per stream and window (a chunk: seq_lo..seq_hi at
  offset, length) instead of one a result;
- e5-d-nosync: d without the per-window fdatasync: the segment synced at the fold only, which
  is the durability SQLite's `synchronous=NORMAL` (the coordinator's default) gives its WAL:
  a process crash loses nothing, a power cut loses what the kernel had not written back;
- e6-d-arrival: d with the index rows in arrival order (a rowid table, no key by device:
  a reader by device scans by time; duplicates kept out by the acks and the unfolded keys);
- e7-d-arrival-pad: e6 with e3's padding; e8-d-chunk-arrival-pad: the same with e4's chunk
  rows (in arrival order) for index;
- g1-rows-fold-trunc: what the device does (runtime/telemetry/outbox.py), on the coordinator:
  the window's messages appended to a log (no fsync: `synchronous=NORMAL`'s durability), the
  ack sent from it, today's rows (bodies and all) folded into SQLite once a minute with the
  acks and counters, under a rollback journal (TRUNCATE: a fold's new pages are written once,
  not to the WAL and again by the checkpoint); g2-rows-fold-wal: the same in WAL mode;
  g3-rows-fold-trunc-full: g1 with the log synced (padded) each window (`fsync = "full"`);
  g4-rows-fold120-trunc: g1 folded every 2 minutes (measure it in a `--window-s` of 120 or
  more, or it holds no fold);
- h1-rows-memfold-trunc: g1 without the log: the window's results held in memory and acked
  only once folded (a crash loses nothing acked: the device still holds and re-sends them;
  acks up to a minute late); h2-arrival-memfold-trunc: h1 with the rows in arrival order (a
  rowid table, bodies and all) and a narrow unique index (device, stream, seq);
  h3-arrival-memfold-wal: h2 in WAL mode;
- f0-floor: the segment records appended a window without fsync, nothing else (disk_writes.py's
  floor); f1-seg-only: the segment with its fdatasync, nothing else.

SQLite as the coordinator opens it (dialect.py): WAL, synchronous=NORMAL, the default 4 KiB
page and autocheckpoint (1000 pages). Each store starts with `--existing` results in it (the
docs' benches use 40,000), a checkpoint (PASSIVE, not counted) opens the window, one closes it
(counted, as bench/disk_writes.py counts the WAL's copy into the file). Bytes written are
`write_bytes` of /proc/self/io (counted when a page turns dirty: a page rewritten before
writeback is counted once, one cleaned by fsync or writeback and dirtied again twice), read
around each call so the segment's and SQLite's shares are told apart. The ext4 journal
(jbd2, a kernel thread) is in no process's count, here or in bench/disk_writes.py.

Two fleets: one device at 10 results/s, ten devices at 1/s each (ten streams, the same
10 results/s). Health, events and the fleet view row are left out of every variant (they add
~1.5x to today's shape: docs/telemetry.md); only the results' path is compared.

Usage: python bench/coord_segments.py [--dirs /dev/shm,/var/tmp,ext4:/dev/shm] [--rounds 3]
       [--window-s 60] [--payload 250] [--existing 40000] [--variants a-rows,b-seg,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.coordinator.sqlite_schema import SQLITE_MIGRATIONS

FLEETS = {"1x10": (1, 10.0), "10x1": (10, 1.0)}  # name: (devices, results/s each)
FOLD_S = 60.0  # "once a minute"
INDEX_SQL = ("CREATE TABLE IF NOT EXISTS result_index (device TEXT NOT NULL, stream TEXT NOT "
             "NULL, seq INTEGER NOT NULL, t REAL NOT NULL, segment INTEGER NOT NULL, "
             "off INTEGER NOT NULL, len INTEGER NOT NULL, PRIMARY KEY (device, stream, seq)) "
             "WITHOUT ROWID")
# e6: in arrival order (a rowid table, no key by device): a fold appends at one place
ARRIVAL_SQL = ("CREATE TABLE IF NOT EXISTS result_arrival (device TEXT NOT NULL, stream TEXT "
               "NOT NULL, seq INTEGER NOT NULL, t REAL NOT NULL, segment INTEGER NOT NULL, "
               "off INTEGER NOT NULL, len INTEGER NOT NULL)")
CHUNK_ARRIVAL_SQL = ("CREATE TABLE IF NOT EXISTS chunk_arrival (device TEXT NOT NULL, stream "
                     "TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL, t REAL NOT NULL, "
                     "segment INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL)")
# h2: today's rows in arrival order (a rowid table: a fold appends at one place) and a
# narrow unique index by device for the readers and the re-delivery check
RESULTS_ARRIVAL_SQL = (
    "CREATE TABLE IF NOT EXISTS results_arrival (device TEXT NOT NULL, stream TEXT NOT NULL, "
    "seq INTEGER NOT NULL, boot TEXT NOT NULL, t REAL NOT NULL, received REAL NOT NULL, "
    "body TEXT NOT NULL); CREATE UNIQUE INDEX IF NOT EXISTS results_arrival_key ON "
    "results_arrival (device, stream, seq)")
CHUNK_SQL = ("CREATE TABLE IF NOT EXISTS result_chunks (device TEXT NOT NULL, stream TEXT NOT "
             "NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL, t REAL NOT NULL, segment INTEGER "
             "NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL, PRIMARY KEY (device, "
             "stream, lo)) WITHOUT ROWID")
STREAMS_SQL = ("INSERT INTO streams (device, stream, acked, lo) VALUES (?,?,?,?) "
               "ON CONFLICT(device, stream) DO UPDATE SET acked = excluded.acked, "
               "lo = excluded.lo")
COUNTS_SQL = ("INSERT INTO result_counts VALUES (?,?) ON CONFLICT(device) "
              "DO UPDATE SET n = result_counts.n + excluded.n")
POOL_SQL = ("INSERT INTO pool_usage VALUES (?,?,?) ON CONFLICT(device, pool) "
            "DO UPDATE SET bytes = pool_usage.bytes + excluded.bytes")


@dataclass(frozen=True)
class Variant:
    """How one store variant writes a window's results."""

    rows: bool = False  # results rows in SQLite (today); else a segment file
    sqlite: bool = True  # any SQLite at all (the floors have none)
    # "window" | "fold" | "chunk" (folded, a row per stream and window) | "arrival" (folded,
    # into a rowid table in arrival order: no index by device) | "chunk-arrival" (both) |
    # "none" (g*: the rows are the store)
    index: str = "window"
    ack: str = "window"  # the streams row: "window" | "fold"
    counters: str = "window"  # result_counts + pool_usage: "window" | "fold"
    journal: str = "wal"
    commit_s: float = 2.0
    sync: str = "window"  # the segment's fdatasync: "window" | "fold" | "never"
    pad: bool = False  # each window's append padded to a 4 KiB boundary
    rows_at: str = "window"  # with rows: "window" (today) | "fold" (a log in front: g*)
    fold_s: float = FOLD_S
    log: bool = True  # rows folded: a log in front (g*), else held in memory unacked (h*)
    table: str = "results"  # rows: "results" (today's, keyed by device) | "results_arrival"


VARIANTS = {
    "a-rows": Variant(rows=True),
    "b-seg": Variant(),
    "c-seg-mincount": Variant(counters="fold"),
    "d-seg-fold": Variant(index="fold", ack="fold", counters="fold"),
    "e1-c-truncate": Variant(counters="fold", journal="truncate"),
    "e2-c-5s": Variant(counters="fold", commit_s=5.0),
    "e3-d-pad": Variant(index="fold", ack="fold", counters="fold", pad=True),
    "e4-d-chunk": Variant(index="chunk", ack="fold", counters="fold"),
    "e6-d-arrival": Variant(index="arrival", ack="fold", counters="fold"),
    "e7-d-arrival-pad": Variant(index="arrival", ack="fold", counters="fold", pad=True),
    "e8-d-chunk-arrival-pad": Variant(index="chunk-arrival", ack="fold", counters="fold",
                                      pad=True),
    "e5-d-nosync": Variant(index="fold", ack="fold", counters="fold", sync="fold"),
    "g1-rows-fold-trunc": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                  counters="fold", journal="truncate", sync="never"),
    "g2-rows-fold-wal": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                counters="fold", sync="never"),
    "g3-rows-fold-trunc-full": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                       counters="fold", journal="truncate", pad=True),
    "g4-rows-fold120-trunc": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                     counters="fold", journal="truncate", sync="never",
                                     fold_s=120.0),
    "h1-rows-memfold-trunc": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                     counters="fold", journal="truncate", sync="never",
                                     log=False),
    "h2-arrival-memfold-trunc": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                        counters="fold", journal="truncate", sync="never",
                                        log=False, table="results_arrival"),
    "h3-arrival-memfold-wal": Variant(rows=True, rows_at="fold", index="none", ack="fold",
                                      counters="fold", sync="never", log=False,
                                      table="results_arrival"),
    "f0-floor": Variant(sqlite=False, sync="never"),
    "f1-seg-only": Variant(sqlite=False),
}


def written() -> int:
    """This process's `write_bytes` so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no write_bytes")


def body(payload: int, seq: int) -> str:
    """A result's JSON of `payload` bytes (the coordinator stores it as text)."""
    head = json.dumps({"label": "ok", "score": 0.98765, "rung": "fp32-r60", "latency_ms": 1.234,
                       "frame": f"cam1/{seq:09d}", "model": "inspection@2", "note": ""},
                      separators=(",", ":"))
    return head[:-2] + "x" * max(0, payload - len(head)) + '"}'


class Sim:
    """One variant's store in `work`, fed one fleet's results window by window."""

    def __init__(self, v: Variant, fleet: str, work: Path, payload: int, existing: int):
        self.v, self.work, self.payload = v, work, payload
        n_dev, self.rate = FLEETS[fleet]
        self.devices = [f"dev{i:02d}" for i in range(n_dev)]
        self.seq = dict.fromkeys(self.devices, 0)
        self.boot = "b1"
        self.seg_fd: int | None = None
        self.seg_day = -1
        self.seg_off = 0
        self.pending_index: list[tuple] = []  # not yet in SQLite (fold variants)
        self.pending_chunks: list[tuple] = []
        self.pending_counts: Counter = Counter()
        self.pending_bytes: Counter = Counter()
        self.pending_acks: dict[str, int] = {}
        self.pending_rows: list[tuple] = []
        self.sqlite_b = self.segment_b = 0
        self.db: sqlite3.Connection | None = None
        if v.sqlite:
            self.db = sqlite3.connect(work / "coord.db", isolation_level=None)
            if v.journal == "wal":
                self.db.execute("PRAGMA journal_mode=WAL")
            else:
                self.db.execute(f"PRAGMA journal_mode={v.journal.upper()}")
            self.db.execute("PRAGMA synchronous=NORMAL")
            for _, script in SQLITE_MIGRATIONS:  # the store's real schema, every version
                self.db.executescript(script)
            self.db.execute(INDEX_SQL)
            self.db.execute(CHUNK_SQL)
            self.db.execute(ARRIVAL_SQL)
            self.db.execute(CHUNK_ARRIVAL_SQL)
            self.db.executescript(RESULTS_ARRIVAL_SQL)
        self._prefill(existing)

    # -- the writes ---------------------------------------------------------------------------

    def _segment(self, records: list[bytes], t: float) -> list[tuple[int, int, int]]:
        """Append records to today's segment; (segment, offset, length) of each."""
        day = int(t // 86400)
        if day != self.seg_day:
            if self.seg_fd is not None:
                os.close(self.seg_fd)
            path = self.work / f"results-{day}.seg"
            self.seg_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.seg_day, self.seg_off = day, os.fstat(self.seg_fd).st_size
        where, off = [], self.seg_off
        for r in records:
            where.append((day, off, len(r)))
            off += len(r)
        data = b"".join(records)
        if self.v.pad and (off % 4096):  # a filler record to the page's end
            data += b"\n" * (4096 - off % 4096)
        os.write(self.seg_fd, data)
        self.seg_off += len(data)
        if self.v.sync == "window":
            os.fdatasync(self.seg_fd)
        return where

    def _make(self, t: float, per_device: int) -> list[tuple]:
        rows = []
        for d in self.devices:
            for _ in range(per_device):
                self.seq[d] += 1
                rows.append((d, "s0", self.seq[d], self.boot, t, t, body(self.payload,
                                                                            self.seq[d])))
        return rows

    @staticmethod
    def _record(r: tuple) -> bytes:
        d, st, seq, boot, t, rec, b = r
        return f"{d}\t{st}\t{seq}\t{boot}\t{t:.3f}\t{rec:.3f}\t{b}\n".encode()

    def _charges(self, rows: list[tuple]) -> tuple[Counter, Counter]:
        n, size = Counter(), Counter()
        for d, st, _, boot, _, _, b in rows:  # quotas.RESULT_BYTES_SQL
            n[d] += 1
            size[d] += len(d) + len(st) + len(boot) + len(b) + 24
        return n, size

    def _write_counters(self, db: sqlite3.Connection, n: Counter, size: Counter) -> None:
        db.executemany(POOL_SQL, sorted((d, "results", b) for d, b in size.items()))
        db.executemany(COUNTS_SQL, sorted(n.items()))

    def window(self, t: float, per_device: int, fold: bool) -> int:
        """Store one window's results (and fold when `fold`); the results stored."""
        v = self.v
        rows = self._make(t, per_device)
        n, size = self._charges(rows)
        acks = {d: self.seq[d] for d in self.devices}
        w0 = written()
        where = [] if v.rows and (v.rows_at == "window" or not v.log) else self._segment(
            [self._record(r) for r in rows], t)
        w1 = written()
        self.segment_b += w1 - w0
        if not v.sqlite:
            return len(rows)
        db = self.db
        assert db is not None
        if v.rows and v.rows_at == "fold":
            self.pending_rows += rows
        idx = [] if v.rows else [(r[0], r[1], r[2], r[4], *w)
                                 for r, w in zip(rows, where, strict=True)]
        if v.index in ("chunk", "chunk-arrival"):
            for d in self.devices:  # this window's records of one stream are contiguous
                mine = [(r, w) for r, w in zip(rows, where, strict=True) if r[0] == d]
                lo, hi = mine[0][0][2], mine[-1][0][2]
                first, last = mine[0][1], mine[-1][1]
                self.pending_chunks.append((d, "s0", lo, hi, t, first[0], first[1],
                                            last[1] + last[2] - first[1]))
        elif v.index in ("fold", "arrival"):
            self.pending_index += idx
        if v.counters == "fold":
            self.pending_counts.update(n)
            self.pending_bytes.update(size)
        if v.ack == "fold":
            self.pending_acks.update(acks)
        now_any = ((v.rows and v.rows_at == "window") or v.index == "window"
                   or v.ack == "window" or v.counters == "window")
        if now_any or fold:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO devices (device) VALUES (?) ON CONFLICT(device) "
                           "DO NOTHING", [(d,) for d in self.devices])
            if v.rows and v.rows_at == "window":
                for r in rows:  # one statement a row, as dialect.insert_results
                    db.execute("INSERT INTO results VALUES (?,?,?,?,?,?,?) ON CONFLICT "
                               "DO NOTHING", r)
            elif v.index == "window":
                db.executemany("INSERT INTO result_index VALUES (?,?,?,?,?,?,?) ON CONFLICT "
                               "DO NOTHING", idx)
            if v.counters == "window":
                self._write_counters(db, n, size)
            if v.ack == "window":
                db.executemany(STREAMS_SQL, [(d, "s0", a, 0) for d, a in acks.items()])
            if fold:
                self._fold(db)
            db.execute("COMMIT")
        self.sqlite_b += written() - w1
        return len(rows)

    def _fold(self, db: sqlite3.Connection) -> None:
        """What waits for the minute: index rows, chunks, counters, acks (in `db`'s open
        transaction), the segment synced first when windows do not sync it."""
        if self.v.sync == "fold" and self.seg_fd is not None:
            w = written()
            os.fdatasync(self.seg_fd)
            self.segment_b += written() - w
        for r in self.pending_rows:
            db.execute(f"INSERT INTO {self.v.table} VALUES (?,?,?,?,?,?,?) ON CONFLICT "
                       "DO NOTHING", r)
        self.pending_rows = []
        if self.pending_index and self.v.index == "arrival":
            db.executemany("INSERT INTO result_arrival VALUES (?,?,?,?,?,?,?)",
                           self.pending_index)
        elif self.pending_index:
            db.executemany("INSERT INTO result_index VALUES (?,?,?,?,?,?,?) ON CONFLICT "
                           "DO NOTHING", self.pending_index)
        if self.pending_chunks and self.v.index == "chunk-arrival":
            db.executemany("INSERT INTO chunk_arrival VALUES (?,?,?,?,?,?,?,?)",
                           self.pending_chunks)
        elif self.pending_chunks:
            db.executemany("INSERT INTO result_chunks VALUES (?,?,?,?,?,?,?,?) ON CONFLICT "
                           "DO NOTHING", self.pending_chunks)
        if self.pending_counts:
            self._write_counters(db, self.pending_counts, self.pending_bytes)
        if self.pending_acks:
            db.executemany(STREAMS_SQL, [(d, "s0", a, 0) for d, a in self.pending_acks.items()])
        self.pending_index, self.pending_chunks = [], []
        self.pending_counts, self.pending_bytes = Counter(), Counter()
        self.pending_acks = {}

    def checkpoint(self) -> int:
        """A PASSIVE checkpoint (WAL only); the bytes it wrote."""
        if self.db is None or self.v.journal != "wal":
            return 0
        w = written()
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return written() - w

    def _prefill(self, existing: int) -> None:
        """`existing` results already stored, in large transactions, then a checkpoint."""
        t = time.time() - 86400 * 0.5
        per = max(1, existing // len(self.devices) // 1000)
        done = 0
        while done < existing:
            self.window(t, per, fold=True)
            t += 1.0
            done += per * len(self.devices)
        if self.db is not None and self.v.journal == "wal":
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.sync()


def child(variant: str, fleet: str, work: Path, window_s: float, payload: int,
          existing: int) -> None:
    """One store variant: prefill, say "ready", wait for "go" on stdin, run the window, print
    the figures as JSON."""
    v = VARIANTS[variant]
    sim = Sim(v, fleet, work, payload, existing)
    sim.sqlite_b = sim.segment_b = 0
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    # the window's WAL starts empty of what came before it (the prefill's rows)
    sim.checkpoint()
    sim.sqlite_b = sim.segment_b = 0
    w0 = written()
    results, acc, k = 0, 0.0, 0
    last_fold = start
    per_window = sim.rate * v.commit_s
    while True:
        k += 1
        due = start + k * v.commit_s
        if due > start + window_s + 1e-6:
            break
        time.sleep(max(0.0, due - time.monotonic()))
        acc += per_window
        take = int(acc)
        acc -= take
        fold = due - last_fold >= v.fold_s - 1e-6
        if fold:
            last_fold = due
        results += sim.window(time.time(), take, fold)
    ckpt = sim.checkpoint()
    total = written() - w0
    print(json.dumps({"variant": variant, "fleet": fleet, "results": results,
                      "payload": payload, "written": total, "segment": sim.segment_b,
                      "sqlite": sim.sqlite_b + ckpt, "checkpoint": ckpt}), flush=True)


def run_round(base: Path, variants: list[str], window_s: float, payload: int, existing: int,
              reverse: bool) -> list[dict]:
    """Every (variant, fleet) as a child in the same window; their figures."""
    procs = []
    order = [(v, f) for v in variants for f in FLEETS]
    if reverse:
        order.reverse()
    with tempfile.TemporaryDirectory(prefix="edgerun-seg-", dir=base) as tmp:
        for v, f in order:
            work = Path(tmp) / f"{v}-{f}"
            work.mkdir()
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--child", v, f, str(work), str(window_s),
                 str(payload), str(existing)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        try:
            for p in procs:
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError(f"a child failed to start: {line!r}")
            for p in procs:  # all start together
                p.stdin.write("go\n")
                p.stdin.flush()
            out = []
            for p in procs:
                line = p.stdout.readline()
                if p.wait(120) != 0 or not line:
                    raise RuntimeError("a child failed")
                out.append(json.loads(line))
        finally:
            for p in procs:  # none outlives its directory
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return out


def spread(xs: list[float]) -> str:
    """Median (min-max) of a few values."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def fs_type(path: Path) -> str:
    """The file system `path` is on (findmnt)."""
    r = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)],
                       capture_output=True, text=True, check=False)
    return (r.stdout.split() or ["?"])[0]


def counts_writes(path: Path) -> int:
    """The `write_bytes` 64 KiB written and fsynced under `path` add to this process's count
    (0 on a tmpfs: its pages are never written back, so never counted)."""
    with tempfile.NamedTemporaryFile(dir=path) as f:
        w = written()
        f.write(b"x" * 65536)
        f.flush()
        os.fsync(f.fileno())
        return written() - w


@contextlib.contextmanager
def place(spec: str) -> Iterator[Path]:
    """A directory for the stores: `spec` itself, or with `ext4:` in front a fresh ext4
    image loop-mounted in a directory under it (as root; tests/telemetry/test_disk_full.py's
    Ext4), unmounted after."""
    if not spec.startswith("ext4:"):
        yield Path(spec)
        return
    mnt = Path(tempfile.mkdtemp(prefix="edgerun-seg-ext4-", dir=spec[5:]))
    img = mnt.with_suffix(".img")
    try:
        with img.open("wb") as f:
            f.truncate(2048 << 20)
        for cmd in (["mkfs.ext4", "-q", "-F", str(img)], ["mount", "-o", "loop", str(img),
                                                           str(mnt)]):
            subprocess.run(cmd, check=True, capture_output=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        img.unlink(missing_ok=True)
        mnt.rmdir()


def main() -> None:
    """Run the rounds over each directory and print the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        v, f, work, window_s, payload, existing = sys.argv[2:8]
        child(v, f, Path(work), float(window_s), int(payload), int(existing))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dirs", default="/dev/shm,/var/tmp,ext4:/dev/shm",
                    help="where the stores go, each in turn (a tmpfs, a disk's file system; "
                         "ext4:DIR a fresh ext4 image in DIR, loop-mounted)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--payload", type=int, default=250, help="bytes of a result's JSON")
    ap.add_argument("--existing", type=int, default=40000)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    variants = a.variants.split(",")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load {Path('/proc/loadavg').read_text().strip()}"
          f"; window {a.window_s:.0f} s, payload {a.payload} B, {a.existing} results stored "
          "before", flush=True)
    table: dict[tuple[str, str, str], list[dict]] = {}
    dirs = []
    for d in a.dirs.split(","):
        with place(d) as base:
            if n := counts_writes(base):
                dirs.append(d)
            print(f"{d} ({fs_type(base)}): 64 KiB written and fsynced count {n} B"
                  + ("" if n else ": nothing to measure there, left out"), flush=True)
    for r in range(a.rounds):
        reverse = r % 2 == 1  # alternate orders: the children's start, the directories'
        for d in reversed(dirs) if reverse else dirs:
            with place(d) as base:
                fs = fs_type(base)
                got = run_round(base, variants, a.window_s, a.payload, a.existing, reverse)
            for g in got:
                table.setdefault((f"{d} ({fs})", g["variant"], g["fleet"]), []).append(g)
            print(f"  round {r + 1} {d} ({fs}) done, load "
                  f"{Path('/proc/loadavg').read_text().strip()}", flush=True)
    print("\nbytes written per result / payload: median (min-max) over rounds")
    print(f"{'dir':26s} {'variant':15s} {'fleet':5s} {'total':>18s} {'segment':>18s} "
          f"{'sqlite':>18s} {'of it ckpt':>18s}")
    for (d, v, f), gs in table.items():
        def ratio(key: str, gs: list[dict] = gs) -> str:
            return spread([g[key] / (g["results"] * g["payload"]) for g in gs])
        print(f"{d:26s} {v:15s} {f:5s} {ratio('written'):>18s} {ratio('segment'):>18s} "
              f"{ratio('sqlite'):>18s} {ratio('checkpoint'):>18s}")
    print(f"load at the end {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
