"""Table tests for the pure selector and frontier."""

from __future__ import annotations

import math

import pytest

from runtime.choice.frame_cost import FrameCosts
from runtime.choice.selector import (
    Constraints,
    NoVariantError,
    Profile,
    frontier,
    inference_rate,
    select,
)


def P(vid: str, p95: float, mj: float, precision: str = "fp32", acc: float | None = None,
      ok: bool = True) -> Profile:
    return Profile(vid, "m", precision, "e", "CPU", 1, status="ok" if ok else "failed",
                   p50_ms=p95 * 0.8, p95_ms=p95, p99_ms=p95 * 1.2, runs=100, energy_mj=mj,
                   energy_source="estimated", accuracy=acc)


CASES = [
    # (name, profiles, constraints, expected id, met, phrase in reason)
    ("cheapest meeting target wins",
     [P("a", 5, 10), P("b", 8, 6), P("c", 30, 2)], Constraints(20), "b", True, "lowest energy"),
    ("no variant meets the target: fastest, and says so",
     [P("a", 25, 10), P("b", 40, 6)], Constraints(20), "a", False, "no variant meets p95 <= 20"),
    ("accuracy floor excludes the cheapest",
     [P("fp32", 9, 10, acc=0.97), P("int8", 5, 4, "int8", acc=0.90)],
     Constraints(20, accuracy_floor=0.95), "fp32", True, "lowest energy"),
    ("exactly at the accuracy floor reaches it",
     [P("fp32", 9, 10, acc=0.97), P("int8", 5, 4, "int8", acc=0.95)],
     Constraints(20, accuracy_floor=0.95), "int8", True, "lowest energy"),
    ("accuracy floor admits the cheapest when it is good enough",
     [P("fp32", 9, 10, acc=0.97), P("int8", 5, 4, "int8", acc=0.96)],
     Constraints(20, accuracy_floor=0.95), "int8", True, "lowest energy"),
    ("tie on energy broken by latency",
     [P("slow", 9, 5.0), P("fast", 4, 5.0)], Constraints(20), "fast", True, "lowest energy"),
    ("sub-microjoule difference is a tie",
     [P("slow", 9, 5.00001), P("fast", 4, 5.00002)], Constraints(20), "fast", True, "lowest"),
    ("a microjoule is no tie: the cheaper wins",
     [P("slow", 9, 5.000), P("fast", 4, 5.001)], Constraints(20), "slow", True, "lowest"),
    ("exactly at the latency target meets it",
     [P("at", 20, 5), P("under", 10, 8)], Constraints(20), "at", True, "lowest energy"),
    ("without a manifest only fp32 is eligible",
     [P("fp32", 9, 10), P("int8", 5, 4, "int8")], Constraints(20), "fp32", True, "lowest"),
    ("lower precision is not assumed cheaper",
     [P("fp32", 4, 3, acc=0.97), P("int8", 8, 7, "int8", acc=0.96)], Constraints(20),
     "fp32", True, "lowest energy"),
    ("percentile is honoured (p99 misses, p95 meets)",
     [P("a", 18, 3), P("b", 10, 8)], Constraints(20, percentile=99), "b", True, "p99"),
    ("failed variants are never chosen",
     [P("broken", 1, 0.1, ok=False), P("a", 9, 10)], Constraints(20), "a", True, "lowest"),
    ("unset floor: within 0.02 of the best measured accuracy",
     [P("large", 9, 10, acc=0.994), P("base", 5, 4, acc=0.979), P("small", 3, 1, acc=0.80)],
     Constraints(20), "base", True, "lowest energy"),
    ("unset floor excludes a variant 0.021 below the best",
     [P("large", 9, 10, acc=0.994), P("base", 5, 4, acc=0.973)], Constraints(20), "large",
     True, "lowest energy"),
    ("nothing reaches the floor: the most accurate, and says so",
     [P("fp32", 9, 10, acc=0.80), P("int8", 5, 4, "int8", acc=0.70)],
     Constraints(20, accuracy_floor=0.95), "fp32", False, "accuracy floor"),
    ("nothing reaches the floor, two as accurate: the faster",
     [P("slow", 9, 10, acc=0.80), P("fast", 5, 12, acc=0.80)],
     Constraints(20, accuracy_floor=0.95), "fast", False, "accuracy floor"),
]


@pytest.mark.parametrize(("name", "profiles", "c", "want", "met", "phrase"), CASES,
                         ids=[c[0] for c in CASES])
def test_select(name, profiles, c, want, met, phrase):
    choice = select(profiles, c)
    assert choice.profile.variant_id == want
    assert choice.met is met
    assert phrase in choice.reason
    assert "\n" not in choice.reason


@pytest.mark.parametrize(("c", "want"), [
    (Constraints(20), 0.0),  # back to back
    (Constraints(20, rate_hz=5.0), 5.0),
    (Constraints(20, rate_hz=5.0, frame=FrameCosts(0.0, 20.0)), 20.0),  # the frames' rate
    (Constraints(20, rate_hz=5.0, frame=FrameCosts(0.0, 0.0)), 5.0),  # no frame rate yet
    (Constraints(20, frame=FrameCosts(0.0, 10.0, tiles=4)), 40.0),  # four inferences a frame
])
def test_inference_rate(c, want):
    assert inference_rate(c) == want


def test_select_nothing_runnable():
    with pytest.raises(NoVariantError, match="none of 2 variants"):
        select([P("a", 1, 1, ok=False), P("b", 1, 1, ok=False)], Constraints(20))


def test_select_no_known_accuracy():
    with pytest.raises(NoVariantError, match="known accuracy"):
        select([P("int8", 1, 1, "int8")], Constraints(20))


FRONTIER = [
    ("dominated variants drop out, ordered by energy",
     [P("fp32", 9, 10, acc=0.97), P("fp16", 7, 8, "fp16", acc=0.97),
      P("int8", 5, 4, "int8", acc=0.95), P("small", 3, 2, "small", acc=0.90),
      P("bad", 3, 6, "int8", acc=0.80)],
     ["small", "int8", "fp16"]),
    ("more energy for more accuracy stays",
     [P("a", 1, 1, acc=0.5), P("b", 1, 2, acc=0.6), P("c", 1, 3, acc=0.7)], ["a", "b", "c"]),
    ("failed and unknown-accuracy variants are excluded",
     [P("a", 1, 1, ok=False, acc=0.9), P("b", 1, 2, "int8"), P("c", 1, 3)], ["c"]),
    ("unmeasured energy is excluded", [P("a", 1, math.nan), P("b", 1, 3)], ["b"]),
    ("as dear and less accurate is dominated, in either order",
     [P("lo", 5, 3.0, acc=0.90), P("hi", 5, 3.0, acc=0.95)], ["hi"]),
]


@pytest.mark.parametrize(("name", "profiles", "want"), FRONTIER, ids=[f[0] for f in FRONTIER])
def test_frontier(name, profiles, want):
    assert [p.variant_id for p in frontier(profiles)] == want
