"""A region of interest's shape, and its pixel rectangle in a frame. Pure, standard library.

The config checks an ROI's shape when it is loaded (`check`; a synthetic source's frame size is
known then too, so `resolve` runs at load as well); the frame pipeline resolves it against each
frame's size when frames arrive (runtime/frames/roi.py crops, and re-exports these names).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Units = Literal["pixels", "fraction"]


class RoiError(ValueError):
    """The ROI does not fit a frame; the message names the config key and the frame size."""


@dataclass(frozen=True)
class Rect:
    """A crop in pixels: columns x..x+w, rows y..y+h."""

    x: int
    y: int
    w: int
    h: int


def _show(roi: Sequence[float]) -> str:
    """An ROI as the operator wrote it: [10, 20, 30, 40], [0.5, 0, 0.5, 1]."""
    return "[" + ", ".join(f"{v:g}" for v in roi) + "]"


def check(roi: Sequence[float], units: Units) -> str | None:
    """What is wrong with an ROI's shape on its own (None when nothing is): four values,
    positive size, whole pixels or fractions within 0..1."""
    if not roi:
        return None
    if len(roi) != 4:
        return f"must be [x, y, w, h] (4 values), got {len(roi)} values {_show(roi)}"
    if not all(math.isfinite(v) for v in roi):
        return f"every value must be a finite number, got {_show(roi)}"
    x, y, w, h = roi
    if units == "pixels":
        if any(v != int(v) for v in roi):
            return (f"pixel values must be whole numbers, got {_show(roi)} (for a fraction of "
                    "the frame set roi_units = \"fraction\")")
        if x < 0 or y < 0 or w < 1 or h < 1:
            return f"x and y must be >= 0 and w and h >= 1 pixel, got {_show(roi)}"
        return None
    if x < 0 or y < 0 or w <= 0 or h <= 0:
        return f"x and y must be >= 0 and w and h > 0, got {_show(roi)}"
    if x + w > 1 + 1e-9 or y + h > 1 + 1e-9:
        return (f"x + w and y + h must be <= 1 (fractions of the frame), got {_show(roi)}")
    return None


def resolve(roi: Sequence[float], units: Units, width: int, height: int,
            key: str = "source.roi") -> Rect:
    """The ROI as a pixel rectangle inside a `width` x `height` frame. RoiError (naming `key`
    and the frame size) when it reaches outside the frame or is empty there."""
    if not roi:
        return Rect(0, 0, width, height)
    problem = check(roi, units)
    if problem:
        raise RoiError(f"{key} = {_show(roi)}: {problem}")
    x, y, w, h = roi
    if units == "fraction":
        # Round the corners, not the size, so adjacent ROIs tile a frame without gaps.
        x0, y0 = round(x * width), round(y * height)
        x1, y1 = round((x + w) * width), round((y + h) * height)
        if x1 <= x0 or y1 <= y0:
            raise RoiError(f"{key} = {_show(roi)} (fraction): less than one pixel of the "
                           f"{width}x{height} frame")
        return Rect(x0, y0, min(x1, width) - x0, min(y1, height) - y0)
    x0, y0, w0, h0 = int(x), int(y), int(w), int(h)
    if x0 + w0 > width or y0 + h0 > height:
        raise RoiError(f"{key} = {_show(roi)} (pixels): reaches to x {x0 + w0}, y {y0 + h0}, "
                       f"outside the {width}x{height} frame the source delivers")
    return Rect(x0, y0, w0, h0)
