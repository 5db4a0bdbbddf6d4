"""Bytes that reach the card per result: the block device under the daemon's state directory,
not only what the daemon's process is charged.

`/proc/PID/io` `write_bytes` (bench/disk_writes.py) counts the pages a process dirties. A card
also takes what the kernel writes for the filesystem and charges to no process: ext4's journal
(metadata changes, an inode's size and times, committed every `commit` seconds) and the inode
table behind it. Here each case gets filesystems of its own: two ext4 images on loop devices,
mounted with the case's options (`--mounts`, `;` between cases); a real Mosquitto and
coordinator elsewhere, a real `edgerun serve` (the bundled model on the synthetic conveyor at
`--rate`, no governor) with its state directory on the first image, and beside it, started
`--settle-s` before the window, the floor (a process appending each result's payload to one
file at the same rate, without fsync) on the second. Over `--window-s`: sectors written to each
loop device (`/sys/block/loopN/stat`, 512 bytes each) per result, the daemon's own
`write_bytes` per result, and what the daemon's health said of its card
(`storage.card_write_bytes_per_day`, runtime/device/wear.py, over the daemon's life so far)
against the device's count over the daemon's life.

Needs root (losetup, mount); without it the bench says so and exits 0.

Usage: python bench/card_writes.py [--rate 1] [--window-s 240] [--settle-s 100]
       [--mounts "defaults;commit=60;noatime,lazytime,commit=60"]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # disk_writes, its neighbour
import disk_writes as dw

IMAGE_MB = 256


class Ext4:
    """An ext4 filesystem in a file, on a loop device, mounted with `options`."""

    def __init__(self, work: Path, name: str, options: str):
        self.image, self.mnt, self.options = work / f"{name}.img", work / name, options
        self.dev = ""

    def __enter__(self) -> Ext4:
        with self.image.open("wb") as f:
            f.truncate(IMAGE_MB << 20)
        # 4 KiB blocks, as on a card's root partition (mkfs picks 1 KiB for a small image)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(self.image)], check=True)
        self.mnt.mkdir()
        self.dev = subprocess.run(["losetup", "--find", "--show", str(self.image)], check=True,
                                  capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", "-o", self.options, self.dev, str(self.mnt)], check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", str(self.mnt)], check=False)
        subprocess.run(["losetup", "-d", self.dev], check=False)

    def written(self) -> int:
        """Bytes written to the loop device so far."""
        name = Path(self.dev).name
        return int(Path(f"/sys/block/{name}/stat").read_text().split()[6]) * 512


def health_storage(coord: dw.CoordinatorProc) -> dict:
    """The `storage` section of the daemon's newest health at the coordinator."""
    view = coord.api("/api/v1/devices/disk")
    return (view.get("health") or {}).get("storage") or {}


def one_case(work: Path, broker: dw.Mosquitto, coord: dw.CoordinatorProc, options: str,
             rate: float, window_s: float, settle_s: float) -> str:
    """The daemon and the floor on filesystems mounted with `options`: one line."""
    with Ext4(work, "dev", options) as dev_fs, Ext4(work, "floor", options) as floor_fs:
        home = dev_fs.mnt / "edgerun"
        home.mkdir()
        cfg = work / "serve.toml"
        cfg.write_text(dw.daemon_config(home, broker.port, rate, "normal"))
        logfile = work / f"serve-{options}.log"
        t_start, d_start = time.monotonic(), dev_fs.written()
        with logfile.open("a") as log:
            # the daemon's log goes to this (other) disk: journald's in the field
            proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                                     str(cfg)], stdout=log, stderr=subprocess.STDOUT)
        floor_proc = None
        try:
            dw.settled(proc, coord, logfile)
            payload = dw.mean_payload(coord)
            floor_file = floor_fs.mnt / "floor.log"
            floor_proc = dw.start_floor(payload, rate, floor_file)
            # both writing, past a journal commit and a writeback of what came before (the
            # daemon's start, the profile cache): the window then sees each in its steady state
            time.sleep(settle_s)
            m0, d0, p0 = dw.produced(home / "state"), dev_fs.written(), dw.write_bytes(proc.pid)
            f0, l0 = floor_fs.written(), floor_file.stat().st_size
            time.sleep(window_s)
            m1, d1, p1 = dw.produced(home / "state"), dev_fs.written(), dw.write_bytes(proc.pid)
            f1, l1 = floor_fs.written(), floor_file.stat().st_size
            n, lines = m1 - m0, (l1 - l0) / max(1, round(payload))
            if n <= 0:
                raise RuntimeError(f"no result made in the {window_s:.0f} s window")
            card, own, floor = (d1 - d0) / n, (p1 - p0) / n, (f1 - f0) / max(1.0, lines)
            storage = health_storage(coord)
            said = storage.get("card_write_bytes_per_day")
            # the health's rate is over its samples since the first health (an hour at
            # most): the start's writes in part, so it lies between these two
            life = (dev_fs.written() - d_start) / (time.monotonic() - t_start) * 86400
            return (f"  {options:32s} card {card:6.0f} B/result = {card / payload:5.2f}x, "
                    f"daemon's own {own / payload:4.2f}x, floor at its card "
                    f"{floor / payload:4.2f}x (payload {payload:.0f} B, {n} results); card "
                    f"MB/day: the window {(d1 - d0) / window_s * 0.0864:.1f}, the daemon's "
                    f"life {life / 1e6:.1f}, its health "
                    f"{'-' if said is None else f'{said / 1e6:.1f}'} (over "
                    f"{storage.get('window_s', 0):.0f} s)")
        finally:
            if floor_proc:
                floor_proc.kill()
                floor_proc.wait()
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)


def main() -> None:
    """Each mount case in turn against one broker and coordinator."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--window-s", type=float, default=240.0)
    ap.add_argument("--settle-s", type=float, default=100.0,
                    help="both writers run this long before the window (over a commit "
                         "interval plus the kernel's 30 s writeback)")
    ap.add_argument("--mounts", default="defaults;commit=60;noatime,lazytime,commit=60")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("card_writes: needs root to make and mount loop filesystems; not run")
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}, "
          f"{a.rate:g} results/s, {a.window_s:g} s windows, ext4 on loop devices", flush=True)
    with tempfile.TemporaryDirectory(prefix="edgerun-card-") as tmp:
        work = Path(tmp)
        broker = dw.Mosquitto(work, auth=False).start()
        coord = dw.CoordinatorProc(work, "coord", broker.port, str(work / "coord.db"))
        coord.start()
        try:
            for options in a.mounts.split(";"):
                case = work / options.replace(",", "_").replace("=", "")
                case.mkdir()
                print(one_case(case, broker, coord, options, a.rate, a.window_s, a.settle_s),
                      flush=True)
        finally:
            coord.term()
            broker.stop()


if __name__ == "__main__":
    main()
