"""The folder source's CPU per paced frame in a folder that keeps its inspected files.

A folder without `done_dir` keeps every inspected file. While files keep arriving, the
source used to list the whole folder on every 20 ms poll; with the inotify watch
(runtime/frames/dirwatch.py) it looks only at the names the kernel reports. Side by side in
one run, alternating: the capture thread's CPU per frame (read, decode, polling) for 60
frames arriving 30 ms apart into a folder holding 3,300 other files, with the watch and with
it refused (listing on every change, as before and as on a system without inotify).

Usage: python bench/folder_watch.py [--rounds 3] [--kept 3300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cv2

import runtime.frames.folder_source as sources
from models.synthetic import samples
from runtime.config.source import SourceConfig
from runtime.frames.folder_source import FolderSource

IMG = next(iter(samples(seed=4, count=1))).image


def run(watch: bool, n: int = 60, keep: int = 3300) -> float:
    """Capture-thread CPU ms per frame, with or without the watch."""
    d = Path(tempfile.mkdtemp())
    inbox, stage = d / "in", d / "st"
    inbox.mkdir()
    stage.mkdir()
    for i in range(keep):
        (inbox / f"k{i:05d}.txt").write_text("x")
    old = time.time() - 3600
    for i in range(n):
        cv2.imwrite(str(stage / f"n{i:03d}.png"), IMG)
        os.utime(stage / f"n{i:03d}.png", (old, old))
    real = sources.DirWatch
    if not watch:
        def refused(path: object) -> None:
            raise OSError("refused for the comparison")

        sources.DirWatch = refused  # type: ignore[assignment,misc]
    src = FolderSource(SourceConfig(kind="folder", path=str(inbox)), d / "state")
    src.read(0.05)

    def feed() -> None:
        for p in sorted(stage.iterdir()):
            os.rename(p, inbox / p.name)
            time.sleep(0.03)

    t = threading.Thread(target=feed)
    t.start()
    c0, got = time.thread_time(), 0
    while got < n:
        f = src.read(0.1)
        if f is not None:
            got += 1
            src.done([f])
    cpu = (time.thread_time() - c0) / n * 1e3
    t.join()
    src.close()
    sources.DirWatch = real  # type: ignore[misc]
    shutil.rmtree(d)
    return cpu


def main() -> None:
    """Alternate the two, print each round's ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kept", type=int, default=3300)
    a = ap.parse_args()
    for _ in range(a.rounds):
        w, li = run(True, keep=a.kept), run(False, keep=a.kept)
        print(f"CPU per paced frame ({a.kept} files kept): watch {w:.2f} ms, listing "
              f"{li:.2f} ms -> {li / w:.1f}x (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
