"""Bytes written to disk per result: the device, the coordinator, and the floor, side by side.

One run on this machine: a real Mosquitto, a real coordinator (`edgerun coordinator`, its store
SQLite or PostgreSQL) and a real `edgerun serve` (the bundled model on the synthetic conveyor at
1, 10 and 100 results/s, no governor). For each rate, after the daemon is ready and has settled,
a window of `--window-s` seconds is measured:

- device: the daemon process's `write_bytes` (`/proc/PID/io`: bytes it caused to be sent to the
  storage layer, counted when a page is dirtied; its log file included) over the results the
  coordinator stored in the window;
- coordinator: the coordinator process's `write_bytes`; for SQLite plus the copy of the
  window's WAL into the database file, done at the window's edges by a child process
  (`PRAGMA wal_checkpoint(PASSIVE)` at its start, not counted, and at its end, counted: the
  coordinator's own checkpoints come every ~1000 WAL pages, ~2.5 min at 10/s, so a short
  window held one or none by chance; 1.7x a result's payload in a 300 s run at 10/s,
  2026-12-07); for PostgreSQL the server's own (the postmaster, whose count includes the
  children it reaped, plus every live child: its checkpoints, autovacuum and statistics
  too) and the WAL it generated (`pg_stat_wal`, the whole cluster's; with `--wal-detail`
  also the share of the coordinator's own database and the WAL by relation, from
  `pg_waldump`: a fresh cluster's autovacuum analyses and freezes template1's and
  postgres's catalogs once, in whatever window it falls, 0.4-1.0x a result's payload in a
  120 s window, 2026-12-07);
- floor: in the same window a child process appends each result's payload (the mean size of
  the JSON the coordinator stored) to one file at the same rate, without fsync: the least any
  durable store of these results can write, under the same page accounting.

Bytes per result are printed with the ratio to the payload. The host may be shared: the
floor runs in the same window so its accounting sees the same moment; repeat with `--rounds`
for the spread.

Usage: python bench/disk_writes.py [--rates 1,10,100] [--window-s 30] [--store sqlite,postgresql]
       [--fsync normal|full] [--rounds 1] [--ingest-window-s S] [--ingest-window-results N]
       [--wal-detail]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the config writer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.daemon_toml import daemon_toml
from support.fleet import CoordinatorProc

from models import bundled
from runtime.telemetry.outbox import last_seq
from runtime.wire.broker import Mosquitto

FLOOR = r"""
import sys, time
size, rate, path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
line = b"x" * (size - 1) + b"\n"
with open(path, "ab", buffering=0) as f:
    t = time.monotonic()
    while True:
        f.write(line)
        t += 1 / rate
        time.sleep(max(0.0, t - time.monotonic()))
"""


CHECKPOINT = r"""
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
db.close()
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(busy, frames, copied, io["write_bytes"])
"""


def checkpoint(db: Path) -> int:
    """Copy a SQLite store's WAL into its file now, from a child process (PASSIVE: the
    coordinator is never held up; a frame a reader still needs is copied by the next one):
    the bytes that child wrote."""
    out = subprocess.run([sys.executable, "-c", CHECKPOINT, str(db)], capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    return int(out[3])


def write_bytes(pid: int) -> int:
    """`write_bytes` of one process (its exited threads and reaped children included)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/io has no write_bytes")


