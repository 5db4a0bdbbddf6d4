"""Several models, one budget (runtime/choice/joint.py): per-model targets with tiles, the box's
joint ladder and which model steps, as tables; and the control step driving it."""

from __future__ import annotations

import itertools
import math

import pytest

from power import control
from power.governor import Decision
from power.rungs import Rung
from power.sensors import Reading
from runtime.choice.joint import (
    Load,
    Stream,
    accuracy,
    joint_ladder,
    locate,
    per_frame,
    power_w,
    step_down,
    targets,
)

# -- per-inference targets --------------------------------------------------------------------


@pytest.mark.parametrize("streams, expected", [
    # one stream, one tile: the operator's target, unchanged
    ([Stream("a", "cls", 10)], {"cls": 20.0}),
    # one stream of a tiled detector: 9 tiles share the frame's 20 ms
    ([Stream("a", "det", 10, tiles=9)], {"det": 20.0 / 9}),
    # two streams, two models: each frame gets 20 / 2 = 10 ms (burst), the detector's 4
    # tiles 2.5 ms each
    ([Stream("a", "cls", 10), Stream("b", "det", 10, tiles=4)], {"cls": 10.0, "det": 2.5}),
    # the thread's capacity binds: 0.8 / 200 Hz = 4 ms per frame, over 2 tiles 2 ms
    ([Stream("a", "cls", 100), Stream("b", "det", 100, tiles=2)], {"cls": 4.0, "det": 2.0}),
    # a model serving two streams takes the stricter (tiled) one
    ([Stream("a", "det", 10), Stream("b", "det", 10, tiles=3), Stream("c", "cls", 10)],
     {"det": 20.0 / 3 / 3, "cls": 20.0 / 3}),
])
def test_each_models_target_is_its_streams_frame_share_over_their_tiles(streams, expected):
    got = targets(20.0, streams)
    assert {k: round(v[0], 6) for k, v in got.items()} == {
        k: round(v, 6) for k, v in expected.items()}
    # whatever the mix, the streams' frames together fit both bounds of the combined load
    burst = sum(s.tiles * got[s.model][0] for s in streams)
    busy = sum(s.rate_hz * s.tiles * got[s.model][0] / 1e3 for s in streams)
    assert burst <= 20.0 + 1e-9 and busy <= 0.8 + 1e-9


def test_a_tiled_streams_reason_says_so():
    why = targets(20.0, [Stream("a", "cls", 10), Stream("big", "det", 10, tiles=4)])["det"][1]
    assert "2 sources at 20 Hz combined" in why
    assert "source big cuts each frame into 4 tiles: each inference must take <= 2.5 ms" in why


def test_per_frame_rungs_count_every_tile():
    r = Rung("v", 0.9, 0.002, 0.004)
    (f,) = per_frame([r], 9)
    assert math.isclose(f.energy_j, 0.018) and math.isclose(f.latency_s, 0.036)
    assert math.isclose(f.power_w(10), 0.18)  # 10 frames/s x 9 tiles x 2 mJ
    assert per_frame([r], 1) == [r]


# -- the joint ladder ---------------------------------------------------------------------------

CLS = (Rung("c-int8", 0.90, 0.001, 0.001), Rung("c-fp16", 0.95, 0.002, 0.001),
       Rung("c-fp32", 0.96, 0.004, 0.001))
DET = (Rung("d-int8", 0.61, 0.010, 0.005), Rung("d-fp32", 0.70, 0.030, 0.008))


def test_the_step_saving_most_watts_per_accuracy_lost_goes_first():
    cls = Load("cls", CLS, infer_hz=10, frames_hz=10)
    det = Load("det", DET, infer_hz=40, frames_hz=10)  # 10 frames x 4 tiles
    # from the top: cls fp32 -> fp16 saves 0.02 W for 0.01 x 1/2 accuracy (4 W per unit);
    # det fp32 -> int8 saves 0.8 W for 0.09 x 1/2 (17.8 W per unit): the detector steps
    assert step_down([cls, det], [2, 1]) == 1
    # then only the classifier can step
    assert step_down([cls, det], [2, 0]) == 0
    assert step_down([cls, det], [0, 0]) is None


def test_the_joint_ladder_is_the_greedy_chain_cheapest_first():
    cls = Load("cls", CLS, infer_hz=10, frames_hz=10)
    det = Load("det", DET, infer_hz=40, frames_hz=10)
    lad = joint_ladder([cls, det], combined_hz=20)
    assert [j.picks for j in lad] == [(0, 0), (1, 0), (2, 0), (2, 1)]
    # stepping up from a rung moves the model the step down moved: the reverse
    assert [j.up for j in lad] == ["cls", "cls", "det", ""]
    top = lad[-1]
    assert math.isclose(power_w([cls, det], top.picks), 10 * 0.004 + 40 * 0.030)
    # as a Rung at the combined frame rate: its power there is the box's dynamic power
    assert math.isclose(top.rung.power_w(20), 1.24)
    assert math.isclose(top.rung.accuracy, (0.96 + 0.70) / 2)
    assert top.rung.variant_id == "cls=c-fp32 + det=d-fp32"
    # energies fall down the ladder (the control step's levels rely on it)
    assert all(a.rung.energy_j <= b.rung.energy_j for a, b in itertools.pairwise(lad))


