"""Synthetic defect-localisation images: the inspection plates with boxed defects.

The plate, belt, bolts, lighting, blur and noise come from models/synthetic.py (the bundled
classifier's generator); here a plate carries 0 to 3 defects, each of class ``scratch``,
``dent`` or ``stain``, and every defect has a box. Boxes are YOLO-style: class index and the
normalised centre x, centre y, width, height of the visible defect. Deterministic by seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from models.synthetic import _background, _grid, _plate_geometry

CLASSES: tuple[str, ...] = ("scratch", "dent", "stain")


@dataclass(frozen=True)
class Sample:
    """One frame and its boxes: rows of (class, cx, cy, w, h), normalised to 0..1."""

    image: np.ndarray  # HxWx3 uint8 BGR
    boxes: np.ndarray  # (K, 5) float32


def _box(x0: float, y0: float, x1: float, y1: float, big: int) -> tuple[float, ...]:
    """Pixel corners at the drawing scale -> clipped normalised (cx, cy, w, h)."""
    x0, x1 = np.clip([x0, x1], 0, big) / big
    y0, y1 = np.clip([y0, y1], 0, big) / big
    return ((x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0)


def render(rng: np.random.Generator, size: int = 96, max_defects: int = 3) -> Sample:
    """Draw one plate with 0..`max_defects` defects; returns the frame and its boxes."""
    scale = 4  # drawn at 4x and downsampled, as models/synthetic.py does
    big = size * scale
    img = _background(rng, big)
    box, bolts = _plate_geometry(rng, big)
    mask = np.zeros((big, big), np.uint8)
    cv2.fillConvexPoly(mask, box.astype(np.int32), 255)
    mask = cv2.GaussianBlur(mask, (0, 0), scale * 0.8)
    plate = np.empty_like(img)
    plate[:] = rng.uniform(140, 215) + rng.uniform(-12, 12, 3)
    plate += cv2.resize(rng.normal(0, 5, (big, 1)).astype(np.float32), (big, big))[..., None]
    m = mask.astype(np.float32)[..., None] / 255.0
    centre = np.mean(box, 0)
    # defects stay inside the plate: its short side bounds how far from the centre they go
    reach = 0.3 * min(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[1] - box[2]))

    boxes: list[tuple[float, ...]] = []
    defect = np.zeros((big, big), np.float32)
    yy, xx = _grid(big)
    for _ in range(int(rng.integers(0, max_defects + 1))):
        kind = int(rng.integers(len(CLASSES)))
        c = centre + rng.uniform(-1, 1, 2) * reach
        if CLASSES[kind] == "scratch":
            ang = rng.uniform(0, np.pi)
            length = big * rng.uniform(0.16, 0.3)
            d = np.array([np.cos(ang), np.sin(ang)]) * length / 2
            a, b = c - d, c + d
            t = int(scale * rng.uniform(0.9, 1.6))
            cv2.line(defect, tuple(map(int, a)), tuple(map(int, b)),
                     float(rng.choice([-1, 1]) * rng.uniform(60, 95)), t, cv2.LINE_AA)
            pad = t / 2 + scale
            boxes.append((kind, *_box(min(a[0], b[0]) - pad, min(a[1], b[1]) - pad,
                                      max(a[0], b[0]) + pad, max(a[1], b[1]) + pad, big)))
        elif CLASSES[kind] == "dent":
            r = big * rng.uniform(0.05, 0.08)
            dx, dy = (xx - c[0]) / r, (yy - c[1]) / r
            bowl = np.exp(-(dx**2 + dy**2) * 1.5)
            light = rng.uniform(0, 2 * np.pi)
            defect += (dx * np.cos(light) + dy * np.sin(light)) * bowl * rng.uniform(75, 110)
            defect -= bowl * 25
            k = 1.2 * r  # where the shading fades into the plate
            boxes.append((kind, *_box(c[0] - k, c[1] - k, c[0] + k, c[1] + k, big)))
        else:  # stain: an irregular blob of overlapping discs, soft-edged, rust coloured
            blob = np.zeros((big, big), np.float32)
            lo, hi = np.array([np.inf, np.inf]), np.array([-np.inf, -np.inf])
            for _ in range(int(rng.integers(3, 7))):
                off = c + rng.normal(0, big * 0.03, 2)
                rad = int(big * rng.uniform(0.03, 0.05))
                cv2.circle(blob, tuple(map(int, off)), rad, 1.0, -1)
                lo, hi = np.minimum(lo, off - rad), np.maximum(hi, off + rad)
            blob = cv2.GaussianBlur(blob, (0, 0), scale * 2.0)
            rust = np.array([rng.uniform(10, 50), rng.uniform(40, 80), rng.uniform(70, 120)])
            alpha = np.clip(blob, 0, 1)[..., None] * rng.uniform(0.6, 0.85)
            plate = plate * (1 - alpha) + rust * alpha
            boxes.append((kind, *_box(lo[0], lo[1], hi[0], hi[1], big)))
    plate += defect[..., None]
    img = img * (1 - m) + plate * m

    bolt_r = big * rng.uniform(0.045, 0.06)
    for bx, by in bolts:
        ctr = (int(bx), int(by))
        head = float(rng.uniform(70, 120))
        cv2.circle(img, ctr, int(bolt_r), (head, head, head + 8), -1, cv2.LINE_AA)
        cv2.circle(img, ctr, int(bolt_r), (head * 0.5,) * 3, scale, cv2.LINE_AA)
        k = int(bolt_r * 0.5)
        cv2.line(img, (ctr[0] - k, ctr[1]), (ctr[0] + k, ctr[1]), (30, 30, 30), scale,
                 cv2.LINE_AA)

    g = rng.uniform(-0.35, 0.35, 2)
    img *= (1 + g[0] * (xx / big - 0.5) + g[1] * (yy / big - 0.5))[..., None]
    img *= rng.uniform(0.7, 1.25) * rng.uniform(0.92, 1.08, 3)
    small = cv2.resize(np.clip(img, 0, 255), (size, size), interpolation=cv2.INTER_AREA)
    sigma = rng.uniform(0, 0.8)
    if sigma > 0.3:
        small = cv2.GaussianBlur(small, (0, 0), sigma)
    small += rng.normal(0, rng.uniform(1, 5), small.shape).astype(np.float32)
    return Sample(np.clip(small, 0, 255).astype(np.uint8),
                  np.array(boxes, np.float32).reshape(-1, 5))


def samples(seed: int, count: int, size: int = 96) -> Iterator[Sample]:
    """`count` samples; same seed, same images and boxes."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield render(rng, size)


