"""Review R4 of the detector ladder (H27)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_detector_ladder import ladder  # noqa: F401 (fixture)

from runtime.manifest import load_manifest
from runtime.prepare import reduced_hw


def test_a_prefix_model_at_the_reduced_size_cuts_its_own_tiles(ladder):  # noqa: F811
    """Old code: Manifest.tile_hw gathered the sources of every variant of the shape: a
    `--prefix` model made at the size another model's reduced form has (a YOLO at 416 beside
    one at 640, whose reduced form is 416) cut tiles at the other model's 640 and resized
    each down to 416: every tiled frame it saw was scaled by 2/3, which its measurement
    (whole val images) never showed. Its own full size wins now; a reduced rung alone
    still cuts the full-resolution tiles."""
    out, _ = ladder
    m = load_manifest(out)
    r64 = m.variant("fp32-r64")
    assert m.tile_hw(r64.input_shape) == (96, 96)  # the reduced rung alone: full tiles
    small = replace(r64, name="small-fp32", source="small.onnx")
    small_r = replace(r64, name="small-fp32-r32", source="small.onnx", input_shape=(1, 3, 32, 32))
    m2 = replace(m, variants=(*m.variants, small, small_r))
    assert m2.tile_hw(small.input_shape) == (64, 64)
    assert m2.tile_hw(small_r.input_shape) == (64, 64)  # the small model's reduced rung
    assert m2.tile_hw(m.variant("fp32").input_shape) == (96, 96)


@pytest.mark.parametrize("hw, multiple, want", [
    ((12, 96), 8, (12, 64)),  # old: (16, 64): the reduced form 16 px tall, the model 12
    ((8, 8), 8, (8, 8)),
    ((96, 20), 32, (64, 20)),  # old: (64, 32)
    ((640, 480), 32, (416, 320)),
    ((100, 100), 8, (64, 64)),
])
def test_reduced_hw_never_grows_a_side(hw, multiple, want):
    """Old code: a side under 16 (or under `multiple`) came out larger than the model's own:
    a "reduced" rung taller (or wider) than the full-resolution form, named r16 for a 12 px
    model."""
    assert reduced_hw(hw, multiple) == want