@pytest.mark.parametrize("cls_frames, det_frames, first", [
    # accuracy counts by frames inspected: a classifier on 90 % of the frames loses more
    # box accuracy per step, so the detector still steps first (it saves far more watts)
    (90, 10, "det"),
    # a detector on 4 % of frames but a classifier whose step loses nothing: free, first
    (1, 1, "det"),
])
def test_the_stepping_model_depends_on_watts_and_weighted_accuracy(cls_frames, det_frames,
                                                                   first):
    cls = Load("cls", CLS, infer_hz=cls_frames, frames_hz=cls_frames)
    det = Load("det", DET, infer_hz=det_frames * 4, frames_hz=det_frames)
    lad = joint_ladder([cls, det], cls_frames + det_frames)
    assert lad[-2].up == first


def test_a_step_that_loses_no_accuracy_is_taken_first_and_one_saving_nothing_last():
    free = (Rung("a0", 0.9, 0.001, 0.001), Rung("a1", 0.9, 0.002, 0.001))
    useless = (Rung("b0", 0.5, 0.003, 0.001), Rung("b1", 0.9, 0.003, 0.001))
    costly = (Rung("c0", 0.5, 0.001, 0.001), Rung("c1", 0.9, 0.005, 0.001))
    loads = [Load("a", free, 10, 10), Load("b", useless, 10, 10), Load("c", costly, 10, 10)]
    lad = joint_ladder(loads, 30)
    assert [j.up for j in lad][::-1][1:] == ["a", "c", "b"]  # steps down in this order


def test_one_model_gives_its_own_ladder_back():
    lad = joint_ladder([Load("cls", CLS, 10, 10)], 10)
    assert [j.picks for j in lad] == [(0,), (1,), (2,)]
    assert [j.rung.energy_j for j in lad] == [r.energy_j for r in CLS]
    assert accuracy([Load("cls", CLS, 10, 10)], (1,)) == 0.95


def test_the_control_step_drives_the_joint_ladder_under_a_box_budget():
    """A budget in watts for the whole box: the control step picks the joint rung whose
    summed power fits, which steps the detector down first."""
    cls = Load("cls", CLS, infer_hz=10, frames_hz=10)
    det = Load("det", DET, infer_hz=40, frames_hz=10)
    lad = joint_ladder([cls, det], 20)
    rungs = [j.rung for j in lad]
    cfg = control.ControlConfig(governor=None, rate_hz=20, dwell_s=0)
    reading = Reading(t=0.0, temp_c=None)
    for budget, expect in ((math.inf, (2, 1)), (1.0, (2, 0)), (0.43, (1, 0)), (0.3, (0, 0))):
        _, out = control.step(control.ControlState(), reading, rungs, cfg, len(rungs) - 1,
                              extra=Decision(budget, reason="test budget"))
        assert lad[out.rung].picks == expect, (budget, out)
        assert power_w([cls, det], lad[out.rung].picks) <= budget or out.rung == 0


def test_the_running_rungs_are_located_on_the_box_ladder_or_under_it():
    cls = Load("cls", CLS, infer_hz=10, frames_hz=10)
    det = Load("det", DET, infer_hz=40, frames_hz=10)
    lad = joint_ladder([cls, det], 20)  # (0,0) (1,0) (2,0) (2,1)
    assert locate(lad, (2, 0)) == (2, True)
    # (1, 1) is not on the chain (live energies reordered it): the richest box rung needing
    # no model richer than now is (1, 0); the daemon moves the detector down to it
    assert locate(lad, (1, 1)) == (1, False)
    assert locate(lad, (0, 1)) == (0, False)


def test_no_step_down_the_box_ladder_raises_its_power():
    """Live energies can make a model's cheaper rung cost more than the one above it (it ran
    hot, the other was never run). Stepping onto it would raise the box's power on a step
    *down*: the chain skips it (the model goes from 3 to 1), and power never rises going
    down, whatever the mix (a table over reordered ladders)."""
    hot = (Rung("h0", 0.80, 0.001, 0.001), Rung("h1", 0.90, 0.006, 0.001),
           Rung("h2", 0.95, 0.004, 0.001))  # h1 ran hot: more than the top rung
    lad = joint_ladder([Load("cls", CLS, 10, 10), Load("hot", hot, 10, 10)], 20)
    assert all(j.picks[1] != 1 for j in lad)  # h1 is never stepped onto
    for rungs in itertools.permutations([0.001, 0.006, 0.004, 0.002]):
        odd = tuple(Rung(f"o{i}", 0.8 + 0.05 * i, e, 0.001) for i, e in enumerate(rungs))
        loads = [Load("cls", CLS, 10, 10), Load("odd", odd, 30, 10)]
        lad = joint_ladder(loads, 20)
        watts = [power_w(loads, j.picks) for j in lad]
        assert watts == sorted(watts), (rungs, watts)
        assert lad[-1].picks == (len(CLS) - 1, len(odd) - 1)  # the top is the choice
