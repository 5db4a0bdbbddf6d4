"""Table tests for the fast schedule's pure decisions (runtime.choice.refine)."""

from __future__ import annotations

import itertools
import math

import pytest

from runtime.choice.frame_cost import FrameCosts, PrePath
from runtime.choice.refine import (
    combine,
    finalists,
    first_decision_ready,
    keep,
    mean_ci,
    percentile_ci,
    rounds,
)
from runtime.choice.selector import Constraints, Profile, select

# choosing by the box (runtime/choice/frame_cost.py): a backlog on a box idling at 2 W, where a
# frame costs its inference plus the idle floor for as long as it takes (p50 = 0.8 x p95 here)
BACKLOG = Constraints(20, frame=FrameCosts(idle_w=2.0, rate_hz=0.0))
# 10 frames/s, the stages around inference adding 10 ms to each frame; 14 ms end to end
E2E = Constraints(14, end_to_end_ms=14,
                  frame=FrameCosts(idle_w=1.0, rate_hz=10.0, other_mj=5.0, other_ms=10.0))
# a's OpenCL path is free per tensor but misses 14 ms end to end; its CPU path costs 3 mJ
PATHS = Constraints(14, end_to_end_ms=14, frame=FrameCosts(
    idle_w=1.0, rate_hz=10.0, other_mj=5.0, other_ms=2.0,
    pre={"a": (PrePath("cpu", 3.0, 0.1), PrePath("opencl:0", 0.0, 30.0)),
         "b": (PrePath("cpu", 1.5, 0.1),)}))


def P(vid: str, p95: float, mj: float, acc: float | None = 0.9, ci: float = 0.0,
      lat_ci: float = 0.0, ok: bool = True, model: str = "m", precision: str = "fp32",
      stage: str = "full", runs: int = 10) -> Profile:
    return Profile(vid, model, precision, "e", "CPU", 1, status="ok" if ok else "failed",
                   p50_ms=p95 * 0.8, p95_ms=p95, p99_ms=p95 * 1.2, runs=runs, energy_mj=mj,
                   energy_source="estimated", accuracy=acc, energy_ci=ci, latency_ci=lat_ci,
                   stage=stage)


KEEP = [
    # (name, profiles, constraints, floor, kept ids)
    ("clear winner: the dearer ones go",
     [P("a", 5, 1.0), P("b", 5, 2.0), P("c", 5, 3.0)], Constraints(20), 0.05, {"a"}),
    ("within the noise of the cheapest: both stay",
     [P("a", 5, 1.0), P("b", 5, 1.08), P("c", 5, 1.5)], Constraints(20), 0.05, {"a", "b"}),
    ("a wide interval from few samples keeps a dearer variant in the race",
     [P("a", 5, 1.0), P("b", 5, 1.5, ci=0.4)], Constraints(20), 0.05, {"a", "b"}),
    ("the cheapest's own wide interval keeps the others (it may be dearer than it looks)",
     [P("a", 5, 1.0, ci=0.6), P("b", 5, 1.5), P("c", 5, 2.0)], Constraints(20), 0.05,
     {"a", "b"}),
    ("a cheap variant that surely misses the target goes",
     [P("slow", 40, 0.5), P("a", 5, 1.0), P("b", 5, 2.0)], Constraints(20), 0.05, {"a"}),
    ("a cheap variant near the target stays (it could meet it)",
     [P("edge", 21, 0.5), P("a", 5, 1.0), P("b", 5, 2.0)], Constraints(20), 0.05,
     {"edge", "a"}),
    ("failed and unknown-accuracy variants are never kept",
     [P("x", 1, 0.1, ok=False), P("u", 1, 0.1, acc=None, precision="int8"), P("a", 5, 1.0)],
     Constraints(20),
     0.05, {"a"}),
    ("a cheaper, less accurate rung below the choice stays (the governor's ladder)",
     [P("big", 5, 2.0, acc=0.95), P("small", 3, 1.0, acc=0.80),
      P("small-dear", 3, 1.9, acc=0.80)], Constraints(20), 0.05, {"big", "small"}),
    ("a rung dearer than the choice goes",
     [P("big", 5, 2.0, acc=0.95), P("small", 3, 3.0, acc=0.80)], Constraints(20), 0.05,
     {"big"}),
    ("a lower rung dominated by a surely cheaper, as accurate one goes",
     [P("big", 5, 2.0, acc=0.95), P("mid", 4, 1.0, acc=0.90), P("low", 3, 1.5, acc=0.85)],
     Constraints(20), 0.05, {"big", "mid"}),
    ("nobody surely meets the target: every possible fastest stays",
     [P("a", 30, 1.0), P("b", 31, 2.0), P("c", 60, 0.5)], Constraints(20), 0.05, {"a", "b"}),
    ("nobody reaches the accuracy floor: the most accurate (exact) stay",
     [P("a", 5, 1.0, acc=0.7), P("b", 5, 2.0, acc=0.8), P("c", 5, 3.0, acc=0.8)],
     Constraints(20, accuracy_floor=0.95), 0.05, {"b", "c"}),
    ("no noise floor, exact numbers: only the cheapest",
     [P("a", 5, 1.0), P("b", 5, 1.01)], Constraints(20), 0.0, {"a"}),
    ("an unknown interval (an old profile) counts as wide open",
     [P("a", 5, 1.0), P("b", 5, 5.0, ci=math.nan)], Constraints(20), 0.05, {"a", "b"}),
    # by the box: pruned by what the selector ranks, the box's energy per frame
    ("by the box on a backlog: the faster one, dearer per inference, is the choice and stays",
     [P("a", 5, 1.0), P("b", 2, 1.5)], BACKLOG, 0.05, {"b"}),
    ("by the box, the same two measured per inference: the other way round",
     [P("a", 5, 1.0), P("b", 2, 1.5)], Constraints(20), 0.05, {"a"}),
    ("by the box end to end: a variant whose frame surely misses the target goes",
     [P("a", 5, 1.0), P("b", 3, 1.5)], E2E, 0.05, {"b"}),
    ("by the box end to end: one that could meet it stays",
     [P("a", 4.1, 1.0), P("b", 3, 1.5)], E2E, 0.05, {"a", "b"}),
    ("by the box: a cheaper path that misses the target is not the variant's figure",
     [P("a", 5, 1.0), P("b", 5, 1.0)], PATHS, 0.05, {"b"}),
]


