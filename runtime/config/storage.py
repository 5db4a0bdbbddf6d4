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

    def validate(self) -> tuple[str, str] | None:
        if not (0 <= self.rated_tbw < math.inf):
            return "rated_tbw", ("must be a number of terabytes >= 0 (0: unknown), got "
                                 f"{self.rated_tbw}")
        return None
