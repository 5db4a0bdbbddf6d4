"""Table tests for choosing the whole per-frame configuration by the box's energy per frame
(runtime/choice/frame_cost.py, the box branch of runtime/choice/selector.py, and the ladder below a
top chosen by the box, runtime/choice/ladders.py)."""

from __future__ import annotations

import math

import pytest

from runtime.choice.frame_cost import FrameCosts, PrePath, figure, sustained_hz
from runtime.choice.ladders import build_ladder
from runtime.choice.selector import Constraints, Profile, select
from runtime.config import ConfigError, build


def P(vid: str, form: str, p95: float, mj: float, acc: float = 0.97) -> Profile:
    return Profile(vid, form, "fp32", "onnxruntime", "CPU", 1, p50_ms=p95 * 0.8, p95_ms=p95,
                   p99_ms=p95 * 1.2, runs=100, energy_mj=mj, energy_source="estimated",
                   accuracy=acc)


CPU_BIG = PrePath("cpu", 2.0, 1.0)  # a large input's preprocessing
CPU_SMALL = PrePath("cpu", 0.5, 0.3)
OCL = PrePath("opencl:0", 0.2, 2.5)  # less CPU energy, more wall time (a slow iGPU queue)

def pre(*paths: PrePath) -> dict[str, tuple[PrePath, ...]]:
    """The same measured paths for every variant a case names."""
    return {v: paths for v in ("a", "b", "slow", "fast", "fp32", "int8", "hi", "lo")}


CASES = [
    # (name, profiles, constraints, expected (variant, pre path), met, phrase in the reason)
    ("the model's cheapest loses to a cheaper frame: preprocessing counts",
     [P("big", "full", 4, 1.0), P("small", "reduced", 5, 1.5)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 3.0, 2.0,
                                      {"big": (CPU_BIG,), "small": (CPU_SMALL,)})),
     ("small", "cpu"), True, "lowest box energy"),
    ("an end-to-end target excludes what meets the inference one",
     [P("slow", "m", 12, 1.0), P("fast", "m", 6, 2.0)],
     Constraints(20, end_to_end_ms=15,
                 frame=FrameCosts(0.0, 10.0, 3.0, 4.0, pre(CPU_SMALL))),
     ("fast", "cpu"), True, "end to end <= 15 ms"),
    ("the same without the end-to-end target: inference alone is judged",
     [P("slow", "m", 12, 1.0), P("fast", "m", 6, 2.0)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 3.0, 4.0, pre(CPU_SMALL))),
     ("slow", "cpu"), True, "inference <= 20 ms"),
    ("a backlog: the idle floor favours the faster variant",
     [P("slow", "m", 10, 1.0), P("fast", "m", 2, 2.0)],
     Constraints(50, frame=FrameCosts(5.0, 0.0, 0.1, 0.1, pre(CPU_SMALL))),
     ("fast", "cpu"), True, "idle share"),
    ("a fixed rate both sustain: the idle share is the same, the model decides",
     [P("slow", "m", 10, 1.0), P("fast", "m", 2, 2.0)],
     Constraints(50, frame=FrameCosts(5.0, 10.0, 0.1, 0.1, pre(CPU_SMALL))),
     ("slow", "cpu"), True, "idle share"),
    ("the cheaper preprocessing path is chosen with the variant",
     [P("a", "m", 4, 1.0)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, pre(CPU_SMALL, OCL))),
     ("a", "opencl:0"), True, "preprocess opencl:0"),
    ("the end-to-end target can need the faster, dearer path",
     [P("a", "m", 4, 1.0)],
     Constraints(20, end_to_end_ms=6.0,
                 frame=FrameCosts(0.0, 10.0, 1.0, 1.0, pre(CPU_SMALL, OCL))),
     ("a", "cpu"), True, "end to end <= 6 ms"),
    ("tiles multiply inference and preprocessing: the target is per frame",
     [P("a", "m", 4, 1.0), P("b", "m", 1.5, 3.0)],
     Constraints(20, end_to_end_ms=15,
                 frame=FrameCosts(0.0, 2.0, 1.0, 1.0, pre(CPU_SMALL), tiles=4)),
     ("b", "cpu"), True, "end to end <= 15 ms"),
    ("nothing meets the end-to-end target: the fastest, and it says so",
     [P("a", "m", 9, 1.0), P("b", "m", 7, 3.0)],
     Constraints(20, end_to_end_ms=5, frame=FrameCosts(0.0, 10.0, 1.0, 2.0)),
     ("b", ""), False, "no configuration meets p95 end to end <= 5 ms"),
    ("an end-to-end target before any frame: stages not measured, named",
     [P("a", "m", 4, 1.0), P("b", "m", 3, 2.0)],
     Constraints(20, end_to_end_ms=10),
     ("a", ""), True, "not measured yet: preprocess, other stages"),
    ("one that cannot keep up with the offered rate meets no target",
     [P("slow", "m", 30, 1.0), P("fast", "m", 10, 2.0)],  # p50 24 ms: 41 frames/s at most
     Constraints(100, end_to_end_ms=100, frame=FrameCosts(0.0, 50.0, 1.0, 1.0)),
     ("fast", ""), True, "lowest box energy of 1 configurations"),
    ("none keeps up: the fastest, and it says so",
     [P("slow", "m", 30, 1.0), P("fast", "m", 20, 2.0)],
     Constraints(100, end_to_end_ms=100, frame=FrameCosts(0.0, 100.0, 1.0, 1.0)),
     ("fast", ""), False, "none keeps up with 100 frames/s"),
    ("the accuracy floor still applies first",
     [P("fp32", "m", 8, 3.0, 0.97), P("int8", "m", 3, 1.0, 0.90)],
     Constraints(20, accuracy_floor=0.95, end_to_end_ms=30,
                 frame=FrameCosts(0.0, 10.0, 1.0, 1.0)),
     ("fp32", ""), True, "lowest box energy"),
    ("exactly at the inference target meets it",
     [P("slow", "m", 20, 1.0), P("fast", "m", 6, 2.0)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 3.0, 4.0, pre(CPU_SMALL))),
     ("slow", "cpu"), True, "inference <= 20 ms"),
]