@pytest.mark.parametrize(("name", "profiles", "c", "floor", "want"), KEEP,
                         ids=[k[0] for k in KEEP])
def test_keep(name, profiles, c, floor, want):
    assert keep(profiles, c, floor) == want


@pytest.mark.parametrize(("name", "profiles", "c", "floor", "want"), KEEP,
                         ids=[k[0] for k in KEEP])
def test_keep_always_holds_the_choice(name, profiles, c, floor, want):
    # Whatever else it prunes, the race never drops the selector's current choice.
    assert select(profiles, c).profile.variant_id in keep(profiles, c, floor)


def test_rounds_grow_to_the_full_length():
    r = rounds(5, 30, 2000, 2.0)
    assert [x.final for x in r] == [False, False, True]
    assert (r[-1].warmup_runs, r[-1].min_runs, r[-1].max_runs, r[-1].time_budget_s) == (
        5, 30, 2000, 2.0)  # the last round is exactly the exhaustive length
    assert r[0].time_budget_s == pytest.approx(2.0 / 16)
    assert r[1].time_budget_s == pytest.approx(2.0 / 4)
    assert r[0].max_runs == 125 and r[0].min_runs == 3 and r[0].warmup_runs == 1
    assert all(a.time_budget_s < b.time_budget_s for a, b in itertools.pairwise(r))


def test_rounds_never_below_three_runs_nor_above_the_configured_minimum():
    r = rounds(1, 2, 2, 0.01)
    assert r[0].min_runs == 2 and r[0].max_runs == 2  # never beyond the configured runs
    r = rounds(0, 100, 100, 1.0)
    assert r[0].min_runs == 7 and r[0].warmup_runs == 1 and r[-1].warmup_runs == 0


CI = [
    ("identical samples: exact", [1.0] * 50, 0.0, 0.0),
    ("one sample: unknown", [1.0], math.inf, math.inf),
]


@pytest.mark.parametrize(("name", "xs", "mean_want", "pct_want"), CI, ids=[c[0] for c in CI])
def test_ci_edges(name, xs, mean_want, pct_want):
    assert mean_ci(xs) == mean_want
    assert percentile_ci(xs) == pct_want


