"""Do ack lines cost disk writes? Three appenders side by side, each its own process and file.

The result log takes one line a result and, ~2 s later, a short ack line. Whether holding the
acks in memory until the next result's write would write less depends on the page cache: a
process is charged 4 KiB (`/proc/PID/io` `write_bytes`) when it dirties a clean page, and an
ack that lands on a tail page still dirty from its result costs nothing more. Measured here,
at the same rate and in the same window:

- lines: a `--size`-byte line a tick (the floor of disk_writes.py);
- acks after: the same line, then a 14-byte ack line `--ack-delay-s` later (the log today);
- acks held: the ack written in the same write as the next tick's line.

Each file's inode is kept on an inode table page of its own (see one_round). Prints each
writer's bytes a second and their ratio to the line. The host may be shared: the
three run in one window so writeback treats them alike; repeat with `--rounds` for the spread.

Usage: python bench/ack_lines.py [--rate 1] [--size 340] [--window-s 120] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = r"""
import os, sys, time
mode, path = sys.argv[1], sys.argv[2]
size, rate, delay = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
line, ack = b"x" * (size - 1) + b"\n", b"y" * 13 + b"\n"
t = time.monotonic()
while True:
    if mode == "held":
        os.write(fd, ack + line)
    else:
        os.write(fd, line)
        if mode == "after":
            time.sleep(delay)
            os.write(fd, ack)
    t += 1 / rate
    time.sleep(max(0.0, t - time.monotonic()))
"""

MODES = {"lines": "lines", "acks after": "after", "acks held": "held"}
INODES_PER_PAGE = 16  # ext4's default 256-byte inodes


def write_bytes(pid: int) -> int:
    """`write_bytes` of one process."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/io has no write_bytes")


def one_round(rate: float, size: int, delay: float, window_s: float) -> dict[str, float]:
    """Bytes a second each writer caused to be written over one window."""
    with tempfile.TemporaryDirectory(prefix="edgerun-acks-") as tmp:
        # Each write changes the file's mtime, and on ext4 without a journal that dirties the
        # 4 KiB page of the inode table holding the inode, charged to whichever process dirties
        # it first after a writeback: three files made one after another share that page, and
        # the writer with more writes a second was charged for all three. Empty files between
        # them put each inode on a page of its own (16 inodes of 256 B a page).
        for i, mode in enumerate(MODES.values()):
            (Path(tmp) / f"{mode}.log").touch()
            for j in range(INODES_PER_PAGE):
                (Path(tmp) / f"spacer-{i}-{j}").touch()
        pages = {(Path(tmp) / f"{m}.log").stat().st_ino // INODES_PER_PAGE for m in MODES.values()}
        if len(pages) < len(MODES):
            print("  (warning: two of the files' inodes share an inode table page)", flush=True)
        procs = {name: subprocess.Popen([sys.executable, "-c", WRITER, mode,
                                         str(Path(tmp) / f"{mode}.log"), str(size), str(rate),
                                         str(delay)])
                 for name, mode in MODES.items()}
        try:
            time.sleep(5.0)  # past the first page of each file
            w0 = {n: write_bytes(p.pid) for n, p in procs.items()}
            time.sleep(window_s)
            w1 = {n: write_bytes(p.pid) for n, p in procs.items()}
        finally:
            for p in procs.values():
                p.kill()
                p.wait()
    return {n: (w1[n] - w0[n]) / window_s for n in procs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--size", type=int, default=340)
    ap.add_argument("--ack-delay-s", type=float, default=0.5)
    ap.add_argument("--window-s", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}, "
          f"{a.rate:g} lines/s of {a.size} B, window {a.window_s:.0f} s", flush=True)
    got: dict[str, list[float]] = {n: [] for n in MODES}
    for _ in range(a.rounds):
        r = one_round(a.rate, a.size, a.ack_delay_s, a.window_s)
        print("  " + ", ".join(f"{n} {v:.0f} B/s" for n, v in r.items()), flush=True)
        for n, v in r.items():
            got[n].append(v / (a.rate * a.size))
    for n, xs in got.items():
        rng = f" ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else ""
        print(f"{n:11s} {statistics.median(xs):.2f}x the line{rng}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