def tree_write_bytes(pid: int) -> int:
    """`write_bytes` of a process and every live descendant (a PostgreSQL server)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += write_bytes(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # exited meanwhile: its parent's count holds it
            continue
    return total


def produced(state: Path) -> int:
    """Results the daemon has made, whether or not the coordinator has stored them yet."""
    return last_seq(state / "outbox.db")


def wal_bytes(url: str | None) -> tuple[int, int, int, str]:
    """PostgreSQL's WAL bytes, full page images in it, checkpoints done (since its
    statistics were reset) and the current WAL position (zeros without a URL): a
    checkpoint makes the next change of every page log the whole page, which a short window
    may hold or miss."""
    if url is None:
        return 0, 0, 0, ""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        wal, fpi = conn.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
        ckpt = conn.execute("SELECT checkpoints_timed + checkpoints_req "
                            "FROM pg_stat_bgwriter").fetchone()[0]
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        return int(wal), int(fpi), int(ckpt), lsn


def wal_by_relation(pg: Any, url: str, start: str, end: str, stored: int, payload: float,
                    top: int = 12) -> tuple[int, list[str]]:
    """The WAL between two LSNs (pg_waldump): the bytes of records of the coordinator's
    database or of none (commits, checkpoints), and lines of the largest by relation and
    record kind per stored result. A relation of another database shows as its OIDs."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        db = str(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()"
                              ).fetchone()[0])
        names = {str(f): n for f, n in conn.execute(
            "SELECT pg_relation_filenode(oid), relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL")}
    cmd = [str(pg.bindir / "pg_waldump"), "-p", str(pg.dir / "data" / "pg_wal"), "-s", start,
           "-e", end]
    if pg.as_user:  # the cluster's files are the server user's
        cmd = ["runuser", "-u", pg.as_user, "--", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:  # a segment recycled, no pg_waldump: else an empty table, no word
        raise RuntimeError(f"pg_waldump {start}..{end} failed: {r.stderr.strip()[-500:]}")
    size: Counter = Counter()
    fpis: Counter = Counter()
    own = 0
    for line in r.stdout.splitlines():
        m = re.search(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+).*?desc: (\w+)", line)
        if not m:
            continue
        rel = re.search(r"rel \d+/(\d+)/(\d+)", line)
        name = ((names.get(rel.group(2), rel.group(2)) if rel.group(1) == db
                 else f"db {rel.group(1)} rel {rel.group(2)}") if rel else "-")
        key = f"{name} {m.group(1)}/{m.group(3)}"
        size[key] += int(m.group(2))
        fpis[key] += " FPW" in line
        own += int(m.group(2)) if rel is None or rel.group(1) == db else 0
    return own, [f"    {v / stored:7.1f} B {v / stored / payload:5.2f}x  {fpis[k]:3d} FPI  {k}"
                 for k, v in size.most_common(top)]


def postmaster_pid(data_dir: Path) -> int:
    """The PostgreSQL server's pid from its data directory."""
    return int((data_dir / "postmaster.pid").read_text().split()[0])


@dataclass
class Window:
    """One measured window at one rate."""

    rate: float
    results: int  # made by the device in the window
    stored: int  # stored by the coordinator in the window
    payload: float
    device: float
    coordinator: float
    server: float | None  # PostgreSQL's own, per result
    wal: float | None  # PostgreSQL's WAL bytes (pg_stat_wal), per result
    floor: float
    fpi: int = 0  # full page images in that WAL (the window's)
    checkpoints: int = 0  # PostgreSQL checkpoints done in the window
    wal_own: float | None = None  # of that, the coordinator's database's (--wal-detail)
    detail: list[str] = field(default_factory=list)  # the WAL by relation (--wal-detail)
    checkpoint: float | None = None  # SQLite: of `coordinator`, the window's WAL copied


def daemon_config(work: Path, port: int, rate: float, fsync: str) -> str:
    """The daemon: the bundled model on the synthetic conveyor at `rate`, publishing to the
    broker as device `disk` of fleet "bench", no governor (the rate stays the rate)."""
    return daemon_toml(work / "state", {
        "model": {"path": bundled()},
        "constraints": {"latency_ms": 100.0, "accuracy_floor": 0.95},
        "profiler": {"time_budget_s": 0.1, "cache_dir": work / "profiles"},
        "source": {"kind": "synthetic", "rate_hz": rate},
        "governor": {"policy": "off"},
        # a shared, loaded host makes the daemon re-profile (p95 past slow_factor x the
        # profile's), which rewrites the profile cache: an event, not a cost per result
        # (docs/telemetry.md, "Disk writes", counts it on its own)
        "daemon": {"slow_factor": 1000.0},
        "telemetry": {"fleet": "bench", "device": "disk"},
        "telemetry.broker": {"host": "127.0.0.1", "port": port},
        "telemetry.outbox": {"fsync": fsync, "spill_after_s": None},  # the product default
    })


def stored(coord: CoordinatorProc) -> int:
    """Results the coordinator has stored from the device."""
    rows = coord.api("/api/v1/fleet")
    rows = rows.get("devices", rows) if isinstance(rows, dict) else rows
    for r in rows:
        if r.get("device") == "disk" or r.get("id") == "disk":
            return int(r.get("results_stored") or 0)
    return 0


def mean_payload(coord: CoordinatorProc) -> float:
    """Mean size in bytes of the JSON of the device's newest stored results."""
    rows = coord.api("/api/v1/devices/disk/results?limit=10000")["results"]
    sizes = [len(json.dumps(r, separators=(",", ":"))) for r in rows[-200:]]
    return statistics.mean(sizes) if sizes else 0.0


def wait_for(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def settled(proc: subprocess.Popen, coord: CoordinatorProc, logfile: Path) -> None:
    """Wait until the daemon `proc` (logging to `logfile`) has results stored and its start's
    profiling closed; RuntimeError when it exited meanwhile."""
    start = stored(coord)
    wait_for(lambda: stored(coord) > start + 3 or proc.poll() is not None, 600,
             "the coordinator stored no result from the daemon")
    # past the start: the background refinement writes the profile cache until its
    # schedule closes (`N variants of M profiled in`), once per model and machine
    wait_for(lambda: " profiled in " in logfile.read_text(errors="replace")
             or proc.poll() is not None, 600, "the daemon's profiling never closed")
    if proc.poll() is not None:
        raise RuntimeError(f"the daemon exited: see {logfile}")


def start_floor(payload: float, rate: float, path: Path) -> subprocess.Popen:
    """The floor: a process appending `payload` bytes a line to `path` at `rate`, started."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOR, str(round(payload)), str(rate),
                             str(path)])
    wait_for(path.exists, 60, "the floor writer never started")
    return proc


def measure_rate(work: Path, broker: Mosquitto, coord: CoordinatorProc, pg: Any | None,
                 rate: float, window_s: float, fsync: str, pg_url: str | None = None,
                 wal_detail: bool = False) -> Window:
    """Start a daemon at `rate`, let it settle, measure one window, stop it."""
    cfg = work / f"serve-{rate:g}.toml"
    cfg.write_text(daemon_config(work, broker.port, rate, fsync))
    log = (work / f"serve-{rate:g}.log").open("a")
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT)
    floor_proc = None
    try:
        settled(proc, coord, work / f"serve-{rate:g}.log")
        time.sleep(5.0)
        payload = mean_payload(coord)
        floor_file = work / "floor.log"
        floor_proc = start_floor(payload, rate, floor_file)
        n0, d0, c0 = stored(coord), write_bytes(proc.pid), write_bytes(coord.proc.pid)
        m0 = produced(work / "state")
        pg_dir = pg.dir / "data" if pg else None
        s0 = tree_write_bytes(postmaster_pid(pg_dir)) if pg_dir else 0
        f0, l0 = write_bytes(floor_proc.pid), floor_file.stat().st_size
        w0 = wal_bytes(pg_url)
        sqlite_db = None if pg else work / "coord.db"  # run_store's
        if sqlite_db:  # the window's WAL starts empty of what came before it
            checkpoint(sqlite_db)
            c0 = write_bytes(coord.proc.pid)
        time.sleep(window_s)
        n1, d1, c1 = stored(coord), write_bytes(proc.pid), write_bytes(coord.proc.pid)
        m1 = produced(work / "state")
        s1 = tree_write_bytes(postmaster_pid(pg_dir)) if pg_dir else 0
        f1, l1 = write_bytes(floor_proc.pid), floor_file.stat().st_size
        w1 = wal_bytes(pg_url)
        ckpt = checkpoint(sqlite_db) if sqlite_db else 0  # what the window left in the WAL
        floor_lines = (l1 - l0) / max(1, round(payload))
        n, m = n1 - n0, m1 - m0
        if n <= 0 or m <= 0:
            raise RuntimeError(f"no result made or stored in the {window_s:.0f} s window")
        own, detail = (wal_by_relation(pg, pg_url, w0[3], w1[3], n, payload)
                       if wal_detail and pg and pg_url else (None, []))
        # the device's bytes over the results it made, the coordinator's over those it stored
        # (a coordinator behind the device stores fewer in the window than were made)
        return Window(rate, m, n, payload, (d1 - d0) / m, (c1 - c0 + ckpt) / n,
                      (s1 - s0) / n if pg_dir else None,
                      (w1[0] - w0[0]) / n if pg_url else None,
                      (f1 - f0) / max(1.0, floor_lines), w1[1] - w0[1], w1[2] - w0[2],
                      own / n if own is not None else None, detail,
                      ckpt / n if sqlite_db else None)
    finally:
        if floor_proc:
            floor_proc.kill()
            floor_proc.wait()
            (work / "floor.log").unlink(missing_ok=True)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        log.close()


def run_store(kind: str, rates: list[float], window_s: float, fsync: str,
              ingest_window_s: float | None, window_results: int | None = None,
              wal_detail: bool = False) -> list[Window]:
    """Broker + coordinator on one store kind; a daemon per rate, in turn."""
    out: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="edgerun-disk-") as tmp:
        work = Path(tmp)
        broker = Mosquitto(work, auth=False).start()
        pg = None
        try:
            base, *settings = kind.split("+")
            if base == "postgresql":
                from runtime.coordinator.pgserver import TempPostgres

                # a production server's durability: the defaults of TempPostgres trade it away;
                # `postgresql+KEY=VALUE+...` adds server settings (e.g. wal_compression=lz4)
                pg = TempPostgres({"fsync": "on", "synchronous_commit": "on",
                                   "full_page_writes": "on",
                                   **dict(kv.split("=", 1) for kv in settings)}).start()
                store = pg.create_database("bench")
            else:
                store = str(work / "coord.db")
            extra = ({} if ingest_window_s is None
                     else {"ingest_window_s": repr(ingest_window_s)})
            if window_results is not None:
                extra["ingest_window_results"] = str(window_results)
            coord = CoordinatorProc(work, "coord", broker.port, store, **extra)
            try:
                coord.start()
            except TimeoutError:
                coord.term()
                raise RuntimeError("the coordinator did not start: "
                                   + (work / "coord.log").read_text()[-2000:]) from None
            try:
                for rate in rates:
                    w = measure_rate(work, broker, coord, pg, rate, window_s, fsync,
                                     store if pg else None, wal_detail)
                    out.append(w)
                    print(f"  {kind:10s} {rate:5g}/s: {w.results} results made, {w.stored} "
                          f"stored, payload "
                          f"{w.payload:.0f} B; device {w.device:.0f} B/result, coordinator "
                          f"{w.coordinator:.0f}"
                          + (f" (of it {w.checkpoint:.0f} its WAL's copy into the file)"
                             if w.checkpoint is not None else "")
                          + (f" + server {w.server:.0f} (WAL {w.wal:.0f}: {w.fpi} full page "
                             f"images, {w.checkpoints} checkpoints in the window"
                             + (f"; its database's {w.wal_own:.0f}" if w.wal_own else "") + ")"
                             if w.server is not None else "")
                          + f", floor {w.floor:.0f}", flush=True)
                    for line in w.detail:
                        print(line, flush=True)
            finally:
                coord.term()
        finally:
            if pg:
                pg.stop()
            broker.stop()
    return out


def spread(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1,10,100")
    ap.add_argument("--window-s", type=float, default=30.0)
    ap.add_argument("--store", default="sqlite,postgresql",
                    help="stores in turn, each round; postgresql+KEY=VALUE[+...] sets server "
                         "settings, e.g. postgresql+wal_compression=lz4")
    ap.add_argument("--fsync", default="normal", choices=("normal", "full"))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ingest-window-s", type=float, default=None,
                    help="the coordinator's [coordinator] ingest_window_s (default: its own)")
    ap.add_argument("--ingest-window-results", type=int, default=None,
                    help="the coordinator's [coordinator] ingest_window_results (default: its "
                         "own)")
    ap.add_argument("--wal-detail", action="store_true",
                    help="PostgreSQL: print each window's WAL by relation (pg_waldump)")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    print(f"{time.strftime('%Y-%m-%d')} load average {os.getloadavg()[0]:.2f}, "
          f"window {a.window_s:.0f} s, fsync = {a.fsync!r}, coordinator ingest_window_s = "
          f"{'default' if a.ingest_window_s is None else a.ingest_window_s}, "
          f"ingest_window_results = {a.ingest_window_results or 'default'}", flush=True)
    table: dict[tuple[str, float], list[Window]] = {}
    for _ in range(a.rounds):
        for kind in a.store.split(","):
            for w in run_store(kind, rates, a.window_s, a.fsync, a.ingest_window_s,
                               a.ingest_window_results, a.wal_detail):
                table.setdefault((kind, w.rate), []).append(w)
    print("\nbytes written per result / payload (median, range over rounds)")
    print(f"{'store':10s} {'rate':>6s} {'payload B':>9s} {'device':>14s} {'coordinator':>14s} "
          f"{'pg server':>14s} {'pg WAL':>14s} {'its db':>14s} {'floor':>14s}")
    for (kind, rate), ws in table.items():
        pl = statistics.mean(w.payload for w in ws)
        srv = [w.server / w.payload for w in ws if w.server is not None]
        wal = [w.wal / w.payload for w in ws if w.wal is not None]
        own = [w.wal_own / w.payload for w in ws if w.wal_own is not None]
        print(f"{kind:10s} {rate:6g} {pl:9.0f} {spread([w.device / w.payload for w in ws]):>14s} "
              f"{spread([w.coordinator / w.payload for w in ws]):>14s} "
              f"{spread(srv) if srv else '-':>14s} {spread(wal) if wal else '-':>14s} "
              f"{spread(own) if own else '-':>14s} "
              f"{spread([w.floor / w.payload for w in ws]):>14s}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