@pytest.mark.parametrize("name,profiles,c,want,met,phrase", CASES, ids=[c[0] for c in CASES])
def test_box_choice(name, profiles, c, want, met, phrase):
    choice = select(profiles, c)
    assert choice.box is not None
    assert (choice.profile.variant_id, choice.box.pre_path) == want
    assert choice.met is met
    assert phrase in choice.reason


def test_the_model_alone_without_box_constraints():
    """No frame costs and no end-to-end target: the selector as it always was."""
    c = select([P("a", "m", 4, 1.0), P("b", "m", 3, 2.0)], Constraints(20))
    assert c.box is None and c.profile.variant_id == "a" and "mJ/inference" in c.reason


SIZES = {"fp32": (CPU_SMALL,), "int8s": (CPU_SMALL,), "int8b": (CPU_BIG,)}
BOTH = {v: (CPU_SMALL, OCL) for v in ("hi", "lo")}

LADDERS = [
    # (name, profiles, constraints, rungs cheapest first, their paths)
    ("by the model alone: every cheaper variant per inference is a rung",
     [P("fp32", "m", 5, 1.5), P("int8s", "m", 4, 1.2, 0.92), P("int8b", "m", 3, 1.0, 0.90)],
     Constraints(20),
     ["int8b", "int8s", "fp32"], {}),
    ("by the model alone: a cheaper variant that misses the latency target is no rung",
     [P("fp32", "m", 5, 1.5), P("int8s", "m", 25, 1.2, 0.92), P("int8b", "m", 3, 1.0, 0.90)],
     Constraints(20),
     ["int8b", "fp32"], {}),
    ("by the model alone: a more accurate variant dearer than the top is no rung",
     [P("lo", "m", 5, 1.5, 0.97), P("hi", "m", 5, 3.0, 0.99)], Constraints(20), ["lo"], {}),
    ("by the box: a more accurate variant dearer per frame than the top is no rung",
     [P("lo", "m", 5, 1.5, 0.97), P("hi", "m", 5, 3.0, 0.99)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, pre(CPU_SMALL))),
     ["lo"], {"lo": "cpu"}),
    ("by the box: as accurate as a cheaper rung is no rung",
     [P("hi", "m", 4, 2.0, 0.97), P("lo", "m", 4, 1.0, 0.90), P("b", "m", 4, 1.5, 0.90)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, pre(CPU_SMALL))),
     ["lo", "hi"], {"lo": "cpu", "hi": "cpu"}),
    ("by the box: cheaper per inference but dearer per frame is no rung",
     [P("fp32", "m", 5, 1.5), P("int8s", "m", 4, 1.2, 0.92), P("int8b", "m", 3, 1.0, 0.90)],
     Constraints(20, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, SIZES)),
     ["int8s", "fp32"], {"fp32": "cpu", "int8s": "cpu"}),
    ("by the box: a lower rung must meet the end-to-end target too",
     [P("hi", "m", 4, 2.0), P("lo", "m", 14, 1.0, 0.90)],
     Constraints(20, end_to_end_ms=15,
                 frame=FrameCosts(0.0, 10.0, 1.0, 2.0, pre(CPU_SMALL))),
     ["hi"], {"hi": "cpu"}),
    ("by the box: each rung on the path that meets the target, not the cheapest per tensor",
     [P("hi", "m", 4, 2.0), P("lo", "m", 8, 1.0, 0.90)],
     Constraints(20, end_to_end_ms=10, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, BOTH)),
     ["lo", "hi"], {"lo": "cpu", "hi": "opencl:0"}),
    ("by the box: a lower rung that cannot keep up with the offered rate is no rung",
     [P("hi", "m", 10, 2.0), P("lo", "m", 30, 1.0, 0.90)],  # lo: p50 24 ms, 41 frames/s
     Constraints(100, frame=FrameCosts(0.0, 50.0, 1.0, 1.0, pre(CPU_SMALL))),
     ["hi"], {"hi": "cpu"}),
    ("by the box: the frontier and its order are by energy per frame, not per inference",
     [P("fp32", "m", 5, 2.5), P("int8s", "m", 4, 1.2, 0.90), P("int8b", "m", 3, 0.8, 0.92),
      P("worse", "m", 3, 1.9, 0.89)],  # dearer per frame than int8s and less accurate
     Constraints(20, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, {**SIZES, "worse": (CPU_SMALL,)})),
     ["int8s", "int8b", "fp32"], {"fp32": "cpu", "int8s": "cpu", "int8b": "cpu"}),
    ("by the box, no variant reaches the floor: the most accurate on its cheapest path on top",
     [P("hi", "m", 4, 2.0, 0.9), P("lo", "m", 8, 1.0, 0.85)],
     Constraints(20, accuracy_floor=0.99, frame=FrameCosts(0.0, 10.0, 1.0, 1.0, BOTH)),
     ["lo", "hi"], {"lo": "opencl:0", "hi": "opencl:0"}),
    ("by the box, before any frame: no path measured, none pinned",
     [P("hi", "m", 4, 2.0), P("lo", "m", 8, 1.0, 0.90)],
     Constraints(20, end_to_end_ms=30),
     ["lo", "hi"], {}),
]


