"""The images a preparation measures and calibrates on: listed, read, or generated when
there are none; and their labels (a classifier's folder names, a detector's YOLO label
files), checked against the model's output.
"""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np

from runtime.engine import detection
from runtime.engine.onnx_model import ModelError
from runtime.engine.prepare.errors import StepError

log = logging.getLogger("edgerun.ladder")


IMAGE_EXT = {".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"}


def list_images(root: Path, limit: int) -> list[Path]:
    """Image files under `root` (recursively, sorted), at most `limit`, evenly spread."""
    if not root.is_dir():
        raise ModelError(f"{root}: not a directory of images")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXT)
    if not files:
        raise ModelError(f"{root}: no images ({', '.join(sorted(IMAGE_EXT))})")
    if len(files) > limit:
        files = [files[i] for i in np.linspace(0, len(files) - 1, limit).astype(int)]
    return files


def read_image(path: Path) -> np.ndarray:
    """BGR uint8; ModelError naming the file when it cannot be decoded."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise ModelError(f"{path}: not a readable image")
    return img


def label_file(image: Path) -> Path:
    """Where an image's YOLO label file is: `.../labels/x.txt` for `.../images/x.png` (the
    usual dataset layout), else `x.txt` beside the image."""
    parts = list(image.parts)
    if "images" in parts[:-1]:
        i = len(parts) - 1 - parts[:-1][::-1].index("images") - 1
        parts[i] = "labels"
        return Path(*parts).with_suffix(".txt")
    return image.with_suffix(".txt")


def detector_truth(files: list[Path], classes: int | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Each val image's boxes from its YOLO label file; None when no image has one
    (unlabelled: agreement with fp32). An image without a file, when others have one, has no
    objects (the YOLO convention). A malformed file raises ModelError naming it."""
    paths = [label_file(f) for f in files]
    if not any(p.exists() for p in paths):
        if files:
            log.info("no YOLO label file beside the val images (e.g. %s): the images are taken "
                     "as unlabelled and accuracy is mAP against fp32's detections", paths[0])
        return None
    out = []
    for p in paths:
        if not p.exists():
            out.append((np.zeros((0, 4), np.float32), np.zeros(0, np.int64)))
            continue
        try:
            out.append(detection.read_yolo_labels(p, classes))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ModelError(str(e)) from e
    return out


def generated_frames(hw: tuple[int, int], n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` BGR frames with structure at several scales (random coarse grids upsampled, with
    random contrast and some pixel noise): a model's top class moves with them, unlike on
    flat noise, so fp16's agreement with fp32 on them says something. Still no substitute for
    real images: the manifest's accuracy basis says "agreement-generated"."""
    rng = np.random.default_rng(seed)
    h, w = hw
    out = []
    for i in range(n):
        cells = int(rng.integers(2, 17))
        coarse = rng.integers(0, 256, (cells, cells, 3)).astype(np.float32)
        f = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_LINEAR if i % 2 else
                       cv2.INTER_CUBIC)
        lo, hi = sorted(rng.uniform(0, 1, 2))
        f = f * (hi - lo + 0.1) + lo * 128 + rng.normal(0, 8, f.shape)
        out.append(np.clip(f, 0, 255).astype(np.uint8))
    return out


def class_truth(files: list[Path], labels: tuple[str, ...]) -> np.ndarray | None:
    """Ground-truth indices from each image's parent folder name (None without labels, or when
    no image sits in a folder named for a label: unlabelled images, agreement only)."""
    if not labels or not files:
        return None
    index = {name: i for i, name in enumerate(labels)}
    if not any(f.parent.name in index for f in files):
        log.info("no val image is in a folder named for a label: the images are taken as "
                 "unlabelled and accuracy is top-1 agreement with fp32")
        return None
    missing = sorted({f.parent.name for f in files if f.parent.name not in index})
    if missing:
        raise ModelError(f"val images in folders that are not labels: {missing[:5]} "
                         f"(labels: {list(labels)}); put each image under a folder named for "
                         "its label")
    return np.array([index[f.parent.name] for f in files])


def labels_against(labels: tuple[str, ...], where: str, classes: int | None,
                   model: Path) -> None:
    """StepError naming the labels' source when their count is not the output's classes."""
    if labels and classes is not None and len(labels) != classes:
        more = "too many" if len(labels) > classes else "too few"
        raise StepError("options", f"{where}: {len(labels)} labels ({more}) but the output of "
                        f"{model} scores {classes} classes: one label per line, in output order")
