"""What `models prepare` was asked for, and the accuracy floor a form must keep to be a
rung.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.engine.manifest import Preprocess

# A form measured below this fraction of its fp32 form's accuracy is not written as a rung:
# its results are mostly wrong (seen: int8 of the random-weight bench detector at mAP 0.056 of
# fp32's 1.0). The good rungs of the bundled models keep 0.87 (defects int8) and more of
# fp32's; the weakest kept form measured anywhere here, PP-OCR's 32-px text-direction form,
# keeps 0.525 (models/README.md), so 0.5 drops only what is close to useless.
MIN_ACCURACY_RATIO = 0.5


@dataclass(frozen=True)
class PrepareOptions:
    """What `models prepare` was asked for."""

    name: str
    preprocess: Preprocess | None = None  # None: the model's metadata, else the one default
    labels: tuple[str, ...] = ()  # (): the model's metadata names, else none
    preprocess_source: str = "given"  # where `preprocess` came from, for the operator
    labels_source: str = "given"  # where `labels` came from (a labels file's path)
    check_reference: bool = True  # refuse a blind fp32 reference (runtime/engine/sanity.py)
    input_shape: tuple[int, ...] = ()
    prefix: str = ""  # non-empty: add this model's variants to an existing manifest
    output: str = "probabilities"
    max_calib: int = 200
    max_val: int = 2000
    reduced: bool = True
    # reduced-resolution forms at these input heights (largest first; the width keeps the
    # aspect ratio); (): a detector's DETECTOR_SCALES, a classifier's one form at 2/3
    sizes: tuple[int, ...] = ()
    generated: int = 64  # inputs generated to measure on when there are no images
    task: str = "auto"  # auto | classify | detect (auto: from the output's shape)
    format: str = "auto"  # a detector's output form: auto | yolov8 | yolov5 | nms-inside
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    min_accuracy_ratio: float = MIN_ACCURACY_RATIO  # a form below this x fp32's is no rung


def below_floor(accuracy: float, reference: float, ratio: float) -> float | None:
    """The accuracy floor a variant missed (`ratio` x its fp32 form's `reference` accuracy),
    or None when it is at or above it. A ratio of 0 keeps everything."""
    floor = ratio * reference
    return floor if accuracy < floor else None
