"""The `[storage]` section: what the device's storage can take (runtime/device/wear.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StorageConfig:
    """The card or disk the state directory is on."""

    # its rated endurance in terabytes written (an industrial card's datasheet states it);
    # 0 = not known: health still reports the bytes written a day, but no life
    rated_tbw: float = 0.0
    # the health history (`edgerun report`'s offline record) is written whole pages at a
    # time, when its oldest unwritten record is this old or 8 pages wait (padded to a page's
    # end): a slowly growing file's tail page, dirtied again after every writeback, and its
    # inode's page dirtied at every write, were most of the daemon's bytes at 1 result/s
    # beside the results (docs/telemetry.md, "Disk writes"). A crash loses at most this long
    # of it; 0: every record at once.
    history_flush_s: float = 300.0

    def validate(self) -> tuple[str, str] | None:
        if not (0 <= self.history_flush_s <= 3600):
            return "history_flush_s", f"must be 0..3600 s, got {self.history_flush_s}"
        if not (0 <= self.rated_tbw < math.inf):
            return "rated_tbw", ("must be a number of terabytes >= 0 (0: unknown), got "
                                 f"{self.rated_tbw}")
        return None