def write_folder(directory: str | Path, seed: int, count: int, size: int = 96) -> None:
    """`directory/images/NNNNN.png` and `directory/labels/NNNNN.txt` (YOLO format: one
    `class cx cy w h` line per box, normalised; an empty file for a clean plate): the layout
    `edgerun models prepare --val DIR` reads for a detector."""
    root = Path(directory)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(samples(seed, count, size)):
        cv2.imwrite(str(root / "images" / f"{i:05d}.png"), s.image)
        (root / "labels" / f"{i:05d}.txt").write_text("".join(
            f"{int(b[0])} {b[1]:.6f} {b[2]:.6f} {b[3]:.6f} {b[4]:.6f}\n" for b in s.boxes))


def mosaic(seed: int, grid: int = 2, size: int = 96) -> Sample:
    """`grid` x `grid` plates side by side in one frame (a wide camera over several parts),
    boxes renormalised to the whole frame: the input tiling is for."""
    rng = np.random.default_rng(seed)
    frame = np.zeros((grid * size, grid * size, 3), np.uint8)
    boxes = []
    for gy in range(grid):
        for gx in range(grid):
            s = render(rng, size)
            frame[gy * size:(gy + 1) * size, gx * size:(gx + 1) * size] = s.image
            for c, cx, cy, w, h in s.boxes:
                boxes.append((c, (gx + cx) / grid, (gy + cy) / grid, w / grid, h / grid))
    return Sample(frame, np.array(boxes, np.float32).reshape(-1, 5))
