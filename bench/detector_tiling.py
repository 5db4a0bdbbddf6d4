"""Tiling on the bundled defect detector: mAP@0.5 on frames of several plates (2x2 and 3x3
plates, 192 and 288 px, for a 96x96 model), the whole frame resized to the input vs tiled.

Usage: python bench/detector_tiling.py [--frames 60] [--variant fp32]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime as ort

from models import bundled
from models.recipes.defects.data import mosaic
from runtime.engine.detection import mean_ap
from runtime.engine.manifest import load_manifest
from runtime.engine.tiling import TileSpec, detect_frame, infer_tiles, tiled


def main() -> None:
    """Print one line per (grid, mode)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--variant", default="fp32")
    a = ap.parse_args()
    m = load_manifest(bundled("defects"))
    v = m.variant(a.variant)
    sess = ort.InferenceSession(str(m.path(v)), providers=["CPUExecutionProvider"])

    class Session:
        def infer(self, x: np.ndarray) -> np.ndarray:
            return sess.run(None, {v.input_name: x})[0]

    spec = replace(m.detect, score_threshold=0.001)  # the mAP protocol: rank everything
    hw = m.preprocess.hw(v.input_shape)
    for grid in (1, 2, 3):
        for name, tiles in (("whole frame resized", None),
                            ("tiled, overlap 0.25", TileSpec(overlap=0.25))):
            pre = tiled(m.preprocess.apply, replace(m, tiling=tiles))
            preds, truths = [], []
            for seed in range(a.frames):
                s = mosaic(9000 + seed, grid=grid, size=hw[0])
                out = infer_tiles(Session(), pre(s.image, v.input_shape))
                preds.append(detect_frame(out, spec, tiles, s.image.shape[:2], hw,
                                          len(m.labels)))
                b = s.boxes
                truths.append((np.stack([b[:, 1] - b[:, 3] / 2, b[:, 2] - b[:, 4] / 2,
                                         b[:, 1] + b[:, 3] / 2, b[:, 2] + b[:, 4] / 2], 1),
                               b[:, 0].astype(np.int64)))
            side = hw[0] * grid
            print(f"{grid}x{grid} plates ({side}x{side} frames), {name}: "
                  f"mAP@0.5 {mean_ap(preds, truths):.4f}")


if __name__ == "__main__":
    main()