def test_ci_narrows_with_more_samples():
    import numpy as np

    rng = np.random.default_rng(1)
    few = (1 + 0.2 * rng.standard_normal(10)).tolist()
    many = (1 + 0.2 * rng.standard_normal(1000)).tolist()
    assert mean_ci(many) < mean_ci(few) / 5
    assert percentile_ci(many) < percentile_ci(few)
    assert 0.01 < mean_ci(many) < 0.03  # 1.96 * 0.2 / sqrt(1000) = 0.0124
    # too few samples to bound the p95 above: a standard deviation more
    assert percentile_ci([1.0, 1.1, 0.9]) > 0.1


READY = [
    ("too early", [P("a", 5, 1.0)], ["m"], 1.0, 4.0, False),
    ("in time, target met", [P("a", 5, 1.0)], ["m"], 4.5, 4.0, True),
    ("a form not seen yet", [P("a", 5, 1.0)], ["m", "big"], 9.0, 4.0, False),
    ("a form that only failed so far", [P("a", 5, 1.0), P("b", 5, 1.0, ok=False, model="big")],
     ["m", "big"], 9.0, 4.0, False),
    ("every form ran", [P("a", 5, 1.0), P("b", 5, 2.0, model="big")], ["m", "big"], 9.0, 4.0,
     True),
    ("the choice misses the target: keep measuring", [P("a", 50, 1.0)], ["m"], 9.0, 4.0,
     False),
    ("nothing ran", [P("a", 5, 1.0, ok=False)], ["m"], 9.0, 4.0, False),
]


@pytest.mark.parametrize(("name", "profiles", "forms", "elapsed", "wait", "want"), READY,
                         ids=[r[0] for r in READY])
def test_first_decision_ready(name, profiles, forms, elapsed, wait, want):
    assert first_decision_ready(profiles, forms, Constraints(20), elapsed, wait) is want


def _pair(old_mj: float, new_mj: float, old_ci: float = 0.0) -> tuple[Profile, Profile]:
    return P("a", 5, old_mj, ci=old_ci), P("a", 5, new_mj)


FLOOR = [
    ("a quiet machine: stays at the floor",
     [_pair(1.0, 1.01), _pair(2.0, 2.02), _pair(3.0, 2.97)], 0.05),
    ("too few pairs say nothing", [_pair(1.0, 2.0), _pair(1.0, 2.0)], 0.05),
    ("a busy machine: the 90th percentile of the excess",
     [_pair(1.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 1.0),
      _pair(1.0, 1.0), _pair(1.0, 1.0), _pair(1.0, 1.0), _pair(1.3, 1.0), _pair(1.2, 1.0)],
     0.2),
    ("what the earlier interval explains is not excess",
     [_pair(1.3, 1.0, old_ci=0.3), _pair(1.3, 1.0, old_ci=0.3), _pair(1.3, 1.0, old_ci=0.3)],
     0.05),
    ("capped", [_pair(5.0, 1.0), _pair(5.0, 1.0), _pair(5.0, 1.0)], 0.5),
]


@pytest.mark.parametrize(("name", "pairs", "want"), FLOOR, ids=[f[0] for f in FLOOR])
def test_observed_floor(name, pairs, want):
    from runtime.choice.refine import observed_floor

    assert observed_floor(pairs) == pytest.approx(want)


def test_a_wider_floor_keeps_what_a_noisy_round_would_have_pruned():
    profiles = [P("a", 5, 1.0), P("b", 5, 1.25)]
    assert keep(profiles, Constraints(20)) == {"a"}
    assert keep(profiles, Constraints(20), floor=0.2) == {"a", "b"}


