"""Tiling: the grid of overlapping tiles, tile -> frame coordinates, the merge across tiles,
and a real detector on a frame four times its input, tiled and not."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from support.modelgen import blob_frame, tiny_detector

from runtime.engine.detection import Detections
from runtime.engine.manifest import configured_model, frame_result, load_model
from runtime.engine.tiling import (
    MAX_TILES,
    Tiler,
    TileSpec,
    infer_tiles,
    merge,
    tile_grid,
    tiled,
    to_frame,
)


@pytest.mark.parametrize(("frame", "inp", "spec", "xs", "ys"), [
    ((64, 64), (64, 64), TileSpec(), [0], [0]),  # fits: one tile, the whole frame
    ((60, 40), (64, 64), TileSpec(), [0], [0]),  # smaller: one tile
    ((128, 128), (64, 64), TileSpec(overlap=0.2), [0, 32, 64], [0, 32, 64]),
    ((128, 128), (64, 64), TileSpec(overlap=0.0), [0, 64], [0, 64]),
    ((96, 160), (64, 64), TileSpec(overlap=0.25), [0, 48, 96], [0, 32]),
    ((300, 300), (64, 64), TileSpec(size=128, overlap=0.2), [0, 86, 172], [0, 86, 172]),
    ((64, 200), (32, 64), TileSpec(overlap=0.2), [0, 45, 91, 136], [0, 16, 32]),  # aspect kept
])
def test_tile_grid_table(frame, inp, spec, xs, ys):
    tiles = tile_grid(frame, inp, spec)
    assert sorted({t[0] for t in tiles}) == xs and sorted({t[1] for t in tiles}) == ys
    assert len(tiles) == len(xs) * len(ys)
    th, tw = tiles[0][3] - tiles[0][1], tiles[0][2] - tiles[0][0]
    assert all((t[3] - t[1], t[2] - t[0]) == (th, tw) for t in tiles)  # one size
    # the tiles cover the frame, and neighbours share at least the overlap
    assert max(t[2] for t in tiles) == frame[1] and max(t[3] for t in tiles) == frame[0]
    for starts, size in ((xs, tw), (ys, th)):
        for a, b in itertools.pairwise(starts):
            assert size - (b - a) >= int(size * spec.overlap) - 1


def test_a_huge_frame_gets_bigger_tiles_not_hundreds():
    tiles = tile_grid((3000, 4000), (64, 64), TileSpec())
    assert 1 < len(tiles) <= MAX_TILES
    assert max(t[2] for t in tiles) == 4000 and max(t[3] for t in tiles) == 3000


@pytest.mark.parametrize(("box", "tile", "frame", "want"), [
    ((0, 0, 1, 1), (0, 0, 64, 64), (128, 128), (0, 0, .5, .5)),
    ((0, 0, 1, 1), (64, 64, 128, 128), (128, 128), (.5, .5, 1, 1)),
    ((.25, .5, .75, 1), (32, 0, 96, 64), (64, 128), (.375, .5, .625, 1)),
])
def test_tile_boxes_to_frame(box, tile, frame, want):
    d = Detections(np.array([box], np.float32), np.array([.9], np.float32), np.array([0]))
    assert np.allclose(to_frame(d, tile, frame).boxes, [want])


def _d(*rows):
    a = np.array(rows, np.float32).reshape(-1, 6)
    return Detections(a[:, :4], a[:, 4], a[:, 5].astype(np.int64))


TILES = [(0, 0, 64, 64), (32, 0, 96, 64)]  # two tiles sharing x 32..64 of a 64x96 frame
FRAME = (64, 96)


@pytest.mark.parametrize(("per_tile", "want"), [
    # one object wholly in the overlap, seen by both tiles: one box
    ([_d((.6, .2, .9, .5, .9, 0)), _d((.1, .2, .4, .5, .8, 0))],
     [((.6 * 64) / 96, .2, (.9 * 64) / 96, .5, .9, 0)]),
    # an object cut by tile 0's right edge (a partial box there) and whole in tile 1: one
    # box covering the whole object, the higher score kept
    ([_d((.8, .2, 1.0, .5, .95, 1)), _d((.3, .2, .9, .5, .7, 1))],
     [((.8 * 64) / 96, .2, (32 + .9 * 64) / 96, .5, .95, 1)]),
    # same place, different classes: both kept
    ([_d((.6, .2, .9, .5, .9, 0)), _d((.1, .2, .4, .5, .8, 1))],
     [((.6 * 64) / 96, .2, (.9 * 64) / 96, .5, .9, 0),
      ((32 + .1 * 64) / 96, .2, (32 + .4 * 64) / 96, .5, .8, 1)]),
    # two objects side by side in one tile (NMS already kept both): not merged
    ([_d((.1, .1, .3, .3, .9, 0), (.3, .1, .5, .3, .8, 0)), _d()],
     [((.1 * 64) / 96, .1, (.3 * 64) / 96, .3, .9, 0),
      ((.3 * 64) / 96, .1, (.5 * 64) / 96, .3, .8, 0)]),
    ([_d(), _d()], []),
])
def test_merge_across_tiles_table(per_tile, want):
    m = merge(per_tile, TILES, FRAME, iou_threshold=0.45)
    got = [(*b, s, c) for b, s, c in zip(m.boxes.tolist(), m.scores.tolist(),
                                           m.classes.tolist(), strict=True)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-5)


def test_a_detector_finds_small_objects_in_a_large_frame_only_when_tiled(tmp_path):
    model = tiny_detector(tmp_path / "d.onnx", hw=(64, 64), stride=16)
    plain = load_model(model, labels=("red", "green"))
    tiled_m = replace(plain, tiling=TileSpec(overlap=0.25))
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    class Session:  # the engine Session interface: first output only
        def infer(self, x):
            return sess.run(None, {"x": x})[0]

    cells = [(1, 1, 0), (5, 10, 1), (14, 3, 0), (9, 9, 1)]  # 16 px blobs in a 256x256 frame
    frame = blob_frame((256, 256), cells)
    shape = (1, 3, 64, 64)
    whole = frame_result(infer_tiles(Session(), plain.preprocess.apply(frame, shape)), plain,
                         frame.shape[:2], shape)
    assert whole["boxes"] == []  # shrunk 4x to the input, each blob is a quarter of a cell
    pre = tiled(tiled_m.preprocess.apply, tiled_m)
    assert isinstance(pre, Tiler) and tiled(plain.preprocess.apply, plain) is not pre
    batch = pre(frame, shape)
    assert batch.shape == (len(tile_grid((256, 256), (64, 64), TileSpec(overlap=0.25))), 3, 64,
                           64)
    r = frame_result(infer_tiles(Session(), batch), tiled_m, frame.shape[:2], shape)
    found = sorted((round(b["y"] * 16 - .5), round(b["x"] * 16 - .5), b["label"])
                   for b in r["boxes"])
    assert found == sorted((row, col, ("red", "green")[k]) for row, col, k in cells)
    assert all(b["w"] == pytest.approx(1 / 16) and b["h"] == pytest.approx(1 / 16)
               for b in r["boxes"])  # frame coordinates, merged: one box per blob
    assert r["counts"] == {"red": 2, "green": 2}


def test_tiling_config_applies_to_detectors_only(tmp_path, caplog):
    from support.modelgen import tiny_cnn

    from runtime.config import from_dict

    det = tiny_detector(tmp_path / "d.onnx")
    cfg = from_dict({"model": {"path": str(det), "tiling": True, "tile_size": 128,
                               "tile_overlap": 0.3}}).model
    assert configured_model(det, cfg).tiling == TileSpec(128, 0.3)
    cls = tiny_cnn(tmp_path / "c.onnx")
    assert configured_model(cls, replace(cfg, path=str(cls))).tiling is None
    assert "tiling is for detectors" in caplog.text
