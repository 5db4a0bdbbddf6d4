"""Tiling: a frame much larger than the model input is cut into overlapping tiles, each tile
inferred at the model's resolution, and the detections mapped back to the frame and merged.

Configured under `[model]` (docs/detectors.md "Tiling"): `tiling = true`, `tile_size` (pixels
of the frame per tile side; 0 = the model input's own size, so the model sees the frame at
full resolution) and `tile_overlap` (fraction of a tile shared with its neighbour; an object
smaller than the overlap is whole in at least one tile). A frame that fits in one tile is not
tiled. Tiles never exceed `MAX_TILES` per frame: past that the tiles grow (fewer, each resized
down), so a 4K frame cannot cost hundreds of inferences.

Merging: within a tile the model's NMS has run; across tiles, a box is merged into a
higher-scoring box of the same class from another tile when their IoU exceeds the IoU
threshold or when the smaller lies mostly inside the other (a defect cut by a tile edge is a
partial box inside the whole one), the kept box growing to cover both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.engine.detection import Detections, DetectSpec, detect, iou

MAX_TILES = 64
CONTAINED = 0.6  # intersection over the smaller box above which two tiles' boxes are one object


@dataclass(frozen=True)
class TileSpec:
    """`[model] tiling`, `tile_size`, `tile_overlap`."""

    size: int = 0  # 0: the model input's size
    overlap: float = 0.2


Tile = tuple[int, int, int, int]  # x0, y0, x1, y1 in frame pixels


def _starts(length: int, tile: int, overlap: float) -> list[int]:
    """Evenly spread tile starts covering 0..length with at least `overlap` shared."""
    if length <= tile:
        return [0]
    step = max(1, int(tile * (1 - overlap)))
    n = math.ceil((length - tile) / step) + 1
    return [round(i * (length - tile) / (n - 1)) for i in range(n)]


def tile_grid(frame_hw: tuple[int, int], input_hw: tuple[int, int], spec: TileSpec
              ) -> list[Tile]:
    """The tiles of a frame, row by row. One tile (the whole frame) when the frame fits in a
    tile. Tiles keep the model input's aspect ratio; above MAX_TILES they grow."""
    fh, fw = frame_hw
    ih, iw = input_hw
    th, tw = (spec.size * ih // max(ih, iw), spec.size * iw // max(ih, iw)) if spec.size else (
        ih, iw)
    th, tw = max(th, 1), max(tw, 1)
    if fh <= th * 1.0 and fw <= tw * 1.0:
        return [(0, 0, fw, fh)]
    while True:
        th_, tw_ = min(th, fh), min(tw, fw)
        ys, xs = _starts(fh, th_, spec.overlap), _starts(fw, tw_, spec.overlap)
        if len(ys) * len(xs) <= MAX_TILES:
            return [(x, y, x + tw_, y + th_) for y in ys for x in xs]
        th, tw = math.ceil(th * 1.25), math.ceil(tw * 1.25)


def tiles_of(frame: np.ndarray, tiles: list[Tile]) -> list[np.ndarray]:
    """The tiles' pixels (views, no copy)."""
    return [frame[y0:y1, x0:x1] for x0, y0, x1, y1 in tiles]


def to_frame(d: Detections, tile: Tile, frame_hw: tuple[int, int]) -> Detections:
    """A tile's boxes (normalised to the tile) normalised to the whole frame."""
    x0, y0, x1, y1 = tile
    fh, fw = frame_hw
    scale = np.array([(x1 - x0) / fw, (y1 - y0) / fh] * 2, np.float32)
    offset = np.array([x0 / fw, y0 / fh] * 2, np.float32)
    return Detections(d.boxes * scale + offset, d.scores, d.classes)


