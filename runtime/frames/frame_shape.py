"""What converting a camera's frames to `[source] frame_size` does to their shape, said once
per camera size: shared by both live stream readers (capture_source.py, av_source.py)."""

from __future__ import annotations

import logging

log = logging.getLogger("edgerun.source")


class FrameShape:
    """One warning per camera size when `[source] frame_size` stretches its frames: a
    camera rebooted into another resolution (or a size set for another camera) would
    otherwise feed the model distorted pictures without a word."""

    def __init__(self, shown: str, size: tuple[int, ...]):
        self._shown, self._size = shown, size
        self._seen: tuple[int, int] | None = None

    def check(self, w: int, h: int) -> None:
        """Note a frame of `w` x `h` before it is converted (cheap when the size is known)."""
        if (w, h) == self._seen or not self._size:
            return
        self._seen = (w, h)
        if why := stretched(w, h, self._size):
            log.warning("%s: %s", self._shown, why)


def stretched(w: int, h: int, size: tuple[int, ...]) -> str | None:
    """What converting a `w` x `h` frame to `size` does to its shape when it stretches it by
    more than 2 % (pure), else None."""
    if not size or w <= 0 or h <= 0:
        return None
    ratio = (size[0] / size[1]) / (w / h)
    if abs(ratio - 1) <= 0.02:
        return None
    return (f"frames of {w}x{h} are converted to {size[0]}x{size[1]} ([source] frame_size): "
            f"their width stretched {ratio:.2f}x against their height; set a frame_size of "
            "the camera's shape")
