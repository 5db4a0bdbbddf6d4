"""What the daemon and its card write a day, and how long the card lasts at that rate.

An SD card or eMMC wears out by the bytes written to it; industrial cards state their endurance
in TBW (terabytes written), consumer cards rarely do. Two figures, each sampled with every
health message and taken as a rate over the last `window_s` (an hour) once at least
`MIN_SPAN_S` of it is there:

- the daemon's own: the kernel's `write_bytes` of the process (`/proc/self/io`: what it
  caused to be sent to storage, counted as pages are dirtied);
- the card's: sectors written to the block device that holds the state directory
  (`/sys/dev/block/MAJOR:MINOR/stat`), whoever wrote them. That is what wears the card, and
  it is more than the processes' counts: the filesystem's journal and its metadata (an
  inode's times, written back at each journal commit) are written by the kernel, charged to
  no process; measured 2026-12-06 on ext4 at 1 result/s, 6.4x the daemon's own count with
  the default mount options (docs/telemetry.md, "At the card").

The card's life is its rated endurance over the card's rate when the card is known, else the
daemon's (a lower bound on wear, an upper bound on life), from new: what the card wrote before
is not known here.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DAY_S = 86400.0
MIN_SPAN_S = 60.0  # a rate over less is mostly the start's writes (profile cache, keys)
TB = 1e12  # endurance ratings are decimal terabytes


def read_write_bytes(path: Path = Path("/proc/self/io")) -> int | None:
    """This process's `write_bytes` (None where the kernel does not say: not Linux, or
    task I/O accounting compiled out)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def card_written(path: Path, root: Path = Path("/")) -> int | None:
    """Bytes written so far to the block device holding `path`: its sectors written
    (`<root>/sys/dev/block/MAJOR:MINOR/stat`, the 7th field, 512 bytes each; a partition
    has its own). None where `path` is on no block device (tmpfs, overlay, NFS: major 0) or
    the kernel does not say."""
    try:
        dev = os.stat(path).st_dev
        if os.major(dev) == 0:
            return None
        stat = root / "sys/dev/block" / f"{os.major(dev)}:{os.minor(dev)}" / "stat"
        return int(stat.read_text().split()[6]) * 512
    except (OSError, ValueError, IndexError):
        return None


def mount_of(path: Path, mounts: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(mount point, filesystem type, options) of the mount that holds `path`, from the text
    of /proc/mounts (the longest mount point above it; the last one mounted there wins)."""
    best: tuple[str, str, tuple[str, ...]] | None = None
    target = str(path)
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, parts[2], tuple(parts[3].split(",")))
    return best


def mount_advice(fstype: str, options: tuple[str, ...]) -> str | None:
    """The mount option that spares a card under ext4, when `options` lack it: `commit=60`
    (ext4 commits its journal, the metadata each append changes, every `commit` seconds, 5 by
    default; at 1 result/s that is most of what reaches the card). `noatime` and `lazytime`
    measured no difference (docs/telemetry.md, "At the card"): not asked for. None when
    nothing is missing or it is not ext4."""
    if fstype not in ("ext4", "ext3"):
        return None
    commit = next((o.partition("=")[2] for o in options if o.startswith("commit=")), "5")
    return "commit=60" if not commit.isdigit() or int(commit) < 60 else None


def life_days(bytes_per_day: float | None, rated_tbw: float) -> float | None:
    """Days a card rated `rated_tbw` TB written lasts at `bytes_per_day`, from new; None when
    either is unknown (rated_tbw 0: not configured) or nothing is written."""
    if bytes_per_day is None or not rated_tbw > 0 or not bytes_per_day > 0:
        return None
    days = rated_tbw * TB / bytes_per_day
    return days if math.isfinite(days) else None


@dataclass
class WriteRate:
    """`write_bytes` samples over a sliding window (main loop only)."""

    window_s: float = 3600.0
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, t: float, written: int) -> None:
        """One sample at monotonic time `t`; samples older than the window go (the oldest
        one inside it is kept as the window's start)."""
        self.samples.append((t, written))
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()

    def per_day(self) -> float | None:
        """Bytes a day over the window, None until it spans MIN_SPAN_S."""
        if len(self.samples) < 2:
            return None
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        if t1 - t0 < MIN_SPAN_S or n1 < n0:
            return None
        return (n1 - n0) / (t1 - t0) * DAY_S

    def span_s(self) -> float:
        """Seconds the rate is taken over."""
        return self.samples[-1][0] - self.samples[0][0] if len(self.samples) > 1 else 0.0


def report(rate: WriteRate, rated_tbw: float, card: WriteRate | None = None
           ) -> dict[str, Any]:
    """Health's `storage`: the daemon's rate, the card's (`card`; None: not known), the
    window the daemon's is over, the rating and the life (from the card's rate when known)."""
    per_day = rate.per_day()
    card_day = card.per_day() if card is not None else None
    life = life_days(card_day if card_day is not None else per_day, rated_tbw)
    return {"write_bytes_per_day": None if per_day is None else round(per_day),
            "card_write_bytes_per_day": None if card_day is None else round(card_day),
            "window_s": round(rate.span_s(), 1),
            "rated_tbw": rated_tbw if rated_tbw > 0 else None,
            "life_days": None if life is None else round(life, 1)}
