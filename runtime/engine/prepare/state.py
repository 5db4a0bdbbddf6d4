"""What the steps of one preparation share (`Run`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.engine import detection, sanity
from runtime.engine.manifest import Preprocess, VariantEntry
from runtime.engine.prepare.images import read_image
from runtime.engine.prepare.options import PrepareOptions


@dataclass
class Run:
    """What the steps of one `_prepare` share: the model, its options (updated as steps
    settle the format, preprocessing and labels) and what each step found."""

    model: Path
    opts: PrepareOptions
    out: Path  # the scratch folder the variants and the manifest are written into
    scratch: Path
    stem: str
    calib_files: list[Path]
    val_files: list[Path]
    val_images: list[np.ndarray]
    fp32: Path = Path()
    staged: Path = Path()
    meta: Any = None
    input_name: str = ""
    shape: tuple[int, ...] = ()
    shape_from: str = ""
    dynamic_hw: bool = False  # the model's image input has dynamic height/width
    pre: Preprocess = field(default_factory=Preprocess)
    pre_source: str = ""
    labels_source: str = ""
    spec: detection.DetectSpec | None = None
    out_shape: tuple[int, ...] = ()
    n_classes: int | None = None
    truth: np.ndarray | None = None
    det_truth: list | None = None
    generated: bool = False
    full: list[np.ndarray] = field(default_factory=list)
    ref: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ref_dets: list = field(default_factory=list)
    verdict: sanity.Verdict | None = None
    entries: list[VariantEntry] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    search_log: list[dict] = field(default_factory=list)

    @property
    def hw(self) -> tuple[int, int]:
        """The fp32 form's input (H, W)."""
        return self.pre.hw(self.shape)

    @property
    def labelled(self) -> bool:
        """Whether the val images carry labels (folder names, or YOLO label files)."""
        return self.truth is not None or self.det_truth is not None

    def tensors(self, shape: tuple[int, ...]) -> list[np.ndarray]:
        """The val images preprocessed for an input of `shape`."""
        return [self.pre.apply(img, shape) for img in self.val_images]

    def calib_batches(self) -> Iterator[np.ndarray]:
        """The calibration images, one preprocessed tensor each, read as they are used."""
        for f in self.calib_files:
            yield self.pre.apply(read_image(f), self.shape)


def metric(run: Run) -> str:
    """What accuracy means for this model: top-1 for a classifier, mAP@0.5 for a detector."""
    return "top-1" if run.spec is None else "mAP@0.5"
