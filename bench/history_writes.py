"""Bytes the health history writes: `history_flush_s` 60 against 300, side by side.

Two processes, each a `HealthHistory` of this tree fed a record every `--interval-s` (the
daemon's health interval) in real time, so the kernel's writeback treats them alike; each
process's `/proc/PID/io` `write_bytes` over one window. Each file's inode is kept on an inode
table page of its own (empty files between them: on ext4 without a journal each write's
mtime dirties that page, charged to whichever process dirties it first).

Usage: python bench/history_writes.py [--window-s 300] [--interval-s 5] [--flush 60,300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FEEDER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from runtime.wire.health_history import HealthHistory
hist = HealthHistory(Path(sys.argv[2]), flush_s=float(sys.argv[3]))
interval, i = float(sys.argv[4]), 0
while True:
    i += 1
    hist.append({"t": time.time(), "temp_c": None, "throttled": False, "rung": 4.0,
                 "rungs": 4.0, "pipeline": {"rate_hz": 0.86245093 + i * 1e-9,
                                            "latency_ms": {"p95": 9.2183458}},
                 "slo": {"target_ms": 100.0}, "rung_energy_mj": 1.517, "power_w": 8.0,
                 "accuracy": 0.99, "passive_trip_c": 86.0}, {"hot": 90.0})
    time.sleep(interval)
"""


def write_bytes(pid: int) -> int:
    """`write_bytes` of one process."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/io has no write_bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--interval-s", type=float, default=5.0)
    ap.add_argument("--flush", default="60,300", help="history_flush_s of each process")
    a = ap.parse_args()
    flushes = [float(f) for f in a.flush.split(",")]
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}, "
          f"window {a.window_s:.0f} s, a record every {a.interval_s:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="edgerun-hist-") as tmp:
        procs = {}
        for i, flush in enumerate(flushes):
            d = Path(tmp) / f"h{i}"
            d.mkdir()
            (d / "health-history.jsonl").touch()
            for j in range(16):  # 16 inodes of 256 B a page
                (Path(tmp) / f"spacer-{i}-{j}").touch()
            procs[flush] = (d, subprocess.Popen([sys.executable, "-c", FEEDER, str(ROOT), str(d),
                                                 str(flush), str(a.interval_s)]))
        try:
            time.sleep(3.0)
            w0 = {f: write_bytes(p.pid) for f, (_, p) in procs.items()}
            time.sleep(a.window_s)
            w1 = {f: write_bytes(p.pid) for f, (_, p) in procs.items()}
        finally:
            for _, p in procs.values():
                p.kill()
                p.wait()
        for f, (d, _) in procs.items():
            size = (d / "health-history.jsonl").stat().st_size
            print(f"history_flush_s {f:5g}: {w1[f] - w0[f]:7d} bytes written in the window, "
                  f"{(w1[f] - w0[f]) / a.window_s:6.1f} B/s; file {size} bytes")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