@pytest.mark.parametrize("name,profiles,c,want,paths", LADDERS, ids=[x[0] for x in LADDERS])
def test_ladder_below_the_top(name, profiles, c, want, paths):
    built = build_ladder(profiles, c)
    assert [r.variant_id for r in built.rungs] == want
    assert built.pre_paths == paths
    by_id = {p.variant_id: p for p in profiles}
    for r in built.rungs:  # the rungs' energy stays the dynamic energy per inference
        assert r.energy_j == pytest.approx(by_id[r.variant_id].energy_mj / 1e3)


FIGURES = [
    # (profile, costs, pre path, box mJ, idle mJ, e2e ms, rate Hz, unmeasured)
    (P("a", "m", 10, 1.0), FrameCosts(4.0, 10.0, 3.0, 2.0), CPU_SMALL,
     1.0 + 0.5 + 3.0 + 400.0, 400.0, 10 + 0.3 + 2.0, 10.0, ()),
    # a backlog: the rate is what the slowest thread sustains (inference p50 8 ms)
    (P("a", "m", 10, 1.0), FrameCosts(4.0, 0.0, 3.0, 2.0), CPU_SMALL,
     1.0 + 0.5 + 3.0 + 32.0, 32.0, 12.3, 125.0, ()),
    # tiles: 3 inferences and 3 tensors per frame; the offered rate is more than it sustains
    (P("a", "m", 10, 1.0), FrameCosts(4.0, 100.0, 3.0, 2.0, tiles=3), CPU_SMALL,
     3.0 + 1.5 + 3.0 + 96.0, 96.0, 30 + 0.9 + 2.0, 1000 / 24, ()),
    (P("a", "m", 10, 1.0), FrameCosts(4.0, 10.0), None, 1.0 + 400.0, 400.0, 10.0, 10.0,
     ("preprocess", "other stages")),
]


@pytest.mark.parametrize("p,costs,path,box,idle,e2e,rate,missing", FIGURES)
def test_figure_arithmetic(p, costs, path, box, idle, e2e, rate, missing):
    f = figure(p, costs, 95, path)
    assert f.box_mj == pytest.approx(box)
    assert f.idle_mj == pytest.approx(idle)
    assert f.e2e_ms == pytest.approx(e2e)
    assert f.rate_hz == pytest.approx(rate)
    assert f.unmeasured == missing
    assert (f.pre_mj is None) == (path is None) and (f.other_mj is None) == ("other stages"
                                                                              in missing)


