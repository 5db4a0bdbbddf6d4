"""Re-ranking while serving (runtime/choice/rerank.py): is it drift, what replaces what, and
the choice made again on the replacement. Pure, on tables."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from runtime.choice import at_rate, rerank
from runtime.choice.frame_cost import FrameCosts
from runtime.choice.ladders import ladder_for
from runtime.choice.selector import Constraints, Profile, select

# a GPU variant whose gap power was measured as nothing (it raced to idle after the
# profiler's burst) and one whose gap power is unknown; the CPU beside them
GPU = Profile("m@gpu", "m", "fp32", "opencl", "GPU.0", 1, actual_device="GPU.0 (NVIDIA CUDA: L4)",
              p50_ms=4.0, p95_ms=4.0, p99_ms=4.0, energy_mj=370.0, energy_source="rapl+nvml",
              energy_ci=0.02, gap_w=0.0, gap_source="nvml: measured")
GPU_UNKNOWN = replace(GPU, gap_w=math.nan, gap_source="unknown: the meter did not move")
CPU = Profile("m@cpu", "m", "fp32", "onnxruntime", "CPU", 16, actual_device="CPU",
              p50_ms=5.0, p95_ms=5.0, p99_ms=5.0, energy_mj=410.0, energy_source="rapl",
              energy_ci=0.02)


@pytest.mark.parametrize("p, rate, live, error, drifts", [
    (GPU, 20.0, 370.0, 0.05, False),          # as profiled
    (GPU, 20.0, 388.0, 0.05, False),          # within the meter's 5 %
    (GPU, 20.0, 389.0, 0.05, True),           # beyond it
    (GPU, 20.0, 400.0, 0.10, False),          # a coarser meter: within its 10 %
    (GPU, 20.0, 400.0, math.nan, True),       # unknown error: the 5 % floor
    (GPU, 20.0, 2210.0, 0.05, True),          # the 40 W active-idle case
    (GPU, 20.0, 100.0, 0.05, False),          # cheaper than profiled is not re-ranked
    (GPU_UNKNOWN, 20.0, 2210.0, 0.05, True),  # back to back stood in for the at-rate figure
    (GPU, 0.0, 2210.0, 0.05, False),          # no rate: nothing to compare
    (GPU, 20.0, math.nan, 0.05, False),       # no live figure
    (GPU, 20.0, math.inf, 0.05, False),
    (replace(GPU, status="failed"), 20.0, 2210.0, 0.05, False),
    # an at-rate profile (as the selector saw it) compares at the rate served, not its own
    (at_rate.served([replace(GPU, gap_w=40.0)], 5.0)[0], 20.0, 2210.0, 0.05, False),
    (at_rate.served([replace(GPU, gap_w=40.0)], 5.0)[0], 20.0, 2400.0, 0.05, True),
])
def test_is_it_drift(p, rate, live, error, drifts):
    d = rerank.check(p, rate, live, error)
    assert (d is not None) == drifts
    if d is not None:
        assert d.live_mj == live and d.error is error and d.variant_id == p.variant_id
        assert "more than the meter's" in d.why


@pytest.mark.parametrize("p, rate, live, gap_w, b2b", [
    # the gap (50 - 4 ms) carries what serving measured above back to back
    (GPU, 20.0, 2210.0, 40.0, 370.0),
    (GPU_UNKNOWN, 20.0, 2210.0, 40.0, 370.0),
    (GPU, 5.0, 370.0 + 20.0 * 196.0, 20.0, 370.0),
    # no gap at this rate (a 4 ms variant at 500/s): the back-to-back figure is replaced
    (GPU, 500.0, 500.0, 0.0, 500.0),
])
def test_what_replaces_what(p, rate, live, gap_w, b2b):
    r = rerank.check(p, rate, live, 0.05).replacement
    assert r.at_rate_hz == 0.0 and r.energy_mj == pytest.approx(b2b)
    assert r.gap_w == pytest.approx(gap_w)
    # at the rate served the replacement says exactly what serving measured
    assert at_rate.per_inference_mj(r, rate) == pytest.approx(live)
    assert rerank.MEASURED in at_rate.label(at_rate.served([r], rate)[0]) \
        or rerank.MEASURED in r.energy_source
    assert r.variant_id == p.variant_id and r.p95_ms == p.p95_ms  # latency untouched


def test_an_at_rate_profile_is_replaced_from_its_back_to_back_figure():
    """The selector hands profiles at its rate (energy_mj at rate, back to back kept): the
    replacement starts from the back-to-back figure, never stacks a gap on a gap."""
    served = at_rate.served([replace(GPU, gap_w=10.0)], 20.0)[0]
    r = rerank.check(served, 20.0, 2210.0, 0.05).replacement
    assert r.energy_mj == 370.0 and r.gap_w == pytest.approx(40.0)


@pytest.mark.parametrize("gpu", [GPU, GPU_UNKNOWN])
@pytest.mark.parametrize("c", [
    Constraints(latency_ms=6.0, rate_hz=20.0),  # by the model's energy
    Constraints(latency_ms=6.0, frame=FrameCosts(idle_w=81.0, rate_hz=20.0)),  # by the box's
])
def test_the_choice_made_again_on_the_measured_figure(gpu, c):
    """At 20 Hz the GPU was chosen on a profile that says its gap costs nothing (or does not
    know); serving measures 40 W x 46 ms on top; the same selector, with the replacement,
    chooses the CPU (by the model's energy and by the box's), and the ladder's top follows."""
    assert select([gpu, CPU], c).profile.variant_id == "m@gpu"
    d = rerank.check(gpu, 20.0, 2210.0, 0.05)
    profiles = rerank.swap([gpu, CPU], d.replacement)
    again = select(profiles, c)
    assert again.profile.variant_id == "m@cpu"
    rungs, _ = ladder_for(profiles, c)
    assert rungs[-1].variant_id == "m@cpu"
    # back to back (a backlog) the GPU still wins: only its gap was wrong
    assert select(profiles, Constraints(latency_ms=6.0)).profile.variant_id == "m@gpu"


@pytest.mark.parametrize("last, now, every, ok", [
    ({}, 0.0, 600.0, True),
    ({"m@gpu": 100.0}, 699.0, 600.0, False),
    ({"m@gpu": 100.0}, 700.0, 600.0, True),
    ({"m@cpu": 100.0}, 101.0, 600.0, True),  # per variant
])
def test_at_most_one_re_rank_per_variant_per_period(last, now, every, ok):
    assert rerank.due(last, "m@gpu", now, every) == ok