def merge(per_tile: list[Detections], tiles: list[Tile], frame_hw: tuple[int, int],
          iou_threshold: float, max_detections: int = 300) -> Detections:
    """Every tile's detections in frame coordinates, merged across tiles (module doc)."""
    parts = [to_frame(d, t, frame_hw) for d, t in zip(per_tile, tiles, strict=True)]
    if not parts or not sum(len(p) for p in parts):
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32),
                          np.zeros(0, np.int64))
    boxes = np.concatenate([p.boxes for p in parts]).astype(np.float32)
    scores = np.concatenate([p.scores for p in parts])
    classes = np.concatenate([p.classes for p in parts])
    source = np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)])
    order = np.argsort(-scores, kind="stable")
    boxes, scores, classes, source = boxes[order], scores[order], classes[order], source[order]
    overlap = iou(boxes, boxes)
    area = np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(1)
    lt = np.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = np.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    smaller = np.maximum(np.minimum(area[:, None], area[None, :]), 1e-12)
    contained = inter / smaller
    absorbed = np.zeros(len(scores), bool)
    keep_boxes, keep = [], []
    for i in range(len(scores)):
        if absorbed[i]:
            continue
        same = (classes == classes[i]) & ~absorbed
        same[i] = False
        hit = same & ((overlap[i] > iou_threshold)
                      | ((source != source[i]) & (contained[i] > CONTAINED)))
        box = boxes[i].copy()
        cross = hit & (source != source[i])
        if cross.any():  # the same object seen by two tiles: cover both views
            box[:2] = np.minimum(box[:2], boxes[cross, :2].min(0))
            box[2:] = np.maximum(box[2:], boxes[cross, 2:].max(0))
        absorbed |= hit
        absorbed[i] = True
        keep.append(i)
        keep_boxes.append(box)
        if len(keep) >= max_detections:
            break
    return Detections(np.array(keep_boxes, np.float32).reshape(-1, 4), scores[keep],
                      classes[keep])


class Tiler:
    """Preprocessing for tiled frames: wraps the model's preprocessing (any callable of
    (image, input shape) -> tensor) so a large frame becomes a batch of tile tensors.
    `input_hw(shape)` is the (H, W) tiles are cut for (Manifest.tile_hw: the same for every
    rung of a ladder); each tile is then resized to the variant's own input."""

    def __init__(self, pre: Callable[[np.ndarray, tuple[int, ...]], Any], spec: TileSpec,
                 input_hw: Callable[[tuple[int, ...]], tuple[int, int]]):
        self._pre, self.spec, self._hw = pre, spec, input_hw

    def __call__(self, image: np.ndarray, shape: tuple[int, ...]) -> Any:
        """One tensor for a frame that fits, else the tiles' tensors stacked on the batch."""
        tiles = tile_grid(image.shape[:2], self._hw(shape), self.spec)
        if len(tiles) == 1:
            return self._pre(image, shape)
        return np.concatenate([self._pre(np.ascontiguousarray(t), shape)
                               for t in tiles_of(image, tiles)])


def infer_tiles(session: Any, tensor: np.ndarray) -> np.ndarray:
    """Run a batch of tiles one by one on a batch-1 session; outputs stacked on the batch.
    A single tensor runs as it is."""
    if getattr(tensor, "shape", (1,))[0] == 1:
        return session.infer(tensor)
    return np.concatenate([session.infer(tensor[i:i + 1]) for i in range(len(tensor))])


def detect_frame(out: np.ndarray, spec: DetectSpec, tiling: TileSpec | None,
                 frame_hw: tuple[int, int], input_hw: tuple[int, int], n_classes: int | None,
                 tile_hw: tuple[int, int] | None = None) -> Detections:
    """A frame's detections from its output: one image, or one row per tile (in
    `tile_grid`'s order) merged across tiles. `input_hw` is the variant's input (boxes are
    normalised by it); `tile_hw` what the tiles were cut for (Manifest.tile_hw; default
    `input_hw`)."""
    tiles = tile_grid(frame_hw, tile_hw or input_hw, tiling) if tiling is not None else []
    if len(tiles) <= 1:
        return detect(out, spec, input_hw, n_classes)
    rows = np.asarray(out)
    if rows.shape[0] != len(tiles):
        raise ValueError(f"{rows.shape[0]} outputs for {len(tiles)} tiles")
    per_tile = [detect(rows[i:i + 1], spec, input_hw, n_classes) for i in range(len(tiles))]
    return merge(per_tile, tiles, frame_hw, spec.iou_threshold, spec.max_detections)


def tiled(pre: Callable[[np.ndarray, tuple[int, ...]], Any], manifest: Any
          ) -> Callable[[np.ndarray, tuple[int, ...]], Any]:
    """`pre` wrapped in a Tiler when `manifest` (runtime.engine.manifest.Manifest) is a detector
    with tiling on; `pre` itself otherwise."""
    if getattr(manifest, "detect", None) is None or getattr(manifest, "tiling", None) is None:
        return pre
    return Tiler(pre, manifest.tiling, manifest.tile_hw)