FINAL = [
    # (name, profiles, constraints, floor, n, finalists in order)
    ("a clear winner: nothing to settle",
     [P("a", 5, 1.0), P("b", 5, 2.0)], Constraints(20), 0.05, 4, []),
    ("a near-tie: the choice and its rival",
     [P("a", 5, 1.0), P("b", 5, 1.06), P("c", 5, 2.0)], Constraints(20), 0.05, 4, ["a", "b"]),
    ("the widened (observed) noise floor brings more in, closest first, at most n",
     [P("a", 5, 1.0), P("d", 5, 1.5), P("b", 5, 1.1), P("c", 5, 1.3)], Constraints(20), 0.3,
     3, ["a", "b", "c"]),
    ("a rival measured only briefly is not a finalist (refine measured it at full length "
     "if it was still in the race)",
     [P("a", 5, 1.0), P("b", 5, 1.02, stage="refined")], Constraints(20), 0.05, 4, []),
    ("a choice not measured at full length: nothing to settle here",
     [P("a", 5, 1.0, stage="quick"), P("b", 5, 1.02)], Constraints(20), 0.05, 4, []),
    ("a cheaper rival below the accuracy floor is a rung, not a finalist",
     [P("a", 5, 1.0, acc=0.95), P("b", 5, 0.98, acc=0.80)], Constraints(20), 0.05, 4, []),
    ("a rival surely missing the target is not a finalist",
     [P("a", 5, 1.0), P("b", 40, 1.01)], Constraints(20), 0.05, 4, []),
    ("a rival that could meet the target is",
     [P("a", 5, 1.0), P("b", 20.5, 1.01)], Constraints(20), 0.05, 4, ["a", "b"]),
    ("no variant meets the target: the selector runs the fastest, nothing to settle",
     [P("a", 30, 1.0), P("b", 30.5, 1.01)], Constraints(20), 0.05, 4, []),
    ("no accuracy known (bare non-fp32 forms): nothing to settle",
     [P("a", 5, 1.0, acc=None, precision="fp16"), P("b", 5, 1.01, acc=None, precision="int8")],
     Constraints(20), 0.05, 4, []),
    ("a bare fp32 (accuracy taken as 1.0) and its thread variant tie",
     [P("a", 5, 1.0, acc=None), P("b", 5, 1.01, acc=None)], Constraints(20), 0.05, 4,
     ["a", "b"]),
    ("failed variants are not finalists",
     [P("a", 5, 1.0), P("b", 5, 1.01, ok=False)], Constraints(20), 0.05, 4, []),
    ("by the box: near-ties per frame, though 1.5x apart per inference",
     [P("a", 5, 1.0), P("b", 2, 1.5), P("c", 2.1, 1.45)], BACKLOG, 0.05, 4, ["b", "c"]),
]


@pytest.mark.parametrize(("name", "profiles", "c", "floor", "n", "want"), FINAL,
                         ids=[f[0] for f in FINAL])
def test_finalists(name, profiles, c, floor, n, want):
    assert finalists(profiles, c, floor, n) == want


@pytest.mark.parametrize(("name", "profiles", "c", "floor", "n", "want"), FINAL,
                         ids=[f[0] for f in FINAL])
def test_finalists_are_a_subset_of_what_the_race_keeps(name, profiles, c, floor, n, want):
    # A near-tie measured again is never one the race itself would have pruned.
    assert set(finalists(profiles, c, floor, n)) <= keep(profiles, c, floor)


def test_combine_weights_by_runs_and_widens_the_interval_to_the_gap():
    a = P("a", 10, 1.0, ci=0.01, lat_ci=0.02, runs=30)
    b = P("a", 14, 2.0, ci=0.01, lat_ci=0.02, runs=10)
    m = combine(a, b)
    assert m.runs == 40 and m.variant_id == "a" and m.stage == "full"
    assert m.energy_mj == pytest.approx(1.25) and m.p95_ms == pytest.approx(11.0)
    # the two disagree far beyond their own intervals: the gap is the honest interval
    assert m.energy_ci == pytest.approx(0.5 / 1.25)
    assert m.latency_ci == pytest.approx(2.0 / 11.0)
    # two agreeing measurements narrow it below either one's own
    same = combine(P("a", 10, 1.0, ci=0.1, runs=10), P("a", 10, 1.0, ci=0.1, runs=10))
    assert same.energy_ci == pytest.approx(0.1 / math.sqrt(2))


def test_combine_keeps_the_good_measurement_when_one_failed():
    a = P("a", 10, 1.0)
    assert combine(a, P("a", 1, 0.1, ok=False)) is a
    assert combine(P("a", 1, 0.1, ok=False), a) is a


def test_a_noisy_pair_is_settled_by_the_combined_numbers():
    # b looked cheaper on one measurement; measured again it is the dearer one. The selector
    # on the combined numbers picks a.
    c = Constraints(20)
    first = [P("a", 5, 1.05, ci=0.01), P("b", 5, 1.0, ci=0.01)]
    assert select(first, c).profile.variant_id == "b"
    assert finalists(first, c) == ["b", "a"]
    second = {"a": P("a", 5, 0.95, ci=0.01), "b": P("b", 5, 1.2, ci=0.01)}
    final = [combine(p, second[p.variant_id]) for p in first]
    assert select(final, c).profile.variant_id == "a"
