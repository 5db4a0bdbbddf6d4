"""Region-of-interest crop: the part of a frame a source inspects. Pure, no I/O.

A source's `roi = [x, y, w, h]` is in pixels (`roi_units = "pixels"`, whole numbers, the
top-left corner at x, y) or in fractions of the frame (`roi_units = "fraction"`, 0..1, so one
setting fits a camera whatever its resolution). The rectangle's shape is checked when the
config is loaded (`check`); whether it fits a frame can only be known when frames arrive
(`resolve`, which names the config key and the frame size when it does not).

The shape check and the pixel rectangle (`check`, `resolve`, `Rect`, `RoiError`) live with
the config (runtime/config/roi.py, standard library only, so the config checks an ROI without
importing the frame code) and are re-exported here.

The crop happens before preprocessing, so the model sees only the ROI: anything a model
reports in image coordinates (a detector's boxes) is relative to the ROI. `to_frame` maps a
normalised box back to the whole frame for whoever needs that.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.config.roi import Rect, RoiError, Units, check, resolve

__all__ = ["Rect", "RoiError", "Units", "check", "crop", "resolve", "to_frame"]


def crop(image: np.ndarray, rect: Rect) -> np.ndarray:
    """The rectangle of an HxW(xC) image, as a view (no copy; OpenCV and the preprocessing
    read strided arrays)."""
    return image[rect.y:rect.y + rect.h, rect.x:rect.x + rect.w]


def to_frame(box: Sequence[float], rect: Rect, width: int, height: int
             ) -> tuple[float, float, float, float]:
    """A box (x, y, w, h) normalised to the ROI, normalised to the whole frame instead."""
    bx, by, bw, bh = box
    return ((rect.x + bx * rect.w) / width, (rect.y + by * rect.h) / height,
            bw * rect.w / width, bh * rect.h / height)
