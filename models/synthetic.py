"""Procedural factory-inspection images: a machined plate with four bolts on a conveyor.

Synthetic data, made with OpenCV only, deterministic by seed. One image is a BGR uint8 frame
of a part under varied lighting, pose, scale, background, noise and blur, with at most one
defect:

- ``ok``            no defect;
- ``scratch``       one or two thin bright/dark strokes across the plate;
- ``dent``          a small shaded crater (dark rim on one side, highlight on the other);
- ``stain``         an irregular soft-edged dark or rust-coloured blob;
- ``missing_part``  one of the four bolts absent (its bare hole shows instead).

The training recipe (models/recipes/inspection) and the daemon's synthetic conveyor source
both draw from here, so the frames the demo inspects come from the distribution the bundled
model was trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cv2
import numpy as np

CLASSES: tuple[str, ...] = ("ok", "scratch", "dent", "stain", "missing_part")


@dataclass(frozen=True)
class Sample:
    """One generated frame and its class index into CLASSES."""

    image: np.ndarray  # HxWx3 uint8, BGR
    label: int


@cache
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinate grids (yy, xx) as float32, shared read-only between renders."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    yy.flags.writeable = xx.flags.writeable = False
    return yy, xx


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Conveyor belt: a base colour with stripes or speckle texture."""
    base = rng.uniform(20, 110, 3)
    img = np.empty((size, size, 3), np.float32)
    img[:] = base
    kind = rng.integers(3)
    if kind == 0:  # belt stripes
        period = rng.uniform(4, 14)
        angle = rng.uniform(0, np.pi)
        yy, xx = _grid(size)
        phase = (xx * np.cos(angle) + yy * np.sin(angle)) / period
        img += (np.sin(phase * 2 * np.pi) * rng.uniform(4, 15))[..., None]
    elif kind == 1:  # rubber speckle
        speckle = rng.normal(0, rng.uniform(4, 12), (size // 4, size // 4)).astype(np.float32)
        img += cv2.resize(speckle, (size, size), interpolation=cv2.INTER_LINEAR)[..., None]
    return img


def _plate_geometry(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[tuple]]:
    """A rotated rounded rectangle polygon and its four bolt centres, in pixels."""
    cx, cy = size / 2 + rng.uniform(-0.08, 0.08, 2) * size
    w = size * rng.uniform(0.52, 0.68)
    h = w * rng.uniform(0.65, 1.0)
    angle = rng.uniform(0, 360)
    rect = ((float(cx), float(cy)), (float(w), float(h)), float(angle))
    box = cv2.boxPoints(rect)
    inset = 0.22
    k = 1 - inset * 2 / 1.4  # bolts sit inset from the corners
    corners = [(cx + (px - cx) * k, cy + (py - cy) * k) for px, py in box]
    return box, corners


def render(rng: np.random.Generator, label: int, size: int = 96) -> np.ndarray:
    """Draw one part with defect class `label` (an index into CLASSES); returns BGR uint8."""
    scale = 4  # draw at 4x and downsample: anti-aliased thin scratches and round bolts
    big = size * scale
    img = _background(rng, big)
    box, bolts = _plate_geometry(rng, big)

    # Plate: brushed metal with a lighting gradient across it.
    mask = np.zeros((big, big), np.uint8)
    cv2.fillConvexPoly(mask, box.astype(np.int32), 255)
    mask = cv2.GaussianBlur(mask, (0, 0), scale * 0.8)  # rounded, soft edges
    metal = rng.uniform(140, 215)
    tint = rng.uniform(-12, 12, 3)
    plate = np.empty_like(img)
    plate[:] = metal + tint
    brush = rng.normal(0, 5, (big, 1)).astype(np.float32)
    plate += cv2.resize(brush, (big, big))[..., None]
    m = mask.astype(np.float32)[..., None] / 255.0

    defect = np.zeros((big, big), np.float32)  # additive luminance of the defect
    colour_defect = None
    bolt_r = big * rng.uniform(0.045, 0.06)
    missing = int(rng.integers(4)) if CLASSES[label] == "missing_part" else -1

    if CLASSES[label] == "scratch":
        for _ in range(int(rng.integers(1, 3))):
            p0 = np.array(bolts[int(rng.integers(4))]) * 0.3 + np.mean(box, 0) * 0.7
            ang = rng.uniform(0, np.pi)
            length = big * rng.uniform(0.18, 0.32)
            d = np.array([np.cos(ang), np.sin(ang)]) * length / 2
            a = p0 - d + rng.uniform(-0.05, 0.05, 2) * big
            b = p0 + d
            cv2.line(defect, tuple(map(int, a)), tuple(map(int, b)),
                     float(rng.choice([-1, 1]) * rng.uniform(55, 90)),
                     int(scale * rng.uniform(0.8, 1.6)), cv2.LINE_AA)
    elif CLASSES[label] == "dent":
        c = np.mean(box, 0) + rng.uniform(-0.12, 0.12, 2) * big
        r = big * rng.uniform(0.05, 0.08)
        yy, xx = _grid(big)
        dx, dy = (xx - c[0]) / r, (yy - c[1]) / r
        bowl = np.exp(-(dx**2 + dy**2) * 1.5)
        light = rng.uniform(0, 2 * np.pi)
        defect += (dx * np.cos(light) + dy * np.sin(light)) * bowl * rng.uniform(70, 110)
        defect -= bowl * 25
    elif CLASSES[label] == "stain":
        c = np.mean(box, 0) + rng.uniform(-0.15, 0.15, 2) * big
        blob = np.zeros((big, big), np.float32)
        for _ in range(int(rng.integers(3, 7))):
            off = c + rng.normal(0, big * 0.035, 2)
            cv2.circle(blob, tuple(map(int, off)), int(big * rng.uniform(0.03, 0.06)), 1.0, -1)
        blob = cv2.GaussianBlur(blob, (0, 0), scale * 2.5)
        rust = np.array([rng.uniform(10, 50), rng.uniform(40, 80), rng.uniform(70, 120)])
        colour_defect = (np.clip(blob, 0, 1)[..., None] * rng.uniform(0.55, 0.85), rust)

    plate += defect[..., None]
    if colour_defect is not None:
        alpha, rust = colour_defect
        plate = plate * (1 - alpha) + rust * alpha
    img = img * (1 - m) + plate * m

    # Bolts (or the bare hole where one is missing).
    for i, (bx, by) in enumerate(bolts):
        centre = (int(bx), int(by))
        if i == missing:
            cv2.circle(img, centre, int(bolt_r * 0.55), (18, 18, 18), -1, cv2.LINE_AA)
            continue
        head = float(rng.uniform(70, 120))
        cv2.circle(img, centre, int(bolt_r), (head, head, head + 8), -1, cv2.LINE_AA)
        cv2.circle(img, centre, int(bolt_r), (head * 0.5,) * 3, scale, cv2.LINE_AA)
        k = int(bolt_r * 0.5)
        cv2.line(img, (centre[0] - k, centre[1]), (centre[0] + k, centre[1]), (30, 30, 30),
                 scale, cv2.LINE_AA)

    # Lighting: a linear gradient, global gain and colour cast.
    yy, xx = _grid(big)
    g = rng.uniform(-0.35, 0.35, 2)
    img *= (1 + g[0] * (xx / big - 0.5) + g[1] * (yy / big - 0.5))[..., None]
    img *= rng.uniform(0.7, 1.25) * rng.uniform(0.92, 1.08, 3)

    small = cv2.resize(np.clip(img, 0, 255), (size, size), interpolation=cv2.INTER_AREA)
    sigma = rng.uniform(0, 0.9)
    if sigma > 0.3:  # focus blur
        small = cv2.GaussianBlur(small, (0, 0), sigma)
    small += rng.normal(0, rng.uniform(1, 6), small.shape).astype(np.float32)  # sensor noise
    return np.clip(small, 0, 255).astype(np.uint8)


def samples(seed: int, count: int, size: int = 96) -> Iterator[Sample]:
    """`count` samples, classes balanced in a seeded shuffled order; same seed, same images."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(CLASSES)
    rng.shuffle(labels)
    for label in labels:
        yield Sample(render(rng, int(label), size), int(label))


def dataset(seed: int, count: int, size: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """Arrays (N,H,W,3 uint8 BGR; N int64 labels) for `count` samples."""
    images = np.empty((count, size, size, 3), np.uint8)
    labels = np.empty(count, np.int64)
    for i, s in enumerate(samples(seed, count, size)):
        images[i], labels[i] = s.image, s.label
    return images, labels


def write_folder(directory: str | Path, seed: int, count: int, size: int = 96) -> None:
    """Write `count` PNGs into `directory/<class>/NNNNN.png` (the layout `models prepare` reads)."""
    root = Path(directory)
    for i, s in enumerate(samples(seed, count, size)):
        d = root / CLASSES[s.label]
        d.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(d / f"{i:05d}.png"), s.image)