RATES = [
    # (inference ms, preprocess ms, costs, frames/s)
    (5.0, 2.0, FrameCosts(0.0, 0.0, capture_ms=10.0), 100.0),  # capture is the slowest
    (5.0, 2.0, FrameCosts(0.0, 0.0, store_ms=3.0), 125.0),  # persist runs on the infer thread
    (5.0, None, FrameCosts(0.0, 0.0), 200.0),
    (0.0, None, FrameCosts(0.0, 0.0), math.inf),
    # one core for 5 + 2 + 3 ms of threads: 100 frames/s, not the slowest thread's 200
    (5.0, 2.0, FrameCosts(0.0, 0.0, capture_ms=3.0, cores=1.0), 100.0),
]


@pytest.mark.parametrize("infer,pre,costs,rate", RATES)
def test_sustained_rate_is_the_slowest_thread_within_the_cores(infer, pre, costs, rate):
    assert sustained_hz(infer, pre, costs) == pytest.approx(rate)


def test_an_old_config_keeps_latency_ms_as_inference():
    cfg = build(Constraints, {"latency_ms": 30.0}, "constraints")
    assert cfg.latency_ms == 30.0 and cfg.end_to_end_ms is None


@pytest.mark.parametrize("bad", [0.0, -5.0, math.inf])
def test_end_to_end_target_must_be_positive_and_finite(bad):
    with pytest.raises(ConfigError, match="end_to_end_ms"):
        build(Constraints, {"end_to_end_ms": bad}, "constraints")


REPORT = {"box_mj": 9.0, "source": "estimated", "stages_mj": {
    "capture": 0.1, "decode": None, "crop": 0.05, "preprocess": 0.5, "infer": 0.3,
    "postprocess": 0.2, "persist": 1.0, "publish": 0.4}}
PRE_REPORT = {"640x480->96x96": [{"path": "cpu", "ms": 0.4, "mj": 0.6, "chosen": True},
                                 {"path": "opencl:0", "ms": 0.9, "mj": 0.8, "chosen": False}],
              "640x480->64x64": [{"path": "cpu", "ms": 0.2, "mj": 0.3, "chosen": True}]}
SHAPES = {"fp32": (1, 3, 96, 96), "r64": (1, 3, 64, 64), "odd": (1, 3, 80, 80)}

LIVE = [
    # (report, e2e p95, inference p95, tiles, other mJ, other ms, variants with paths)
    (REPORT, 12.0, 3.0, 1, 1.75, 12.0 - 3.0 - 0.4, {"fp32", "r64"}),
    # tiles: the inference p95 is already per frame; preprocessing runs once per tile
    (REPORT, 12.0, 3.0, 2, 1.75, 12.0 - 3.0 - 0.8, {"fp32", "r64"}),
    # no box figure yet (no frames): the other stages unmeasured, never 0
    ({**REPORT, "box_mj": None}, None, None, 1, None, None, {"fp32", "r64"}),
    (None, 12.0, 3.0, 1, None, 8.6, {"fp32", "r64"}),
    # end to end under inference + preprocessing (a p95 of fewer frames): never negative
    (REPORT, 2.0, 3.0, 1, 1.75, 0.0, {"fp32", "r64"}),
]


@pytest.mark.parametrize("report,e2e,infer,tiles,other_mj,other_ms,with_paths", LIVE)
def test_live_costs_from_what_the_daemon_measured(report, e2e, infer, tiles, other_mj,
                                                  other_ms, with_paths):
    from runtime.choice.frame_cost import live_costs

    c = live_costs(report, PRE_REPORT, SHAPES, 8.0, 10.0, tiles, e2e, infer, running="fp32")
    assert (c.other_mj is None) == (other_mj is None)
    if other_mj is not None:  # the stages around inference; decode has no counter here
        assert c.other_mj == pytest.approx(other_mj)
    assert (c.other_ms is None) == (other_ms is None)
    if other_ms is not None:
        assert c.other_ms == pytest.approx(other_ms)
    assert set(c.pre) == with_paths  # 80x80 was never measured: its preprocessing unknown
    assert [q.name for q in c.pre["fp32"]] == ["cpu", "opencl:0"]
    assert c.tiles == tiles and c.idle_w == 8.0 and c.rate_hz == 10.0


def test_live_costs_take_the_path_the_chooser_runs_not_the_cheapest():
    """A rung pinned to the dearer path (the box choice's): its time is what end to end holds."""
    from runtime.choice.frame_cost import live_costs

    pinned = {**PRE_REPORT, "640x480->96x96": [
        {**PRE_REPORT["640x480->96x96"][0], "chosen": False},
        {**PRE_REPORT["640x480->96x96"][1], "chosen": True, "why": "selected by the box choice"}]}
    c = live_costs(REPORT, pinned, SHAPES, 8.0, 10.0, 1, 12.0, 3.0, running="fp32")
    assert c.other_ms == pytest.approx(12.0 - 3.0 - 0.9)
