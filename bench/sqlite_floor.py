"""What storing results as SQLite rows costs on disk, whatever the commit size.

The coordinator's SQLite store writes ~8x the payload a result for one device at 10/s
(bench/disk_writes.py): each 2 s commit rewrites whole 4 KiB pages. The way out proposed was
an append-only log acked from and folded into the tables in large transactions. This bench
measures the fold's own floor: a results table like the store's (a WITHOUT ROWID table keyed by
device, stream and seq; `--rowid` for a rowid table with a unique key instead) with
`--existing` rows already in it, WAL journal, synchronous NORMAL, takes `--total` results of
one device in commits of each size in `--sizes`, then a checkpoint copies the pages into the
database; `/proc/self/io` `write_bytes` after `os.sync()` (every page this process dirtied
written back) divided by the rows and the payload's bytes. Nothing else in the store (counters,
health, fleet view) is counted: a floor. With a log in front of the fold, the log's own ~1x
comes on top.

Usage: python bench/sqlite_floor.py [--sizes 20,100,1000,3000] [--total 6000] [--rowid]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
from pathlib import Path

BODY = json.dumps({"label": "ok", "score": 0.98765, "rung": "fp32-r60", "latency_ms": 1.234,
                   "t": 1765000000.123, "frame": "cam1/000123", "boxes": [],
                   "model": "inspection@2", "note": "x" * 150})  # ~320 bytes, like a result


def written() -> int:
    """This process's bytes written to disk so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes"):
            return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


def main() -> None:
    """Print bytes written per result / payload for each commit size."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20,100,1000,3000")
    ap.add_argument("--total", type=int, default=6000, help="results per commit size")
    ap.add_argument("--existing", type=int, default=40000)
    ap.add_argument("--rowid", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:  # a disk, not a tmpfs
        db = sqlite3.connect(Path(tmp) / "store.db", isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        key = "UNIQUE (device, stream, seq))" if args.rowid else \
            "PRIMARY KEY (device, stream, seq)) WITHOUT ROWID"
        db.execute(f"CREATE TABLE results (device TEXT, stream TEXT, seq INTEGER, t REAL, "
                   f"body TEXT, {key}")
        seq = 0

        def commit(n: int) -> None:
            nonlocal seq
            db.execute("BEGIN")
            db.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?)",
                           [("cabinet-01", "stream-1", seq + i, float(seq + i), BODY)
                            for i in range(n)])
            db.execute("COMMIT")
            seq += n

        commit(args.existing)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(f"payload {len(BODY)} B; {args.existing} rows before; "
              f"{'rowid table + unique key' if args.rowid else 'WITHOUT ROWID'}")
        for n in (int(x) for x in args.sizes.split(",")):
            os.sync()
            w0, rows = written(), 0
            while rows < args.total:
                commit(n)
                rows += n
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            os.sync()
            print(f"{n:6d} results a commit: {(written() - w0) / rows / len(BODY):.2f}x the "
                  f"payload (WAL + checkpoint, {rows} results)")
        db.close()


if __name__ == "__main__":
    main()
